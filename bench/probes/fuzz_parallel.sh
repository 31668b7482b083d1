#!/usr/bin/env bash
# The GPU long run of tests/test_fuzz.py in parallel processes on one GPU (Triton's compiles, not the GPU, bound
# one process): process i draws with seed FIRST_SEED + i, EXAMPLES examples for each of the three fuzz tests.
#   bench/probes/fuzz_parallel.sh OUT_DIR PROCESSES EXAMPLES [FIRST_SEED] [SECONDS]
# Each process's log (fuzz_seed<N>.txt) goes into OUT_DIR/fuzz_logs.tgz; a summary of passed/failed examples to
# OUT_DIR/fuzz_summary.txt.
# SECONDS (default 540) bounds each process (timeout); a process cut short reports what it ran.
set -uo pipefail
out=$1 processes=$2 examples=$3 first=${4:-1} seconds=${5:-540}
mkdir -p "$out"
for i in $(seq 0 $((processes - 1))); do
  seed=$((first + i))
  OGSGEN_FUZZ_PROFILE=gpu OGSGEN_FUZZ_EXAMPLES=$examples OGSGEN_FUZZ_SEED=$seed \
    timeout "$seconds" python -m pytest -q -p no:cacheprovider tests/test_fuzz.py -k "test_fuzz_" \
    --hypothesis-show-statistics > "$out/fuzz_seed$seed.txt" 2>&1 &
done
wait
{
  echo "seeds $first..$((first + processes - 1)), $examples examples per test and seed"
  for f in "$out"/fuzz_seed*.txt; do
    echo "$(basename "$f"): $(grep -E '^[0-9]+ (passed|failed)|(passed|failed).* in ' "$f" | tail -1)"
    # a process cut by the time limit prints no totals: its tests' progress marks (. passed, F failed) still say
    echo "    progress: $(grep -E '^[.FEsx]+( |$)' "$f" | tr -d ' \n')"
    grep -E "passing, .* failing" "$f" | sed 's/^/    /'
  done
} > "$out/fuzz_summary.txt"
# one archive for the logs: the device returns a limited number of files
tar czf "$out/fuzz_logs.tgz" -C "$out" $(cd "$out" && ls fuzz_seed*.txt) && rm "$out"/fuzz_seed*.txt
cat "$out/fuzz_summary.txt"
