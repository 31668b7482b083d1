#!/usr/bin/env bash
# device call D (tree d68d43d): decode tiles of Mixtral-8x7B w1 (its T=1 got 4-5% slower than 2026-12-03d-full
# after the 128-deep decode rule of c253f7f, unmeasured on Mixtral then), both layouts, in turn
export PYTHONPATH=.:third_party:third_party/vllm
echo d68d43d > $OUT/tree.txt
TILES="16x128x64x8x4 16x128x128x4x4 16x128x128x8x3 16x64x128x4x4 16x64x64x4x4 16x256x64x8x4 16x128x128x4x4p"
CASES=("Mixtral-8x7B w1:1" "Mixtral-8x7B w1:2" "Mixtral-8x7B w1:4" "DeepSeek-V3 w1:1" "Qwen3-30B-A3B w1:32")
SECONDS=0
timeout 250 python bench/probes/tile_sweep.py --out $OUT/sweep --format bf16 --in-turn --cases "${CASES[@]}" --tiles $TILES > $OUT/tile_sweep_bf16.log 2>&1
echo "rc $? after $SECONDS s" >> $OUT/tile_sweep_bf16.log
timeout 250 python bench/probes/tile_sweep.py --out $OUT/sweep --format bf16-kmajor --in-turn --cases "${CASES[@]}" --tiles $TILES > $OUT/tile_sweep_bf16-kmajor.log 2>&1
echo "rc $? after $SECONDS s" >> $OUT/tile_sweep_bf16-kmajor.log
