"""Probe: the two parts of a large-batch bf16 MoE call that trail triton_kernels (needs a GPU).

    PYTHONPATH=.:third_party python bench/probes/large_batch.py --out DIR

1. Gathered x (w1): the persistent TMA kernel on x gathered ahead into the sorted rows' order (what the heuristic
   now picks) against the one-program-per-tile kernel that gathers rows itself (``persistent=False``), and the
   gather copy alone; triton_kernels in the same run when importable.
2. The top-k combine after a scatter (w2): the whole call under each candidate reduce tile (the matmul part is
   the same in all), and torch's sum over the same scratch as a bandwidth anchor.

CUDA-graph medians to DIR/gather_ahead.csv and DIR/topk_reduce.csv, each row with its largest difference from
the heuristic's output relative to the output's largest magnitude (the candidates must compute the same thing).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from triton.testing import do_bench_cudagraph

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench_moe  # noqa: E402  (the benchmark's case builders)

import ogsgen  # noqa: E402
from ogsgen.runtime import matmul as matmul_module  # noqa: E402

GATHER_CASES = [("gpt-oss w1", 2048), ("gpt-oss w1", 8192), ("DeepSeek-V3 w1", 2048), ("DeepSeek-V3 w1", 8192)]
REDUCE_CASES = [("gpt-oss w2", 2048), ("gpt-oss w2", 8192)]
REDUCE_TILES = [(32, 128, 4), (64, 128, 4), (16, 256, 4), (32, 256, 4), (32, 256, 8), (64, 256, 8), (128, 128, 8),
                (16, 512, 4), (8, 1024, 4), (64, 64, 4), (128, 64, 4)]


def timed(run, reference, flops):
    out = run()
    diff = ((out.float() - reference).abs().max() / reference.abs().max()).item() if reference is not None else 0.0
    ms = do_bench_cudagraph(run, rep=100, return_mode="median")
    return dict(us=round(ms * 1e3, 1), tflops=round(flops / ms / 1e9, 1), diff=f"{diff:.1e}")


def measure(row: dict, run, reference, flops, rows: list):
    """Time ``run`` into ``row`` (or record its error), then keep and print the row."""
    try:
        row.update(timed(run, reference, flops))
    except Exception as exc:
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    rows.append(row)
    print(row, flush=True)



def gather_ahead(out: Path, tk):
    rows = []
    for name, tokens in GATHER_CASES:
        cases = {impl: (fn, flops) for impl, fn, flops, _ in bench_moe.moe_cases(name, tokens, "bf16", tk)}
        fn, flops = cases["ogsgen"]
        reference = fn().float()
        candidates = [("heuristic (persistent, x gathered ahead)", fn)]

        def tiled(fn=fn):
            with ogsgen.opt_flags_constraints(persistent=False):
                return fn()
        candidates.append(("tiled kernel, in-kernel gather", tiled))
        if "triton_kernels" in cases:
            candidates.append(("triton_kernels", cases["triton_kernels"][0]))
        for label, run in candidates:
            measure(dict(case=f"{name} bf16 T={tokens}", kernel=label), run, reference, flops, rows)
        # The gather copy alone, as the persistent path makes it.
        n_expts, top_k, k, _, _ = bench_moe.MOE_SHAPES[name]
        x = torch.randn(tokens, k, device="cuda").bfloat16()
        _, gi, _ = ogsgen.routing(torch.randn(tokens, n_expts, device="cuda"), top_k)
        copy = lambda: x.index_select(0, torch.div(gi.src_indx, top_k, rounding_mode="floor").clamp_(min=0))  # noqa
        ms = do_bench_cudagraph(copy, rep=100, return_mode="median")
        rows.append(dict(case=f"{name} bf16 T={tokens}", kernel="gather copy alone", us=round(ms * 1e3, 1),
                         gbps=round(tokens * top_k * k * 2 * 2 / ms / 1e6)))
        print(rows[-1], flush=True)
        bench_moe.write_csv(rows, out / "gather_ahead.csv")
        torch.cuda.empty_cache()


def topk_reduce(out: Path):
    rows = []
    original = matmul_module.reduce_tile
    try:
        for name, tokens in REDUCE_CASES:
            fn, flops = next((fn, flops) for impl, fn, flops, _ in bench_moe.moe_cases(name, tokens, "bf16", None))
            reference = fn().float()
            for tile in [None, *REDUCE_TILES]:
                matmul_module.reduce_tile = original if tile is None else (lambda n, r, tile=tile: tile)
                measure(dict(case=f"{name} bf16 T={tokens}",
                             reduce_tile="heuristic" if tile is None else "x".join(map(str, tile))),
                        fn, reference, flops, rows)
            n = bench_moe.MOE_SHAPES[name][3]
            top_k = bench_moe.MOE_SHAPES[name][1]
            scratch = torch.randn(tokens * top_k, n, device="cuda").bfloat16()
            ms = do_bench_cudagraph(lambda: scratch.view(tokens, top_k, n).sum(1), rep=100, return_mode="median")
            rows.append(dict(case=f"{name} bf16 T={tokens}", reduce_tile="torch sum alone", us=round(ms * 1e3, 1),
                             gbps=round(tokens * (top_k + 1) * n * 2 / ms / 1e6)))
            print(rows[-1], flush=True)
            bench_moe.write_csv(rows, out / "topk_reduce.csv")
            torch.cuda.empty_cache()
    finally:
        matmul_module.reduce_tile = original


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", choices=["gather", "reduce"])
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.only != "reduce":
        gather_ahead(args.out, bench_moe.triton_kernels_or_none())
    if args.only != "gather":
        topk_reduce(args.out)


if __name__ == "__main__":
    sys.exit(main())
