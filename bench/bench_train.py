"""Benchmark a MoE expert layer's forward + backward (training) on ogsgen against torch._grouped_mm, in one run.

    PYTHONPATH=. python bench/bench_train.py --out bench/results/DATE-train [--tokens 2048 8192] \
        [--shapes gpt-oss-120b DeepSeek-V3]

The layer, bf16: w1 (tokens gathered, + bias, SwiGLU), w2 (+ bias, times the gates, scattered and summed over the
top-k), with gradients for x, w1, b1, w2 and b2: two ogsgen.matmul_ogs calls (backward on ogsgen's kernels), or
torch._grouped_mm and torch ops (K-contiguous weights, as it wants them). Times: do_bench medians of forward +
backward. TFLOP/s counts three products per weight (y, dX, dW) of 2 * rows * K * N: 9 * rows * K * N1 (rows = T *
top-k, K the width, N1 w1's N). The output, dx and two experts' gradients are compared with the other library's, and
each library's b2 gradient with its exact value, so that no time is quoted for a wrong result; a rate above the
ceilings measured in the same run (bench/ceilings.py) is an error in its row and the run exits 1. Writes results.csv,
table.md and env.json."""
from __future__ import annotations

import argparse
import gc
import os
import zlib
from pathlib import Path

# Each DeepSeek-V3 step takes most of the GPU: without expandable segments the caching allocator's leftover
# segments from earlier cases made a later step run out of memory (2026-12-03)
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

import torch  # noqa: E402
from triton.testing import do_bench

import ogsgen

from bench_moe import write_csv, write_env
from ceilings import Ceilings, exit_if_impossible, measure as measure_ceilings

SHAPES = {  # name: (experts, top-k, width, w1 N)
    "gpt-oss-120b": (128, 4, 2880, 5760),
    "DeepSeek-V3": (256, 8, 7168, 4096),
}
SWIGLU_ARGS = (1.702, 7.0)


def ogsgen_layer(x, w1, b1, w2, b2, rd, gi, si):
    swiglu = ogsgen.FusedActivation(ogsgen.swiglu, SWIGLU_ARGS)
    h = ogsgen.matmul_ogs(x, w1, b1, rd, gather_indx=gi, fused_activation=swiglu)
    return ogsgen.matmul_ogs(h, w2, b2, rd, scatter_indx=si, gammas=rd.gate_scal)


def grouped_mm_layer(x, w1, b1, w2, b2, rows):
    """The same layer on torch._grouped_mm; ``rows``: (token of each sorted row, expert of each, offsets, gates)."""
    token, expert, offs, gates = rows
    h = torch._grouped_mm(x[token], w1, offs=offs) + b1[expert].bfloat16()
    h = ogsgen.swiglu_torch(h.float(), *SWIGLU_ARGS).bfloat16()
    o = (torch._grouped_mm(h, w2, offs=offs).float() + b2[expert]) * gates[:, None]
    return torch.zeros(x.shape[0], o.shape[1], device=x.device).index_add_(0, token, o).bfloat16()


