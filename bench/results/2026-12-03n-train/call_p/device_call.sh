#!/usr/bin/env bash
# device call P (tree 6b20087): the GPU suite on the final tree, four processes
export PYTHONPATH=.
timeout 130 python -m pytest -q -rf -n 4 tests/test_gpu.py > $OUT/gpu_tests.txt 2>&1
echo "rc $?" >> $OUT/gpu_tests.txt
