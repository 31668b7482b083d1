#!/usr/bin/env bash
# device call B (tree d68d43d): decode with peers, bf16 on both weight layouts, every MoE shape, T=1..256
export PYTHONPATH=.:third_party:third_party/vllm
echo d68d43d > $OUT/tree.txt
nvidia-smi --query-gpu=name,power.limit,driver_version --format=csv > $OUT/gpu.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/gpu.txt
SECONDS=0
timeout 540 python bench/bench_moe.py --out $OUT/decode --tokens 1 8 32 256 --formats bf16 bf16-kmajor --no-dense > $OUT/decode.log 2>&1
echo "rc $? after $SECONDS s" >> $OUT/decode.log
