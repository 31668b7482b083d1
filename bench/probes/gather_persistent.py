"""Probe (GPU): can the persistent kernel gather x's rows itself instead of reading a gathered copy by TMA? The
copy costs 3.5-6% of the large-batch w1 calls (bench/results/2026-12-01n-probes/gather_copy.csv) and
triton_kernels' persistent kernel gathers rows with pointer loads (cp.async) at about our kernel's speed.

    PYTHONPATH=.:bench:third_party python bench/probes/gather_persistent.py --out DIR

One stand-alone kernel with the template's ragged tile walk and 128x256x64 / 8 warps tile, in several forms:
``tma``: x from the gathered copy by TMA (what ships; timed without and with the copy); ``masked``: x rows by
pointer loads, masked in K each step; ``even``: the same, unmasked where K is a multiple of BLOCK_K (rows past
an expert's slice read row 0's token, and no tile stores them); ``rowmask``: those rows masked, not read;
``wrap``: those rows read rows of the same expert's slice (triton_kernels' way); ``s4``: 4 stages. In ``masked``
and ``even`` every tile's padding rows read one x row, the same address on every SM at once (the hot spot
2026-12-03h-mask removed from the tiled kernel); ``rowmask`` and ``wrap`` do not. Each is checked
against ogsgen.matmul_ogs; triton_kernels' and ogsgen's whole calls are timed in the same process.
CUDA-graph medians to DIR/gather_persistent.csv.
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

CASES = [("Qwen3-30B-A3B w1", 8192), ("Qwen3-30B-A3B w1", 2048), ("gpt-oss w1", 8192), ("DeepSeek-V3 w1", 8192),
         ("gpt-oss w1", 2048)]
BM, BN, BK = 128, 256, 64


@triton.jit
def persistent_w1(Y, stride_y, X, stride_x, XDesc, WDesc, GateIndx, n_expts_act, SliceSizes, SliceOffs, BlockOffs,
                  BlockSchedule, n_expts_tot, N, K, n_programs,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                  X_BY: tl.constexpr):
    grid_n = tl.cdiv(N, BLOCK_N)
    grid_m = tl.load(BlockOffs + n_expts_tot)
    k_steps = tl.cdiv(K, BLOCK_K)
    for t in tl.range(tl.program_id(0), grid_m * grid_n, n_programs, flatten=True):
        expert, start_m, offs_m, mask_m, pid_n = ragged_tile(t, grid_m, grid_n, BlockSchedule, SliceOffs,
                                                             SliceSizes, GROUP_M, BLOCK_M)
        if X_BY == "wrap":  # a row past the expert's slice reads a row of the same slice (triton_kernels' way)
            slice_rows = tl.load(SliceSizes + expert)
            first = tl.load(SliceOffs + expert)
            gates = tl.load(GateIndx + first + (offs_m - first) % slice_rows)
            XPtrs = X + (gates // n_expts_act).to(tl.int64)[:, None] * stride_x + tl.arange(0, BLOCK_K)[None, :]
        elif X_BY != "tma":
            gates = tl.load(GateIndx + offs_m, mask=mask_m, other=0)
            XPtrs = X + (gates // n_expts_act).to(tl.int64)[:, None] * stride_x + tl.arange(0, BLOCK_K)[None, :]
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        for ki in range(k_steps):
            if X_BY == "tma":
                x = XDesc.load([start_m.to(tl.int32), ki * BLOCK_K])
            elif X_BY == "masked":
                x = tl.load(XPtrs, mask=tl.arange(0, BLOCK_K)[None, :] < K - ki * BLOCK_K, other=0.0)
                XPtrs += BLOCK_K
            elif X_BY == "rowmask":
                x = tl.load(XPtrs, mask=mask_m[:, None], other=0.0)
                XPtrs += BLOCK_K
            else:
                x = tl.load(XPtrs)
                XPtrs += BLOCK_K
            w = WDesc.load([expert.to(tl.int32), ki * BLOCK_K, pid_n * BLOCK_N]).reshape(BLOCK_K, BLOCK_N)
            acc = tl.dot(x, w, acc)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        tl.store(Y + offs_m.to(tl.int64)[:, None] * stride_y + offs_n[None, :], acc.to(tl.bfloat16),
                 mask=mask_m[:, None] & (offs_n[None, :] < N))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    tk = bench_moe.triton_kernels_or_none()
    n_sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for name, tokens in CASES:
        n_expts, top_k, k, n, _ = bench_moe.MOE_SHAPES[name]
        calls = {impl: fn for impl, fn, _, _ in bench_moe.moe_cases(name, tokens, "bf16", tk)}
        # moe_cases' tensors, reached through the ogsgen call's closure
        cells = dict(zip(calls["ogsgen"].__code__.co_freevars, (c.cell_contents for c in calls["ogsgen"].__closure__)))
        x, w, rd, gi = cells["x"], cells["w"], cells["rd"], cells["kwargs"]["gather_indx"]
        expected = calls["ogsgen"]().float()
        meta = rd.expt_data
        n_rows = gi.src_indx.numel()
        x_sorted = x.index_select(0, torch.div(gi.src_indx, top_k, rounding_mode="floor").clamp_(min=0))
        y = torch.empty(n_rows, n, device="cuda", dtype=torch.bfloat16)
        tiles = row_tiles(n_rows, BM, n_expts) * triton.cdiv(n, BN)
        grid = (min(n_sms, tiles),)
        x_desc = TensorDescriptor.from_tensor(x_sorted, [BM, BK])
        w_desc = TensorDescriptor.from_tensor(w, [1, BK, BN])

        def kernel(x_by, stages):
            def run():
                persistent_w1[grid](y, y.stride(0), x, x.stride(0), x_desc, w_desc, gi.src_indx, top_k,
                                    meta.slice_sizes, meta.slice_offs, meta.block_offs(BM), meta.block_schedule(BM),
                                    n_expts, n, k, grid[0], BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, GROUP_M=8,
                                    X_BY=x_by, num_warps=8, num_stages=stages)
                return y
            return run

        def with_copy():  # the runtime's copy when this ran (index_select; ogsgen.moe.gather_rows since)
            torch.index_select(x, 0, torch.div(gi.src_indx, top_k, rounding_mode="floor").clamp_(min=0),
                               out=x_sorted)
            return kernel("tma", 3)()
        candidates = [("ogsgen call", calls["ogsgen"], None),
                      ("triton_kernels call", calls.get("triton_kernels"), None),
                      ("tma (kernel only)", kernel("tma", 3), True), ("tma + copy", with_copy, True),
                      ("masked s3", kernel("masked", 3), True)]
        if k % BK == 0:
            candidates += [("even s3", kernel("even", 3), True), ("rowmask s3", kernel("rowmask", 3), True),
                           ("rowmask s4", kernel("rowmask", 4), True), ("wrap s3", kernel("wrap", 3), True),
                           ("wrap s4", kernel("wrap", 4), True)]
        for label, run, check in candidates:
            if run is None:
                continue
            row = dict(case=f"{name} T={tokens}", candidate=label)
            try:
                out = run()
                if check:
                    row["max_rel_diff"] = f"{((out.float() - expected).abs().max() / expected.abs().max()).item():.1e}"
                us = do_bench_cudagraph(run, rep=100, return_mode="median") * 1e3
                row.update(us=round(us, 1), tflops=round(2 * n_rows * k * n / us / 1e6, 1))
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            rows.append(row)
            print(row, flush=True)
    bench_moe.write_csv(rows, args.out / "gather_persistent.csv")


if __name__ == "__main__":
    main()
