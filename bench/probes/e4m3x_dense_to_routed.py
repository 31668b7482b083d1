"""Probe (CUDA GPU): where e4m3 x with mxfp4 w loses its speed against bf16 x, from dense to routed calls.

    PYTHONPATH=. python bench/probes/e4m3x_dense_to_routed.py [--out DIR] [--only LABEL ...] [--repeat COUNT]

On an H100 e4m3 x ran a dense 8192 x 5760 x 3072 at 1.19x bf16 x's speed (2026-12-08) but gpt-oss's MoE calls at
0.80x (2026-12-07), while offline sm_90 SASS shows the same fold loop in the dense and the routed binaries. This
probe times e4m3 x (x per row, w in the hopper_fp8 layout) and bf16 x (w in the hopper layout) on the same mxfp4
values, in four steps from dense to routed with the same M, N and K: dense; expert-sorted rows with every expert
given the same number (W streamed per expert); the same with the case's own routing (bench_moe's logits: uneven
rows, partial tiles); and gpt-oss's w1 (gathered rows) or w2 (rows scattered with gammas) as the bench calls them.
Each with w's scales N-contiguous (as prepare_expert_weights stores them) and, with ``--kscales``, K-contiguous too.
The step at which e4m3 x falls behind says where to look. ``--repeat COUNT`` only calls the chosen cases COUNT
times (for ncu: ``ncu -k regex:wmxfp4 -c 1 ... --only LABEL --repeat 2``).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_moe import MOE_SHAPES, case_logits, write_csv  # noqa: E402

import ogsgen  # noqa: E402
from ogsgen.numerics import quantize_fp8, quantize_mx  # noqa: E402

X_FORMATS = ("e4m3", "bf16")


def mx_weights(lead: tuple, k: int, n: int, x_format: str, k_contiguous_scales: bool, device: str):
    """(*lead, K, N) mxfp4 values in the layout x_format's kernels read, and their scales (*lead, K / 32, N)."""
    torch.manual_seed(0)
    values, scales = quantize_mx(torch.randn(*lead, n, k, device=device).bfloat16(), "e2m1", axis=-1)
    w = ogsgen.swizzle_mx_values(values.mT, "hopper_fp8" if x_format == "e4m3" else "hopper")
    return w, (scales.mT if k_contiguous_scales else scales.mT.contiguous())


def activations(rows: int, k: int, x_format: str, device: str):
    """x and its precision_config.act_scale: e4m3 with a scale per row, or bf16 and None."""
    torch.manual_seed(1)
    x = torch.randn(rows, k, device=device).bfloat16()
    return quantize_fp8(x, (1, 0)) if x_format == "e4m3" else (x, None)


def dense_call(m: int, n: int, k: int, x_format: str, kscales: bool, device: str = "cuda"):
    w, scales = mx_weights((), k, n, x_format, kscales, device)
    x, act_scale = activations(m, k, x_format, device)
    pc = ogsgen.PrecisionConfig(weight_scale=scales, act_scale=act_scale)
    return lambda: ogsgen.matmul_ogs(x, w, None, precision_config=pc)


def routed_call(name: str, tokens: int, x_format: str, kscales: bool, step: str, device: str = "cuda"):
    """bench_moe's MoE case ``name`` on these operands. step "uniform": expert-sorted rows, each expert the same
    number; "sorted": expert-sorted rows as the case's logits route them; "routed": as the bench calls it."""
    n_expts, top_k, k, n, mode = MOE_SHAPES[name]
    logits = case_logits(name, tokens).to(device)
    uniform = torch.arange(tokens * top_k, device=device).view(tokens, top_k) % n_expts  # distinct per token
    rd, gather_indx, scatter_indx = ogsgen.routing(logits, top_k, expt_indx=uniform if step == "uniform" else None)
    w, scales = mx_weights((n_expts,), k, n, x_format, kscales, device)
    x, act_scale = activations(tokens if step == "routed" and mode == "gather" else tokens * top_k, k, x_format,
                               device)
    pc = ogsgen.PrecisionConfig(weight_scale=scales, act_scale=act_scale)
    routed = {} if step != "routed" else dict(gather_indx=gather_indx) if mode == "gather" else dict(
        scatter_indx=scatter_indx, gammas=rd.gate_scal.float())
    return lambda: ogsgen.matmul_ogs(x, w, None, rd, precision_config=pc, **routed)


def cases(tokens: int, with_kscales: bool):
    """(label, flops, make()) from dense to routed, at gpt-oss w1's and w2's M, N and K."""
    steps = [("dense 8192x5760x3072", 2 * 8192 * 5760 * 3072, lambda f, s: dense_call(8192, 5760, 3072, f, s))]
    for name in ("gpt-oss w1", "gpt-oss w2"):
        _, top_k, k, n, _ = MOE_SHAPES[name]
        rows = tokens * top_k
        flops = 2 * rows * n * k
        steps.append((f"dense {rows}x{n}x{k}", flops, lambda f, s, r=rows, n=n, k=k: dense_call(r, n, k, f, s)))
        steps += [(f"{name} T={tokens} {step}", flops,
                   lambda f, s, name=name, step=step: routed_call(name, tokens, f, s, step))
                  for step in ("uniform", "sorted", "routed")]
    return [(f"{label}, {x_format} x, {'K' if kscales else 'N'}-contiguous scales", flops,
             lambda make=make, f=x_format, s=kscales: make(f, s))
            for label, flops, make in steps for kscales in ((False, True) if with_kscales else (False,))
            for x_format in X_FORMATS]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="writes DIR/e4m3x_dense_to_routed.csv")
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--kscales", action="store_true", help="also with w's scales K-contiguous")
    parser.add_argument("--only", nargs="+", help="the cases whose label contains one of these strings")
    parser.add_argument("--repeat", type=int, default=0, help="only call each chosen case this many times (ncu)")
    args = parser.parse_args()
    from triton.testing import do_bench_cudagraph
    rows = []
    for label, flops, make in cases(args.tokens, args.kscales):
        if args.only and not any(part in label for part in args.only):
            continue
        call = make()
        if args.repeat:
            for _ in range(args.repeat):
                call()
            torch.cuda.synchronize()
            continue
        call()
        us = statistics.median(do_bench_cudagraph(call) for _ in range(3)) * 1e3
        rows.append(dict(case=label, us=f"{us:.1f}", tflops=f"{flops / us / 1e6:.1f}"))
        print(f"{label:70s} {us:9.1f} us {flops / us / 1e6:7.1f} TF/s", flush=True)
        del call
        torch.cuda.empty_cache()
    if args.out and rows:
        args.out.mkdir(parents=True, exist_ok=True)
        write_csv(rows, args.out / "e4m3x_dense_to_routed.csv")


if __name__ == "__main__":
    main()
