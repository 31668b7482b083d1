"""Probe (GPU): how fast can the persistent path's gather copy be? The bf16 w1 calls at large batches copy x into
the sorted rows' order before the persistent TMA kernel (ogsgen.runtime.arguments.MatmulInputs._rows_in_sorted_order); this
times that copy as the runtime makes it (index math in torch, then ``index_select``) against Triton row-gather
kernels that take the gate indices as they are, per tile shape, and checks every candidate bit for bit.

    PYTHONPATH=.:bench python bench/probes/gather_copy.py --out DIR

Writes DIR/gather_copy.csv: case, candidate, µs (CUDA-graph median), effective TB/s (rows written + x read
once), and whether the copy matched index_select's.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.testing import do_bench_cudagraph

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench_moe  # noqa: E402

import ogsgen  # noqa: E402

CASES = [("gpt-oss w1", 2048), ("gpt-oss w1", 8192), ("DeepSeek-V3 w1", 2048), ("DeepSeek-V3 w1", 8192)]
TILES = [(1, 1024, 4), (2, 1024, 4), (4, 512, 4), (8, 512, 4), (8, 256, 4), (16, 256, 4), (4, 1024, 8),
         (8, 1024, 8), (1, 4096, 8), (2, 2048, 8)]  # rows, columns, warps


@triton.jit
def gather_rows(X, Y, SrcIndx, n_rows, K, stride_x, stride_y, n_expts_act,
                BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    gates = tl.load(SrcIndx + rows, mask=rows < n_rows, other=-1)
    live = gates >= 0  # a dropped gate's row is never read by a tile: not written
    tokens = (gates // n_expts_act).to(tl.int64)
    mask = live[:, None] & (cols < K)[None, :]
    x = tl.load(X + tokens[:, None] * stride_x + cols[None, :], mask=mask)
    tl.store(Y + rows.to(tl.int64)[:, None] * stride_y + cols[None, :], x, mask=mask)


def triton_copy(x, src, k_act, block_r, block_k, warps):
    n_rows, k = src.numel(), x.shape[1]
    y = torch.empty(n_rows, k, device=x.device, dtype=x.dtype)
    grid = (triton.cdiv(n_rows, block_r), triton.cdiv(k, block_k))

    def run():
        gather_rows[grid](x, y, src, n_rows, k, x.stride(0), y.stride(0), k_act,
                          BLOCK_R=block_r, BLOCK_K=block_k, num_warps=warps)
        return y
    return run


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, tokens in CASES:
        n_expts, top_k, k, _, _ = bench_moe.MOE_SHAPES[name]
        logits = torch.randn(tokens, n_expts, device="cuda")
        _, gi, _ = ogsgen.routing(logits, top_k)
        x = torch.randn(tokens, k, device="cuda").bfloat16()
        src = gi.src_indx

        def runtime_copy():
            return x.index_select(0, torch.div(src, top_k, rounding_mode="floor").clamp_(min=0))
        expected = runtime_copy()
        bytes_moved = (expected.numel() + x.numel()) * 2
        candidates = [("index_select (runtime)", runtime_copy)]
        candidates += [(f"triton {r}x{c}/{w}w", triton_copy(x, src, top_k, r, c, w)) for r, c, w in TILES]
        for label, run in candidates:
            same = torch.equal(run(), expected)
            us = do_bench_cudagraph(run, rep=100, return_mode="median") * 1e3
            row = dict(case=f"{name} T={tokens}", candidate=label, us=round(us, 1),
                       tbps=round(bytes_moved / us / 1e6, 2), same=same)
            rows.append(row)
            print(row, flush=True)
    bench_moe.write_csv(rows, args.out / "gather_copy.csv")


if __name__ == "__main__":
    main()
