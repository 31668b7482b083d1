#!/usr/bin/env bash
# device call U (tree 21186fa): the L2-promotion probe with its patched encoder really loaded (call T's encodings all equal)
export PYTHONPATH=.:bench
echo 21186fa > $OUT/tree.txt
timeout 200 python bench/probes/l2_promotion.py --out $OUT/l2 --cases "gpt-oss w1:2048" "DeepSeek-V3 w1:2048" "gpt-oss w2:2048" "gpt-oss w2:8" > $OUT/l2.log 2>&1
echo "rc $?" >> $OUT/l2.log
