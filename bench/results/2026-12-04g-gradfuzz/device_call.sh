#!/usr/bin/env bash
# device call L: the gradient fuzzer's first GPU-profile run (sizes past the tiles, K-contiguous w, y_acc_in,
# the forward under autograd checked), 8 processes with seeds FIRST..FIRST+7 (701 unless set)
export PYTHONPATH=.
mkdir -p $OUT/gradfuzz
SECONDS=0
for i in 0 1 2 3 4 5 6 7; do
  seed=$((${FIRST:-701} + i))
  OGSGEN_FUZZ_PROFILE=gpu OGSGEN_FUZZ_EXAMPLES=${EXAMPLES:-120} OGSGEN_FUZZ_SEED=$seed \
    timeout ${LIMIT:-330} python -m pytest -q -p no:cacheprovider tests/test_fuzz_grad.py --hypothesis-show-statistics \
    > $OUT/gradfuzz/seed$seed.txt 2>&1 &
done
wait
for f in $OUT/gradfuzz/seed*.txt; do
  echo "$(basename $f): $(grep -E '(passed|failed).* in ' $f | tail -1)"
  grep -E "passing, .* failing" $f | sed 's/^/    /'
done > $OUT/gradfuzz_summary.txt
echo "after $SECONDS s" >> $OUT/gradfuzz_summary.txt
grep -l -E "failed|Error" $OUT/gradfuzz/seed*.txt | head -3 | xargs -r -I{} sh -c 'echo "== {}"; grep -E -B2 -A40 "Falsifying|AssertionError|Error" {} | head -120' > $OUT/gradfuzz_failures.txt
cat $OUT/gradfuzz_summary.txt
