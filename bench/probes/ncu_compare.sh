#!/usr/bin/env bash
# Profile ogsgen's and triton_kernels' matmul kernel for the same bench cases with Nsight Compute, one report
# per case and implementation, into DIR (the issue-5 misses by default), with the stall reasons per issued
# instruction and the sampled hot spots (SourceCounters). A case "shape|format|tokens|TILE" profiles ogsgen
# alone, under that tile (tile_sweep.py's syntax). The compiled kernels (cubin, PTX) of every run are packed
# into DIR/kernels.tgz, for nvdisasm. Run on the GPU machine from the repo root, triton_kernels importable:
#   PYTHONPATH=.:third_party bash bench/probes/ncu_compare.sh DIR ["shape|format|tokens[|TILE]" ...]
set -u
out=$1; shift
mkdir -p "$out"
cases=("$@")
if [ ${#cases[@]} -eq 0 ]; then
  cases=("gpt-oss w1|mxfp4|8" "gpt-oss w1|mxfp4|32" "gpt-oss w2|mxfp4|32" "gpt-oss w1|mxfp4|256"
         "gpt-oss w1|mxfp4|8192" "gpt-oss w1|bf16|8192")
fi
export TRITON_CACHE_DIR="$out/triton_cache"
for case in "${cases[@]}"; do
  IFS='|' read -r shape format tokens tile <<< "$case"
  impls=(ogsgen triton_kernels)
  [ -n "$tile" ] && impls=(ogsgen)
  for impl in "${impls[@]}"; do
    name="$(echo "$shape" | tr ' ' '_')_${format}_${tokens}_${impl}${tile:+_$tile}"
    # The third launch of the case's matmul kernel: the first ones compile. Clocks left alone (METHOD.md).
    ncu --clock-control none --kernel-name regex:matmul --launch-skip 2 --launch-count 1 \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats \
        --section WarpStateStats --section InstructionStats --section MemoryWorkloadAnalysis \
        --section SourceCounters \
        --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
        python3 bench/probes/ncu_cases.py "$shape" "$format" "$tokens" "$impl" $tile > "$out/$name.txt" 2>&1
    echo "$name: exit $?"
  done
done
(cd "$out" && find triton_cache \( -name '*.cubin' -o -name '*.ptx' \) -print0 | xargs -0 tar czf kernels.tgz \
  && rm -rf triton_cache)
