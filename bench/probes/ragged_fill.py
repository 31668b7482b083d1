"""How much of a large MoE call's time goes to the padding rows of its ragged tiles (CUDA GPU).

    PYTHONPATH=.:third_party python bench/probes/ragged_fill.py --out DIR [--tokens 8192] [--formats bf16 mxfp4]

Each expert's rows fill whole 128-row tiles but its last: with the bench's routing (about 256 rows per expert at
T=8192) a fifth of the computed rows are padding. Per shape and format, ogsgen's call is timed in turn with the
bench's routing and with a balanced one (every expert T * top_k / experts rows), same x and W. Writes
ragged_fill.csv: row tiles and fill of each routing, time, TFLOP/s of the real rows.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench_moe  # noqa: E402  (the benchmark's case builders and timing)

BLOCK_M = 128  # the heuristic's row tile at T=8192 (ogsgen/runtime/opt_flags.py)


def balanced_logits(tokens: int, n_expts: int, top_k: int) -> torch.Tensor:
    """Logits whose top-k sends token t to experts k*t .. k*t + k - 1 (mod n_expts): every expert gets
    tokens * top_k / n_expts rows when n_expts divides that."""
    logits = torch.zeros(tokens, n_expts, device="cuda")
    picks = (torch.arange(tokens, device="cuda")[:, None] * top_k + torch.arange(top_k, device="cuda")) % n_expts
    logits.scatter_(1, picks, 1.0 + torch.arange(top_k, device="cuda", dtype=torch.float32).expand(tokens, -1))
    return logits


def row_tiles(logits: torch.Tensor, top_k: int) -> int:
    rows = torch.bincount(logits.topk(top_k, dim=1).indices.flatten(), minlength=logits.shape[1])
    return int(((rows + BLOCK_M - 1) // BLOCK_M).sum())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--formats", nargs="+", default=["bf16", "mxfp4"])
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows_out = []
    for name, (n_expts, top_k, k, n, _) in bench_moe.MOE_SHAPES.items():
        routings = {"bench": bench_moe.case_logits(name, args.tokens),
                    "balanced": balanced_logits(args.tokens, n_expts, top_k)}
        for weight_format in args.formats:
            calls = {label: next(fn for impl, fn, _, _ in bench_moe.moe_cases(name, args.tokens, weight_format, None,
                                                                              logits=logits) if impl == "ogsgen")
                     for label, logits in routings.items()}
            times = bench_moe.graph_medians(list(calls.values()))
            rows = args.tokens * top_k
            for (label, logits), ms in zip(routings.items(), times):
                tiles = row_tiles(logits, top_k)
                row = dict(case=f"{name} {weight_format} T={args.tokens}", routing=label, row_tiles=tiles,
                           row_fill=round(rows / (tiles * BLOCK_M), 3), graph_us=round(ms * 1e3, 1),
                           tflops=round(2 * rows * k * n / (ms * 1e-3) / 1e12, 1))
                rows_out.append(row)
                print(row, flush=True)
    bench_moe.write_csv(rows_out, args.out / "ragged_fill.csv")


if __name__ == "__main__":
    main()
