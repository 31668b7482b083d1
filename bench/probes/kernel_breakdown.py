"""Probe (GPU): the CUDA kernels one bench call launches and each one's time, per implementation (torch.profiler,
averaged over several calls), for the bench's MoE cases.

    PYTHONPATH=.:bench:third_party python bench/probes/kernel_breakdown.py --out DIR --format mxfp4 \
        --cases "gpt-oss w2:8192" ...
"""
import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench_moe  # noqa: E402

CALLS = 10
WARM_SECONDS = 1.0


def kernel_times(fn):
    """[(kernel name, µs per call)] of fn's CUDA kernels, largest first. Profiled after a second of calls, so
    that the GPU runs at the clocks its power limit leaves, as in the bench's timings (after 3 calls, session
    14's gpt-oss w1 bf16 T=8192 kernels summed to 1948 us, against the bench's 2344 us per call)."""
    start = time.perf_counter()
    while time.perf_counter() - start < WARM_SECONDS:
        fn()
        torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            fn()
        torch.cuda.synchronize()
    totals = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name] = totals.get(event.name, 0.0) + event.device_time / CALLS
    return sorted(totals.items(), key=lambda item: -item[1])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--format", default="mxfp4")
    parser.add_argument("--cases", nargs="+", required=True, help='"shape:tokens" as in bench_moe')
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    tk = bench_moe.triton_kernels_or_none()
    rows = []
    for case in args.cases:
        name, tokens = case.rsplit(":", 1)
        for impl, fn, flops, _ in bench_moe.moe_cases(name, int(tokens), args.format, tk):
            if flops is None:
                continue  # the references
            for kernel, us in kernel_times(fn):
                rows.append(dict(case=case, format=args.format, impl=impl, kernel=kernel[:90], us=round(us, 1)))
                print(rows[-1], flush=True)
    bench_moe.write_csv(rows, args.out / f"kernel_breakdown_{args.format}.csv")


if __name__ == "__main__":
    main()
