#!/usr/bin/env bash
# device call Y (tree 02ec25d): the K-contiguous w paths on the GPU with the 256-byte L2 promotion (persistent kernel
# reading a K-major w, w K-contiguous with N*K >= 2**31, the major-order cases)
export PYTHONPATH=.
echo 02ec25d > $OUT/tree.txt
timeout 75 python -m pytest -q -rf tests/test_numerics.py tests/test_gpu.py -k "k_major or major_orders or offsets" > $OUT/tests.txt 2>&1
echo "rc $?" >> $OUT/tests.txt
