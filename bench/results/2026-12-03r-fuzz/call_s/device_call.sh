#!/usr/bin/env bash
# device call S (tree cf1066b): the TMA descriptors' L2 promotion (Triton 3.6 encodes 128 bytes; a K-contiguous w's
# tile rows are 128 bytes): 256-byte promotion against 128 (and an A/A control), both weight layouts; then the
# scaled-format fuzz test that call R's processes did not reach before their limit (12 seeds, 60 examples each)
export PYTHONPATH=.:bench
echo cf1066b > $OUT/tree.txt
timeout 290 python bench/probes/l2_promotion.py --out $OUT/l2 > $OUT/l2.log 2>&1
echo "rc $?" >> $OUT/l2.log
mkdir -p fz
for seed in $(seq 401 412); do
  OGSGEN_FUZZ_PROFILE=gpu OGSGEN_FUZZ_EXAMPLES=60 OGSGEN_FUZZ_SEED=$seed timeout 200 python -m pytest -q -p no:cacheprovider \
    tests/test_fuzz.py -k test_fuzz_scaled_formats --hypothesis-show-statistics > fz/fuzz_scaled_seed$seed.txt 2>&1 &
done
wait
tar czf $OUT/fuzz_scaled.tgz fz
for f in fz/*.txt; do echo "$f: $(grep -E '(passed|failed)' $f | tail -1)"; grep -E "passing, .* failing" $f; done > $OUT/fuzz_scaled_summary.txt
