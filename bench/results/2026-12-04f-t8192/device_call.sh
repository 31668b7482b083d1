#!/usr/bin/env bash
# device call K (tree HEAD): Qwen3 w1 / gpt-oss w2 T=8192 (0.98-0.99 of triton_kernels): peers' flags, tile sweep; GPU fuzz, new seeds
export PYTHONPATH=.:third_party:third_party/vllm
git rev-parse --short HEAD > $OUT/tree.txt 2>/dev/null || true
SECONDS=0
timeout 90 python bench/probes/peer_opt_flags.py --out $OUT/flags --cases "Qwen3-30B-A3B w1 bf16:8192" \
  "Qwen3-30B-A3B w1 bf16-kmajor:8192" "gpt-oss w2 bf16:8192" > $OUT/flags.log 2>&1
echo "rc $? after $SECONDS s" >> $OUT/flags.log
timeout 200 python bench/probes/tile_sweep.py --out $OUT/sweep --format bf16 --in-turn \
  --cases "Qwen3-30B-A3B w1:8192" "gpt-oss w2:8192" \
  --tiles 128x256x64x8x3p 128x256x64x8x4p 128x128x64x8x4p 128x128x64x8x3p 128x128x128x8x3p 256x128x64x8x3p \
  128x256x64x8x3 128x128x64x8x4 > $OUT/tile_sweep_bf16.log 2>&1
echo "rc $? after $SECONDS s" >> $OUT/tile_sweep_bf16.log
bash bench/probes/fuzz_parallel.sh $OUT/fuzz 8 150 601 200 > $OUT/fuzz.log 2>&1
echo "rc $? after $SECONDS s" >> $OUT/fuzz.log
