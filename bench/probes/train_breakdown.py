"""Probe: where a training step's time goes, per GPU kernel, on ogsgen and on torch._grouped_mm.

    PYTHONPATH=. python bench/probes/train_breakdown.py --out OUT [--case "gpt-oss-120b:2048"]

Builds bench_train's case (the expert layer's forward + backward), runs each library's step a few times under
torch.profiler and writes OUT/train_breakdown.txt: per library, the kernels by total CUDA time per step.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench_train  # noqa: E402

STEPS = 3


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--case", default="gpt-oss-120b:2048")
    args = parser.parse_args()
    name, tokens = args.case.rsplit(":", 1)
    lines = []
    for impl, params, layer, grad_out, _ in bench_train.steps(name, int(tokens)):
        def step():
            for p in params:
                p.grad = None
            layer(params).backward(grad_out)
        step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(STEPS):
                step()
            torch.cuda.synchronize()
        events = [e for e in prof.key_averages() if e.device_type.name == "CUDA" and e.self_device_time_total > 0]
        total = sum(e.self_device_time_total for e in events) / STEPS
        lines.append(f"## {impl} {args.case}: {total / 1e3:.3f} ms of kernels per step")
        for e in sorted(events, key=lambda e: -e.self_device_time_total)[:30]:
            lines.append(f"{e.self_device_time_total / STEPS / 1e3:9.3f} ms {e.count // STEPS:4d}x  {e.key[:150]}")
        params.clear()
        torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "train_breakdown.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
