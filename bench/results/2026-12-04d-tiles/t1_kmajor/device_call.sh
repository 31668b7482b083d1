#!/usr/bin/env bash
# device call I (tree 81aab03): K-contiguous decode at T=1 (1-11% behind N-contiguous W): deeper K steps
export PYTHONPATH=.:third_party:third_party/vllm
echo 81aab03 > $OUT/tree.txt
SECONDS=0
timeout 150 python bench/probes/tile_sweep.py --out $OUT/sweep --format bf16-kmajor --in-turn \
  --cases "Qwen3-30B-A3B w1:1" "gpt-oss w1:1" "gpt-oss w2:1" "DeepSeek-V3 w1:1" \
  --tiles 16x128x128x4x4 16x128x256x4x2 16x128x256x8x2 16x64x256x4x3 16x64x128x4x4 16x128x128x8x4 > $OUT/tile_sweep_bf16-kmajor.log 2>&1
echo "rc $? after $SECONDS s" >> $OUT/tile_sweep_bf16-kmajor.log
