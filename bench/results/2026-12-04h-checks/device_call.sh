#!/usr/bin/env bash
# device call N: a row- and column-dependent custom epilogue on every kernel path at GPU sizes (beside), and the
# gradient fuzzer with SwiGLU before a scatter, seeds 721-728
export PYTHONPATH=.
(timeout 280 python .snap/epiprobe/probe.py > $OUT/epiprobe.txt 2>&1; echo "rc $?" >> $OUT/epiprobe.txt) &
FIRST=721 EXAMPLES=100 LIMIT=270 bash .snap/run_l.sh
wait
grep -v " ok$" $OUT/epiprobe.txt | grep -v Warn | tail -20; echo "ok lines: $(grep -c ' ok$' $OUT/epiprobe.txt)"
