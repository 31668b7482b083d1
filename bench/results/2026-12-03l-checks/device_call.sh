#!/usr/bin/env bash
# device call J: the queued checks of 2026-12-03 (symmetric memory world 1, autograd/compile/gradient fuzzer on
# the GPU), the training step at T=2048 and 8192, DeepSeek-V3's backward breakdown
export PYTHONPATH=.:third_party:third_party/vllm
nvidia-smi --query-gpu=name,power.limit,driver_version --format=csv > $OUT/gpu.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/gpu.txt
timeout 100 python -m pytest -q -rfs tests/test_fused_comm.py -k symmetric_memory > $OUT/symm_tests.txt 2>&1
echo "rc $?" >> $OUT/symm_tests.txt
timeout 200 python -m pytest -q -rf -n 4 tests/test_autograd.py tests/test_compile.py tests/test_fuzz_grad.py > $OUT/grad_tests.txt 2>&1
echo "rc $?" >> $OUT/grad_tests.txt
timeout 200 python bench/bench_train.py --out $OUT/train --tokens 2048 8192 > $OUT/train.log 2>&1
echo "rc $?" >> $OUT/train.log
timeout 60 python bench/probes/train_breakdown.py --out $OUT/breakdown --case "DeepSeek-V3:2048" > $OUT/breakdown.log 2>&1
echo "rc $?" >> $OUT/breakdown.log
