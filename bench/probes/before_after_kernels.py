"""Probe (needs a CUDA GPU): why a before/after case (bench/probes/before_after.py) differs, kernel by kernel.

    PYTHONPATH=.:.base python bench/probes/before_after_kernels.py --out DIR \
        --cases "gpt-oss w1:bf16:2048" "DeepSeek-V3 w1:mxfp4:32" "dense:4096x5760x2880"

For each case and each library (this tree, and the earlier tree staged as ``ogsgen_base``): the kernels one call
launches (name, grid, constexpr arguments, launch options), each launched binary's registers, spills and shared
memory, the wgmma-hazard replacements in force, and each kernel's time per call (torch.profiler, after a second
of warm-up calls). Writes DIR/before_after_kernels.json.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_moe import dense_cases, moe_cases  # noqa: E402
from kernel_breakdown import kernel_times  # noqa: E402

import ogsgen  # noqa: E402


def make_call(case: str, lib):
    name, fmt, size = case.split(":")
    cases = dense_cases(*map(int, size.split("x")), None, lib=lib) if name == "dense" else \
        moe_cases(name, int(size), fmt, None, lib=lib)
    return next(fn for impl, fn, _, _ in cases if impl == "ogsgen")


def launches_of(lib, fn) -> list[dict]:
    """The kernels fn's checked path launches (plans cleared first, so that nothing replays), with each binary."""
    launcher = importlib.import_module(f"{lib.__name__}.runtime.launcher")
    plans = importlib.import_module(f"{lib.__name__}.runtime.plans")
    original, seen = launcher.launch, []

    def noting(kernel, grid, args, *rest, **options):
        result = original(kernel, grid, args, *rest, **options)
        constexprs = {k: v for k, v in args.items() if k.isupper() and isinstance(v, (int, bool, str))}
        seen.append(dict(kernel=getattr(kernel, "__name__", str(kernel)), grid=list(grid), constexprs=constexprs,
                         options={k: v for k, v in options.items() if isinstance(v, (int, bool, str, type(None)))},
                         binaries=binaries(kernel)))
        return result

    plans.clear()
    launcher.launch = noting
    try:
        fn()
        torch.cuda.synchronize()
    finally:
        launcher.launch = original
    return seen


def binaries(kernel) -> list[dict]:
    found = []
    for cache in getattr(kernel, "device_caches", {}).values():
        for compiled in cache[0].values():
            found.append(dict(n_regs=getattr(compiled, "n_regs", None), n_spills=getattr(compiled, "n_spills", None),
                              shared=compiled.metadata.shared, num_warps=compiled.metadata.num_warps,
                              num_stages=compiled.metadata.num_stages, hash=compiled.hash[:12]))
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--base-name", default="ogsgen_base")
    parser.add_argument("--cases", nargs="+", required=True, help='"shape:format:tokens" or "dense:bf16:MxNxK"')
    args = parser.parse_args()
    libraries = {"this tree": ogsgen, "base": importlib.import_module(args.base_name)}
    args.out.mkdir(parents=True, exist_ok=True)
    report = {}
    for case in args.cases:
        report[case] = {}
        for label, lib in libraries.items():
            fn = make_call(case, lib)
            launches = launches_of(lib, fn)
            times = kernel_times(fn)
            replaced = {str(k): str(v) for k, v in getattr(importlib.import_module(f"{lib.__name__}.runtime.matmul"), "_REPLACED", {}).items()}
            report[case][label] = dict(launches=launches, kernel_us=times, replaced=replaced)
            print(f"== {case} / {label}", flush=True)
            for launch in launches:
                print("  ", json.dumps(launch), flush=True)
            for kernel, us in times:
                print(f"   {us:9.2f} us  {kernel[:110]}", flush=True)
            print("   replaced:", replaced, flush=True)
            del fn
            torch.cuda.empty_cache()
        (args.out / "before_after_kernels.json").write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
