"""Run a few ogsgen bench cases a handful of times, for a profiler to catch their kernels.

    ncu --clock-control none --kernel-name regex:ogs_matmul --launch-skip 2 --launch-count 1 \\
        --section SpeedOfLight --section WarpStateStats --section SchedulerStats \\
        python bench/probes/ncu_cases.py "gpt-oss w1" mxfp4 256

Arguments: shape name (bench_moe.MOE_SHAPES), weight format, tokens. The first launches compile; the profiler
should skip them (--launch-skip).
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench_moe  # noqa: E402  (the benchmark's case builders)


def main():
    name, weight_format, tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
    impl, fn, _, _ = next(bench_moe.moe_cases(name, tokens, weight_format, None))
    assert impl == "ogsgen"
    for _ in range(4):
        fn()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
