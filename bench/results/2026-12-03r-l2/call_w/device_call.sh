#!/usr/bin/env bash
# device call W (tree 812c527): the shipped 256-byte L2 promotion of K-contiguous w: its tests on the GPU, and the probe
# (K-contiguous cases, ogsgen's encoding timed last, against two instances with Triton's)
export PYTHONPATH=.:bench
echo 812c527 > $OUT/tree.txt
timeout 70 python -m pytest -q -rf tests/test_descriptors.py tests/test_gpu.py -k "descriptor or l2_promotion" > $OUT/tests.txt 2>&1
echo "rc $?" >> $OUT/tests.txt
timeout 150 python bench/probes/l2_promotion.py --out $OUT/l2 --formats bf16-kmajor --cases "gpt-oss w1:2048" "DeepSeek-V3 w1:2048" "Qwen3-30B-A3B w1:2048" "gpt-oss w2:2048" "gpt-oss w1:8192" "DeepSeek-V3 w1:8192" > $OUT/l2.log 2>&1
echo "rc $?" >> $OUT/l2.log
