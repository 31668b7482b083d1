#!/usr/bin/env bash
# device call X (tree 02ec25d): tests/test_descriptors.py on the GPU after its test's device fix
export PYTHONPATH=.
echo 02ec25d > $OUT/tree.txt
timeout 60 python -m pytest -q -rf tests/test_descriptors.py tests/test_gpu.py -k "descriptor or l2_promotion" > $OUT/tests.txt 2>&1
echo "rc $?" >> $OUT/tests.txt
