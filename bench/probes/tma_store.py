"""Probe (GPU): what the persistent bf16 kernel's epilogue and x loads cost at large batches. Its tiles store Y
with pointer stores after a layout conversion through shared memory; triton_kernels' persistent kernel stores
them by TMA, in column slices of the tile, with 4 pipeline stages, and gathers x rows with pointer loads where
ogsgen first copies them into sorted order (bench/NOTES.md, sessions 14-15).

    PYTHONPATH=.:bench:third_party python bench/probes/tma_store.py --out DIR [--cases "gpt-oss w2:8192" ...]

One stand-alone kernel with the template's ragged tile walk and its 128x256x64 / 8 warps tile:
- x by TMA from the gathered rows (``tma``), the same clipped at the expert's last row so that the tile's
  rows past it are zeros (``ragged``, as triton_kernels loads them), or by pointer loads of the token rows (``ptr``: row offsets
  computed once per tile, K offsets added each step, unmasked; needs K % 64 == 0);
- Y by pointer stores (``ptr``) or by TMA stores clipped at the expert's last row (``tma/S``: S column slices);
- 3 or 4 stages (``--stages``).
Each is checked against ogsgen.matmul_ogs (its output rows are in the same order); the whole calls of ogsgen
and triton_kernels are timed in the same process, all candidates of a case in turn for ``--rounds`` rounds
(these cases run at the GPU's power limit, and its clocks drift with its temperature). CUDA-graph medians of
the rounds (and their range) to DIR/tma_store.csv.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.testing import do_bench_cudagraph
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_moe  # noqa: E402
from tma_persistent import ragged_tile  # noqa: E402  (the template's ragged tile walk)

import ogsgen  # noqa: E402
from ogsgen.runtime.opt_flags import row_tiles  # noqa: E402

BM, BN, BK = 128, 256, 64
ROWS_BOUND = 1 << 30  # the ragged descriptor's row bound: rows at or past it are clipped


def ragged_rows_descriptor(t: torch.Tensor, block_rows: int, block_cols: int) -> TensorDescriptor:
    """A TMA descriptor of a 2-D tensor's rows that clips each access at a row given per access: coordinates
    (ROWS_BOUND, first + size, ROWS_BOUND - size + r, c) address row first + r and clip it unless r < size.
    The first two dimensions' strides sum to zero modulo 2**64 (pointer arithmetic wraps)."""
    stride = t.stride(0)
    return TensorDescriptor(t, [0x7FFF0000, 0x7FFF0000, ROWS_BOUND, t.shape[1]],
                            [2**34 - stride, stride, stride, 1], [1, 1, block_rows, block_cols])


@triton.jit
def _store_rows(YDesc, first_row, size, row, col, tile):
    YDesc.store([0x40000000, first_row + size, 0x40000000 - size + row, col],
                tile.reshape(1, 1, tile.shape[0], tile.shape[1]))


