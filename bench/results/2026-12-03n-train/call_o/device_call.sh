#!/usr/bin/env bash
# device call O (tree ade90d3): the training tests on the final tree (the example, autograd, compile, gradient fuzzer,
# ragged-K), four processes
export PYTHONPATH=.
echo ade90d3 > $OUT/tree.txt
timeout 200 python -m pytest -q -rf -n 4 tests/test_autograd.py tests/test_compile.py tests/test_fuzz_grad.py tests/test_inner.py tests/test_examples.py::test_train_moe_example > $OUT/tests.txt 2>&1
echo "rc $?" >> $OUT/tests.txt
