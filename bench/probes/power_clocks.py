"""What limits a long-running bench case: the SM clock, the power draw and the clock-event reasons (power cap,
thermal), sampled by nvidia-smi while the case's call repeats for a few seconds (CUDA GPU).

    PYTHONPATH=.:third_party python bench/probes/power_clocks.py --out DIR "gpt-oss w2|bf16|8192|ogsgen" \
        "dense|bf16|8192|torch.matmul"

A case is "shape|format|tokens|implementation" ("dense": tokens = M = N = K). Per case: the call's median time,
TFLOP/s, the samples' median SM clock and power, and the share capped by power. Writes power_clocks.csv and
power_clocks_samples.csv under --out.
"""
from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench_moe  # noqa: E402  (the benchmark's case builders)

QUERY = "timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.sw_power_cap,clocks_event_reasons.active"


def case_call(spec: str):
    """(the call, its flops) of a case spec."""
    shape, weight_format, tokens, impl = spec.split("|")
    tk = bench_moe.triton_kernels_or_none() if impl == "triton_kernels" else None
    if impl == "triton_kernels" and tk is None:
        sys.exit("triton_kernels is not importable: put it on PYTHONPATH (../shared/tools/get_triton_kernels.sh)")
    cases = (bench_moe.dense_cases(int(tokens), int(tokens), int(tokens), tk) if shape == "dense"
             else bench_moe.moe_cases(shape, int(tokens), weight_format, tk))
    return next((fn, flops) for name, fn, flops, _ in cases if name == impl)


def sampled(fn, seconds: float, interval_ms: int):
    """(per-call times in ms, nvidia-smi samples) of ``fn`` repeated for ``seconds``."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
                            f"-lms={interval_ms}"], stdout=subprocess.PIPE, text=True)
    times, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end:
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / 10)
    smi.terminate()
    lines = smi.communicate()[0].strip().splitlines()
    return times, [[field.strip() for field in line.split(",")] for line in lines]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="+")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--interval-ms", type=int, default=100)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    summary, samples_out = [], []
    for spec in args.cases:
        fn, flops = case_call(spec)
        times, samples = sampled(fn, args.seconds, args.interval_ms)
        samples = samples[len(samples) // 5:]  # the first fifth: the clock still settling
        clocks = [float(s[1]) for s in samples]
        power = [float(s[2]) for s in samples]
        capped = sum(s[4] == "Active" for s in samples)
        ms = statistics.median(times)
        row = dict(case=spec, median_ms=round(ms, 4), tflops=round(flops / ms / 1e9, 1),
                   sm_clock_mhz=statistics.median(clocks), power_w=statistics.median(power),
                   power_cap_share=round(capped / max(1, len(samples)), 2), samples=len(samples))
        summary.append(row)
        samples_out += [[spec, *s] for s in samples]
        print(row, flush=True)
    bench_moe.write_csv(summary, args.out / "power_clocks.csv")
    with open(args.out / "power_clocks_samples.csv", "w", newline="") as f:
        csv.writer(f).writerows([["case", *QUERY.split(",")], *samples_out])


if __name__ == "__main__":
    main()