@triton.jit
def persistent(Y, stride_y, YDesc, X, stride_x, XDesc, WDesc, GateIndx, n_expts_act, SliceSizes, SliceOffs,
               BlockOffs, BlockSchedule, n_expts_tot, N, K, n_programs,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
               X_BY: tl.constexpr, Y_BY: tl.constexpr, SLICES: tl.constexpr):
    grid_n = tl.cdiv(N, BLOCK_N)
    grid_m = tl.load(BlockOffs + n_expts_tot)
    k_steps = tl.cdiv(K, BLOCK_K)
    for t in tl.range(tl.program_id(0), grid_m * grid_n, n_programs, flatten=True):
        expert, start_m, offs_m, mask_m, pid_n = ragged_tile(t, grid_m, grid_n, BlockSchedule, SliceOffs,
                                                             SliceSizes, GROUP_M, BLOCK_M)
        if X_BY == "ptr":
            # rows past the expert's slice read token 0's row; no store keeps them
            gates = tl.load(GateIndx + offs_m, mask=mask_m, other=0)
            x_rows = (gates // n_expts_act).to(tl.int64)[:, None] * stride_x
            XBase = X
        if X_BY == "ragged":  # the ragged descriptor's row coordinates of this tile (see ragged_rows_descriptor)
            slice_end = tl.load(SliceOffs + expert) + tl.load(SliceSizes + expert)
            x_row = 0x40000000 - slice_end + start_m
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        for ki in range(k_steps):
            if X_BY == "tma":
                x = XDesc.load([start_m, ki * BLOCK_K])
            elif X_BY == "ragged":  # rows past the expert's slice zero-filled, not read
                x = XDesc.load([0x40000000, slice_end, x_row, ki * BLOCK_K]).reshape(BLOCK_M, BLOCK_K)
            else:
                x = tl.load(XBase + x_rows + tl.arange(0, BLOCK_K)[None, :])
                XBase += BLOCK_K
            w = WDesc.load([expert, ki * BLOCK_K, pid_n * BLOCK_N]).reshape(BLOCK_K, BLOCK_N)
            acc = tl.dot(x, w, acc)
        out = acc.to(tl.bfloat16)
        if Y_BY == "ptr":
            offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            tl.store(Y + offs_m.to(tl.int64)[:, None] * stride_y + offs_n[None, :], out,
                     mask=mask_m[:, None] & (offs_n[None, :] < N))
        else:
            first_row = tl.load(SliceOffs + expert)
            size = tl.load(SliceSizes + expert)
            row = start_m - first_row
            col = pid_n * BLOCK_N
            if SLICES == 1:
                _store_rows(YDesc, first_row, size, row, col, out)
            else:
                left, right = out.reshape(BLOCK_M, 2, BLOCK_N // 2).permute(0, 2, 1).split()
                if SLICES == 2:
                    _store_rows(YDesc, first_row, size, row, col, left)
                    _store_rows(YDesc, first_row, size, row, col + BLOCK_N // 2, right)
                else:
                    q0, q1 = left.reshape(BLOCK_M, 2, BLOCK_N // 4).permute(0, 2, 1).split()
                    q2, q3 = right.reshape(BLOCK_M, 2, BLOCK_N // 4).permute(0, 2, 1).split()
                    _store_rows(YDesc, first_row, size, row, col, q0)
                    _store_rows(YDesc, first_row, size, row, col + BLOCK_N // 4, q1)
                    _store_rows(YDesc, first_row, size, row, col + BLOCK_N // 2, q2)
                    _store_rows(YDesc, first_row, size, row, col + 3 * (BLOCK_N // 4), q3)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cases", nargs="+", default=["gpt-oss w2:8192", "gpt-oss w1:8192", "DeepSeek-V3 w1:8192"])
    parser.add_argument("--stages", nargs="+", type=int, default=[3, 4])
    parser.add_argument("--x-ptr", action="store_true", help="also x by pointer loads")
    parser.add_argument("--y", nargs="+", default=["ptr", "tma/1", "tma/2", "tma/4"],
                        type=lambda v: (v.split("/")[0], int(v.split("/")[1]) if "/" in v else 1),
                        help="Y stores: ptr, or tma/SLICES")
    parser.add_argument("--rounds", type=int, default=1, help="timing rounds, candidates in turn")
    parser.add_argument("--rep", type=int, default=100, help="ms of CUDA-graph replays per timing")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    tk = bench_moe.triton_kernels_or_none()
    n_sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for case in args.cases:
        name, tokens = case.rsplit(":", 1)[0], int(case.rsplit(":", 1)[1])
        n_expts, top_k, k, n, mode = bench_moe.MOE_SHAPES[name]
        # w2 (scatter) cases: the matmul alone, whose rows ogsgen writes in sorted order before the top-k reduce
        calls = {impl: fn for impl, fn, _, _ in bench_moe.moe_cases(name, tokens, "bf16", tk)}
        cells = dict(zip(calls["ogsgen"].__code__.co_freevars, (c.cell_contents for c in calls["ogsgen"].__closure__)))
        x, w, rd = cells["x"], cells["w"], cells["rd"]
        gather = mode == "gather"
        n_rows = x.shape[0] * top_k if gather else x.shape[0]
        if gather:
            gate_indx = cells["kwargs"]["gather_indx"].src_indx
            x_sorted = x.index_select(0, torch.div(gate_indx, top_k, rounding_mode="floor").clamp_(min=0))
            expected = calls["ogsgen"]().float()
        else:
            gate_indx = torch.arange(n_rows, device="cuda", dtype=torch.int32)  # rows already in sorted order
            x_sorted = x
            expected = ogsgen.matmul_ogs(x, w, None, rd).float()
        meta = rd.expt_data
        y = torch.empty(n_rows, n, device="cuda", dtype=torch.bfloat16)
        tiles = row_tiles(n_rows, BM, n_expts) * triton.cdiv(n, BN)
        grid = (min(n_sms, tiles),)
        x_descs = dict(tma=TensorDescriptor.from_tensor(x_sorted, [BM, BK]),
                       ragged=ragged_rows_descriptor(x_sorted, BM, BK))
        w_desc = TensorDescriptor.from_tensor(w, [1, BK, BN])

        def kernel(x_by, y_by, slices, stages):
            y_desc = ragged_rows_descriptor(y, BM, BN // slices)

            def run():
                persistent[grid](y, y.stride(0), y_desc, x if gather else x_sorted, x.stride(0), x_descs.get(x_by), w_desc,
                                 gate_indx, top_k if gather else 1, meta.slice_sizes, meta.slice_offs,
                                 meta.block_offs(BM), meta.block_schedule(BM), n_expts, n, k, grid[0],
                                 BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, GROUP_M=8, X_BY=x_by, Y_BY=y_by,
                                 SLICES=slices, num_warps=8, num_stages=stages)
                return y
            return run

        candidates = [("ogsgen call", calls["ogsgen"], False),
                      ("triton_kernels call", calls.get("triton_kernels"), False),
                      ("ogsgen matmul only", (lambda: ogsgen.matmul_ogs(x, w, None, rd)) if not gather else None,
                       False)]
        x_ways = ["tma", "ragged"] + (["ptr"] if args.x_ptr and (k % BK == 0 or not gather) else [])
        for x_by in x_ways:
            for y_by, slices in args.y:
                for stages in args.stages:
                    label = f"x {x_by}, y {y_by}" + (f"/{slices}" if y_by == "tma" else "") + f", {stages} stages"
                    candidates.append((label, kernel(x_by, y_by, slices, stages), True))
        timed, case_rows = [], []
        for label, run, check in candidates:
            if run is None:
                continue
            row = dict(case=f"{name} T={tokens}", candidate=label)
            try:
                y.fill_(float("nan"))
                out = run()
                if check:
                    row["max_rel_diff"] = f"{((out.float() - expected).abs().max() / expected.abs().max()).item():.1e}"
                timed.append((row, run))
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            case_rows.append(row)
        # Round-robin timing: the GPU runs these cases at its power limit, and its clocks drift with its
        # temperature, so each candidate is timed once per round and reported as the median of its rounds.
        times = {id(row): [] for row, _ in timed}
        for _ in range(args.rounds):
            for row, run in timed:
                times[id(row)].append(do_bench_cudagraph(run, rep=args.rep, return_mode="median") * 1e3)
        for row, _ in timed:
            us = sorted(times[id(row)])
            median = us[len(us) // 2]
            row.update(us=round(median, 1), us_min=round(us[0], 1), us_max=round(us[-1], 1),
                       tflops=round(2 * n_rows * k * n / median / 1e6, 1))
        rows += case_rows
        for row in case_rows:
            print(row, flush=True)
        bench_moe.write_csv(rows, args.out / "tma_store.csv")


if __name__ == "__main__":
    main()
