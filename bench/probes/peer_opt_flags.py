"""Probe: the launch parameters triton_kernels and ogsgen choose for the same bench cases, side by side.

    PYTHONPATH=.:third_party python bench/probes/peer_opt_flags.py --out OUT \
        --cases "DeepSeek-V3 w1 bf16-kmajor:2048" "gpt-oss w1 bf16:8192" ...

Each case (bench_moe's shape, format, tokens) runs once in each library; the flags each launches with (wrapping
triton_kernels' make_opt_flags and ogsgen's launch) go to OUT/peer_opt_flags.txt, a line per library and case.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench_moe  # noqa: E402

from ogsgen.runtime import matmul as ogsgen_matmul  # noqa: E402
from ogsgen.spec.variant import canonical_name  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cases", nargs="+", required=True, metavar="SHAPE FORMAT:TOKENS")
    args = parser.parse_args()
    tk = bench_moe.triton_kernels_or_none()
    if tk is None:
        sys.exit("triton_kernels is needed (bench/fetch_peers.py third_party; PYTHONPATH=.:third_party)")
    seen = []
    tk_make = tk[0].make_opt_flags
    tk[0].make_opt_flags = lambda *a, **kw: seen.append(("triton_kernels", tk_make(*a, **kw))) or seen[-1][1]
    ours = ogsgen_matmul._launch_matmul

    def record(variant, call, flags, out, **operands):
        seen.append(("ogsgen", f"{canonical_name(variant)} {flags}"))
        return ours(variant, call, flags, out, **operands)
    ogsgen_matmul._launch_matmul = record
    lines = []
    for case in args.cases:
        label, tokens = case.rsplit(":", 1)
        shape, weight_format = label.rsplit(" ", 1)
        for impl, fn, _, _ in bench_moe.moe_cases(shape, int(tokens), weight_format, tk):
            if impl not in ("ogsgen", "triton_kernels"):
                continue
            seen.clear()
            fn()
            torch.cuda.synchronize()
            lines += [f"{case} | {who}: {flags}" for who, flags in seen]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "peer_opt_flags.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
