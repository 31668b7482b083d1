#!/usr/bin/env bash
# device call P (final tree): the GPU suite, and this session's new tests on the GPU
export PYTHONPATH=.
git rev-parse --short HEAD > $OUT/tree.txt 2>/dev/null || true
SECONDS=0
timeout 250 python -m pytest -q -rf -n 4 tests/test_gpu.py > $OUT/gpu_tests.txt 2>&1
echo "rc $? after $SECONDS s" >> $OUT/gpu_tests.txt
timeout 200 python -m pytest -q -rf tests/test_compile.py tests/test_fuzz_grad.py \
  "tests/test_numerics.py::test_epilogue_sees_y_rows_and_columns_on_every_kernel_path" > $OUT/new_tests.txt 2>&1
echo "rc $? after $SECONDS s" >> $OUT/new_tests.txt
tail -3 $OUT/gpu_tests.txt; tail -6 $OUT/new_tests.txt
