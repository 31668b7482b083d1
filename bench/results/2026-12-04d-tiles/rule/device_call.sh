#!/usr/bin/env bash
# device call G (tree ab4e12b: 32-row tiles of K-contiguous MoE W step 128 deep, 3 stages): the rule against the old
# tile (32x128x64x4x4) and a 4-stage variant on every shape with 16-31 rows per expert, in turn; GPU tests of the
# K-contiguous and MoE paths
export PYTHONPATH=.:third_party:third_party/vllm
echo ab4e12b > $OUT/tree.txt
SECONDS=0
timeout 200 python bench/probes/tile_sweep.py --out $OUT/sweep --format bf16-kmajor --in-turn \
  --cases "Qwen3-30B-A3B w1:256" "gpt-oss w1:512" "gpt-oss w2:512" "DeepSeek-V3 w1:512" "Qwen3-30B-A3B w1:384" \
  --tiles 32x128x64x4x4 32x128x128x4x3 32x128x128x4x4 > $OUT/tile_sweep_bf16-kmajor.log 2>&1
echo "rc $? after $SECONDS s" >> $OUT/tile_sweep_bf16-kmajor.log
timeout 200 python -m pytest -q -rf -n 4 tests/test_gpu.py -k "k_major or major_orders or moe or decode" > $OUT/gpu_tests.txt 2>&1
echo "rc $? after $SECONDS s" >> $OUT/gpu_tests.txt
