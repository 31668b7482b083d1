#!/usr/bin/env bash
# device call R (tree 7aa1a36): GPU fuzzing of the forward op on the final kernels (first since the K-contiguous
# persistent kernel, the in-kernel gather, the row masks and the decode rules): 12 processes, seeds 301-312
export PYTHONPATH=.
echo 7aa1a36 > $OUT/tree.txt
bash bench/probes/fuzz_parallel.sh $OUT/fuzz 12 400 301 470 > $OUT/fuzz.log 2>&1
echo "rc $?" >> $OUT/fuzz.log
