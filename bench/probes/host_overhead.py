"""Where the host time of one eager ``matmul_ogs`` call goes (needs a CUDA GPU).

Case: gpt-oss w1, T=1, gather, bf16 (the bench's host-overhead case). Measured per call, with the GPU
queue kept short: the whole call; the same call with the kernel launch replaced by a no-op (ogsgen's
own Python); with the arguments of that call, Triton's ``kernel[grid](**args)`` alone and ogsgen's
cached launcher alone; and a cProfile of the whole call. Writes ``host_overhead.txt`` under --out.

    PYTHONPATH=.:third_party python bench/probes/host_overhead.py --out DIR
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_moe import host_overhead_us  # noqa: E402  (the benchmark's own host-time loop)

import ogsgen  # noqa: E402
from ogsgen.runtime import launcher  # noqa: E402


def per_call_us(fn):
    return host_overhead_us(fn, calls=2000)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    n_expts, top_k, k, n = 128, 4, 2880, 5760
    logits = torch.randn(1, n_expts, device="cuda")
    rd, gi, _ = ogsgen.routing(logits, top_k)
    x = torch.randn(1, k, device="cuda").bfloat16()
    w = torch.randn(n_expts, k, n, device="cuda").bfloat16()

    def call():
        return ogsgen.matmul_ogs(x, w, None, rd, gather_indx=gi)

    lines = [f"torch {torch.__version__}, triton {__import__('triton').__version__}, {torch.cuda.get_device_name()}"]
    lines.append(f"whole call: {per_call_us(call):.1f} us")

    real_launch, launches = launcher.launch, []
    launcher.launch = lambda *a, **options: launches.append((a, options))
    try:
        lines.append(f"launch stubbed (ogsgen's Python): {per_call_us(call):.1f} us")
    finally:
        launcher.launch = real_launch
    (kernel, grid, launch_args), options = launches[-1]
    lines.append(f"kernel[grid](**args) alone (Triton): "
                 f"{per_call_us(lambda: kernel[grid](**launch_args, **options)):.1f} us")
    lines.append(f"launcher.launch alone (ogsgen): "
                 f"{per_call_us(lambda: launcher.launch(kernel, grid, launch_args, **options)):.1f} us")

    profile = cProfile.Profile()
    profile.enable()
    for _ in range(500):
        call()
    profile.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(30)
    lines.append(text.getvalue())
    report = "\n".join(lines)
    print(report)
    (args.out / "host_overhead.txt").write_text(report + "\n")


if __name__ == "__main__":
    main()
