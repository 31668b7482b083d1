#!/usr/bin/env bash
# device call F (tree d68d43d): decode tiles of the T=256 cases where vLLM's fused_moe led by 1-3% in call B
export PYTHONPATH=.:third_party:third_party/vllm
echo d68d43d > $OUT/tree.txt
SECONDS=0
for fmt in bf16 bf16-kmajor; do
timeout 120 python bench/probes/tile_sweep.py --out $OUT/sweep --format $fmt --in-turn \
  --cases "DeepSeek-V3 w1:256" "gpt-oss w1:256" \
  --tiles 16x128x128x4x4 16x128x64x8x4 16x64x128x4x4 16x256x64x8x4 16x128x128x8x3 32x128x64x4x4 16x64x64x4x4 > $OUT/t16_$fmt.log 2>&1
echo "rc $? after $SECONDS s" >> $OUT/t16_$fmt.log
mv $OUT/sweep/tile_sweep_$fmt.csv $OUT/sweep/tile_sweep_16row_$fmt.csv
timeout 100 python bench/probes/tile_sweep.py --out $OUT/sweep --format $fmt --in-turn \
  --cases "Qwen3-30B-A3B w1:256" \
  --tiles 32x128x64x4x4 32x128x128x4x3 32x64x128x4x4 32x256x64x8x4 32x128x64x8x4 16x128x128x4x4 64x128x64x4x4 > $OUT/t32_$fmt.log 2>&1
echo "rc $? after $SECONDS s" >> $OUT/t32_$fmt.log
done
