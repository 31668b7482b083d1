#!/usr/bin/env bash
# device call N (tree 4baa8be): the training bench's whole sequence again (call L ran out of memory at DeepSeek-V3 and
# its bias gradients disagreed with torch's), with the plans' memory fix and the exact db2 check; then the decode
# bench of the DeepSeek-V3 shape (call L's ran out of time there); the plans tests on the GPU
export PYTHONPATH=.:third_party:third_party/vllm
echo 4baa8be > $OUT/tree.txt
timeout 60 python -m pytest -q -rf tests/test_plans.py > $OUT/plans_tests.txt 2>&1
echo "rc $?" >> $OUT/plans_tests.txt
timeout 260 python bench/bench_train.py --out $OUT/train --tokens 2048 8192 > $OUT/train.log 2>&1
echo "rc $?" >> $OUT/train.log
timeout 130 python bench/bench_moe.py --out $OUT/moe --shapes "DeepSeek-V3 w1" --tokens 1 8 32 256 --formats bf16 bf16-kmajor mxfp4 --no-dense > $OUT/moe.log 2>&1
echo "rc $?" >> $OUT/moe.log
