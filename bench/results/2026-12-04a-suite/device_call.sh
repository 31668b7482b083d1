#!/usr/bin/env bash
# device call A (tree d68d43d): the GPU suite on the final tree of the 28th session; prefill with peers,
# both layouts (K-contiguous after the 256-byte L2 promotion)
export PYTHONPATH=.:third_party:third_party/vllm
echo d68d43d > $OUT/tree.txt
nvidia-smi --query-gpu=name,power.limit,driver_version --format=csv > $OUT/gpu.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/gpu.txt
timeout 250 python -m pytest -q -rf -n 4 tests/test_gpu.py > $OUT/gpu_tests.txt 2>&1
echo "rc $?" >> $OUT/gpu_tests.txt
timeout 320 python bench/bench_moe.py --out $OUT/prefill --tokens 2048 8192 --formats bf16 bf16-kmajor --no-dense \
  --shapes "Qwen3-30B-A3B w1" "DeepSeek-V3 w1" "gpt-oss w1" "gpt-oss w2" "Mixtral-8x7B w1" > $OUT/prefill.log 2>&1
echo "rc $?" >> $OUT/prefill.log
