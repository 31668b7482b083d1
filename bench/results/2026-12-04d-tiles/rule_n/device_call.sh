#!/usr/bin/env bash
# device call H (tree ab4e12b): does N-contiguous W with 16-31 rows per expert want the 128-deep 32-row tile too?
export PYTHONPATH=.:third_party:third_party/vllm
echo ab4e12b > $OUT/tree.txt
SECONDS=0
timeout 200 python bench/probes/tile_sweep.py --out $OUT/sweep --format bf16 --in-turn \
  --cases "Qwen3-30B-A3B w1:256" "gpt-oss w1:512" "gpt-oss w2:512" "DeepSeek-V3 w1:512" "Qwen3-30B-A3B w1:384" \
  --tiles 32x128x64x4x4 32x128x128x4x3 > $OUT/tile_sweep_bf16.log 2>&1
echo "rc $? after $SECONDS s" >> $OUT/tile_sweep_bf16.log