def steps(name, tokens):
    """(library, its parameters (leaves), its layer of them, the output's gradient, b2's exact gradient) for each
    library, on the case's inputs (drawn from a seed of the case's own)."""
    n_expts, k, width, n1 = SHAPES[name]
    torch.manual_seed(zlib.crc32(repr((name, tokens)).encode()))
    rd, gi, si = ogsgen.routing(torch.randn(tokens, n_expts, device="cuda"), k)
    x = torch.randn(tokens, width, device="cuda").bfloat16()
    w1 = (torch.randn(n_expts, width, n1, device="cuda") / width ** 0.5).bfloat16()
    w2 = (torch.randn(n_expts, n1 // 2, width, device="cuda") / (n1 // 2) ** 0.5).bfloat16()
    b1, b2 = torch.randn(n_expts, n1, device="cuda") / 10, torch.randn(n_expts, width, device="cuda") / 10
    grad_out = torch.randn(tokens, width, device="cuda").bfloat16()
    experts = torch.repeat_interleave(torch.arange(n_expts, device="cuda"), rd.expt_hist.long())
    rows = (gi.src_indx.long() // k, experts, torch.cumsum(rd.expt_hist, 0).to(torch.int32), rd.gate_scal)
    # _grouped_mm takes K-contiguous weights: the same values, laid out for it. Each library's tensors are made
    # when its turn comes and dropped by the caller after it (DeepSeek-V3's weights take 11 GB a copy).
    make = {"ogsgen": lambda t: t.clone(), "torch._grouped_mm": lambda t: t.mT.contiguous().mT if t.ndim == 3
            else t.clone()}
    layers = {"ogsgen": lambda p: ogsgen_layer(*p, rd, gi, si),
              "torch._grouped_mm": lambda p: grouped_mm_layer(*p, rows)}
    # b2's gradient in exact arithmetic of the bf16 inputs, a check that needs neither library: for each expert, the
    # sum over its rows of gate * the output gradient of the row's token
    db2_exact = torch.zeros(n_expts, width, device="cuda").index_add_(
        0, experts, rows[3][:, None] * grad_out.float()[rows[0]])
    for impl in make:
        yield impl, [make[impl](t).requires_grad_() for t in (x, w1, b1, w2, b2)], layers[impl], grad_out, db2_exact
        gc.collect()


def layer_flops(tokens, k, width, n1) -> int:
    """Forward and backward of the layer: per weight three products (y, dX, dW) of 2 * rows * K * N."""
    return 3 * 2 * tokens * k * width * (n1 + n1 // 2)


def case(name, tokens, ceilings: Ceilings):
    n_expts, k, width, n1 = SHAPES[name]
    flops = layer_flops(tokens, k, width, n1)
    results, grads = [], {}
    for impl, params, layer, grad_out, db2_exact in steps(name, tokens):
        def step():
            layer(params).backward(grad_out)
        row = dict(case=f"{name} T={tokens}", impl=impl, ms="", tflops="", error="", db2_vs_exact="")
        try:
            step()
            row["db2_vs_exact"] = f"{((params[4].grad - db2_exact).norm() / db2_exact.norm()).item():.1e}"
            # kept for the comparison: y, dx and two experts' gradients (all of them would not fit beside the run)
            grads[impl] = [layer(params).detach().float(), params[0].grad.float()] + \
                [p.grad[:2].float() for p in params[1:]]
            ms = do_bench(step, warmup=5, rep=200, grad_to_none=params, return_mode="median")
            ceilings.check(f"{name} T={tokens} {impl}", tflops=flops / ms / 1e9)
            row.update(ms=f"{ms:.3f}", tflops=f"{flops / ms / 1e9:.1f}")
        except Exception as exc:  # recorded as the library's error row
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        results.append(row)
        params.clear()  # the next library runs without these tensors
        gc.collect()  # (an out-of-memory exception's frames hold them too)
        torch.cuda.empty_cache()
    if len(grads) == 2:
        names = ("y", "dx", "dw1[:2]", "db1[:2]", "dw2[:2]", "db2[:2]")
        diffs = [((a - b).norm() / b.norm().clamp_min(1e-30)).item() for a, b in zip(*grads.values())]
        results[0]["rel_rms_vs_torch"] = " ".join(f"{n}={d:.1e}" for n, d in zip(names, diffs))
    for row in results:
        print(f"{row['case']:24s} {row['impl']:18s} {row['ms'] or row['error']} ms {row['tflops']} TF/s "
              f"db2 vs exact {row['db2_vs_exact']} {row.get('rel_rms_vs_torch', '')}", flush=True)
    return results


def table(rows) -> str:
    by_case = {}
    for row in rows:
        by_case.setdefault(row["case"], {})[row["impl"]] = row
    lines = ["| case | ogsgen fwd+bwd ms | TF/s | torch._grouped_mm ms | TF/s | torch / ogsgen "
             "| ogsgen vs torch (rel. rms) | db2 vs exact (ogsgen, torch) |", "|---|---|---|---|---|---|---|---|"]
    for name, impls in by_case.items():
        ours, theirs = impls.get("ogsgen", {}), impls.get("torch._grouped_mm", {})
        ratio = f"{float(theirs['ms']) / float(ours['ms']):.2f}" if ours.get("ms") and theirs.get("ms") else "n/a"
        lines.append(f"| {name} | {ours.get('ms') or ours.get('error')} | {ours.get('tflops', '')} | "
                     f"{theirs.get('ms') or theirs.get('error')} | {theirs.get('tflops', '')} | {ratio} | "
                     f"{ours.get('rel_rms_vs_torch', '')} | {ours.get('db2_vs_exact', '')}, "
                     f"{theirs.get('db2_vs_exact', '')} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokens", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    ceilings = measure_ceilings()
    write_env(args.out, ceilings=ceilings.as_dict())
    rows = []
    for name in args.shapes:
        for tokens in args.tokens:
            rows += case(name, tokens, ceilings)
            write_csv(rows, args.out / "results.csv")
            (args.out / "table.md").write_text(table(rows))  # what is measured survives a later failure
    print(table(rows))
    exit_if_impossible(rows)


if __name__ == "__main__":
    main()
