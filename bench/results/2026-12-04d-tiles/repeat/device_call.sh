#!/usr/bin/env bash
# device call E (tree d68d43d): Mixtral-8x7B w1 decode with peers, twice (run-to-run spread of the T=1 case that
# took 120.6 us in call B and 111.3 in call D's sweep)
export PYTHONPATH=.:third_party:third_party/vllm
echo d68d43d > $OUT/tree.txt
SECONDS=0
for i in 1 2; do
timeout 200 python bench/bench_moe.py --out $OUT/mixtral_$i --shapes "Mixtral-8x7B w1" --tokens 1 2 --formats bf16 bf16-kmajor --no-dense > $OUT/mixtral_$i.log 2>&1
echo "rc $? after $SECONDS s" >> $OUT/mixtral_$i.log
done
