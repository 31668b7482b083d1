#!/usr/bin/env bash
# device call J (tree 81aab03 + docs): the GPU suite on the session's final kernels
export PYTHONPATH=.
echo 81aab03 > $OUT/tree.txt
timeout 235 python -m pytest -q -rf -n 4 tests/test_gpu.py > $OUT/gpu_tests.txt 2>&1
echo "rc $?" >> $OUT/gpu_tests.txt
