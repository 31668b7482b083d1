"""Run one bench case a handful of times, for a profiler to catch its kernels.

    ncu --clock-control none --kernel-name regex:matmul --launch-skip 2 --launch-count 1 \\
        --section SpeedOfLight --section WarpStateStats --section SchedulerStats \\
        python bench/probes/ncu_cases.py "gpt-oss w1" mxfp4 256 [ogsgen|triton_kernels] [TILE]

Arguments: shape name (bench_moe.MOE_SHAPES), weight format, tokens, the implementation (ogsgen unless named;
triton_kernels must be importable, as for the bench) and for ogsgen a tile forced as in tile_sweep.py
(BMxBNxBKxWARPSxSTAGES[w][rMAXNREG]). The first launches compile; the profiler should skip them
(--launch-skip).
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_moe  # noqa: E402  (the benchmark's case builders)
from tile_sweep import parse_tile  # noqa: E402

import ogsgen  # noqa: E402


def main():
    name, weight_format, tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
    wanted = sys.argv[4] if len(sys.argv) > 4 else "ogsgen"
    tk = bench_moe.triton_kernels_or_none() if wanted == "triton_kernels" else None
    if wanted == "triton_kernels" and tk is None:
        sys.exit("triton_kernels is not importable: put it on PYTHONPATH (../shared/tools/get_triton_kernels.sh)")
    fn = next(fn for impl, fn, _, _ in bench_moe.moe_cases(name, tokens, weight_format, tk) if impl == wanted)
    constraints = parse_tile(sys.argv[5]) if len(sys.argv) > 5 else {}
    with ogsgen.opt_flags_constraints(**constraints):
        for _ in range(4):
            fn()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
