#!/usr/bin/env bash
# device call C (tree d68d43d): mxfp4 with peers, every MoE shape, T=1..8192 (dense cuBLAS from T=2048),
# and the dense shapes
export PYTHONPATH=.:third_party:third_party/vllm
echo d68d43d > $OUT/tree.txt
nvidia-smi --query-gpu=name,power.limit,driver_version --format=csv > $OUT/gpu.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/gpu.txt
SECONDS=0
timeout 540 python bench/bench_moe.py --out $OUT/mxfp4 --formats mxfp4 > $OUT/mxfp4.log 2>&1
echo "rc $? after $SECONDS s" >> $OUT/mxfp4.log
