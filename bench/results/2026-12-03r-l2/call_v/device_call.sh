#!/usr/bin/env bash
# device call V (tree 186bf6f): the L2-promotion probe in the other order (the 256-byte instance built and timed first)
export PYTHONPATH=.:bench
echo 186bf6f > $OUT/tree.txt
timeout 150 python bench/probes/l2_promotion.py --out $OUT/l2 --patched-first --formats bf16-kmajor bf16 --cases "gpt-oss w1:2048" "DeepSeek-V3 w1:2048" "gpt-oss w2:2048" > $OUT/l2.log 2>&1
echo "rc $?" >> $OUT/l2.log
