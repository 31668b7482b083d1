"""Does a persistent TMA kernel beat the one-program-per-tile template on large bf16 MoE shapes, and does
Triton's Hopper warp specialization help it? A stand-alone prototype (needs a GPU), checked against and timed
with ogsgen.matmul_ogs in the same process; CUDA-graph medians to tma_persistent.csv (tma_ws.csv with WS_ONLY=1).

    PYTHONPATH=.:third_party python bench/probes/tma_persistent.py --out DIR
    WS_ONLY=1 timeout 80 python bench/probes/tma_persistent.py --out DIR   # warp specialization, own process

What it decided (H200, Triton 3.6; bench/results/2026-11-30d-probes, bench/NOTES.md): 128x256x64, 8 warps,
3 stages, flattened loop pays when x is read by TMA (gpt-oss w2 T=8192 1322 -> 1158 us, dense 4096x5760x2880
227 -> 216 us) and loses 2-6% with gathered x rows (pointer loads); `warp_specialize=True` compiled (12 warps)
but never finished a launch. The template's persistent kernel follows this prototype.
"""
import argparse
import csv
import os
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.testing import do_bench_cudagraph
from triton.tools.tensor_descriptor import TensorDescriptor

import ogsgen


@triton.jit
def _swiglu(tile, alpha, limit):
    gate, linear = tl.split(tl.reshape(tile, (tile.shape[0], tile.shape[1] // 2, 2)))
    gate = tl.minimum(gate, limit)
    linear = tl.minimum(tl.maximum(linear, -limit), limit)
    return gate / (1.0 + tl.exp(-alpha * gate)) * (linear + 1.0)


@triton.jit
def ragged_tile(t, grid_m, grid_n, BlockSchedule, SliceOffs, SliceSizes, GROUP_M: tl.constexpr,
                BLOCK_M: tl.constexpr):
    """Tile t of the template's ragged tile walk (GROUP_M row tiles per group): its expert, first row, rows,
    row mask and column tile."""
    group_width = GROUP_M * grid_n
    first_m = (t // group_width) * GROUP_M
    group_m = tl.minimum(grid_m - first_m, GROUP_M)
    pid_m = first_m + (t % group_width) % group_m
    pid_n = (t % group_width) // group_m
    tile = tl.load(BlockSchedule + pid_m)
    expert = tile & 0xFFFF
    first_row = tl.load(SliceOffs + expert)
    row0 = first_row + (tile >> 16) * BLOCK_M
    offs_m = row0 + tl.arange(0, BLOCK_M)
    mask_m = offs_m < first_row + tl.load(SliceSizes + expert)
    return expert, row0, offs_m, mask_m, pid_n


@triton.jit
def ragged_persistent(Y, stride_y_m, XDesc, X, stride_x_m, WDesc, SliceSizes, SliceOffs, BlockOffs, BlockSchedule,
                      n_expts_tot, GatherIndx, n_expts_act, WriteBackIndx, N, K,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GATHER: tl.constexpr,
                      SCATTER: tl.constexpr, SWIGLU: tl.constexpr, NUM_SMS: tl.constexpr, WS: tl.constexpr,
                      GROUP_M: tl.constexpr, FLATTEN: tl.constexpr):
    grid_n = tl.cdiv(N, BLOCK_N)
    grid_m = tl.load(BlockOffs + n_expts_tot)  # the real row tiles: no idle schedule entries visited
    k_tiles = tl.cdiv(K, BLOCK_K)
    for t in tl.range(tl.program_id(0), grid_m * grid_n, NUM_SMS, warp_specialize=WS, flatten=FLATTEN):
        expert, row0, offs_m, mask_m, pid_n = ragged_tile(t, grid_m, grid_n, BlockSchedule, SliceOffs, SliceSizes,
                                                          GROUP_M, BLOCK_M)
        rows = tl.where(mask_m, offs_m, 0)
        if GATHER:
            x_rows = (tl.load(GatherIndx + rows) // n_expts_act).to(tl.int64)
            XPtrs = X + x_rows[:, None] * stride_x_m + tl.arange(0, BLOCK_K)[None, :]
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        for ki in range(k_tiles):
            if GATHER:
                x = tl.load(XPtrs, mask=tl.arange(0, BLOCK_K)[None, :] < K - ki * BLOCK_K, other=0.0)
                XPtrs += BLOCK_K
            else:
                x = XDesc.load([row0, ki * BLOCK_K])
            w = WDesc.load([expert, ki * BLOCK_K, pid_n * BLOCK_N]).reshape(BLOCK_K, BLOCK_N)
            acc = tl.dot(x, w, acc)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        if SWIGLU:
            acc = _swiglu(acc, 1.702, 7.0)
            offs_n = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
            n_out = N // 2
        else:
            n_out = N
        if SCATTER:
            y_rows = tl.load(WriteBackIndx + rows, mask=mask_m, other=0).to(tl.int64)
        else:
            y_rows = offs_m.to(tl.int64)
        tl.store(Y + y_rows[:, None] * stride_y_m + offs_n[None, :], acc.to(tl.bfloat16),
                 mask=mask_m[:, None] & (offs_n[None, :] < n_out))


def run_proto(x, w, rd, gi, si, n, k, mode, swiglu, cfg, x_sorted=None):
    bm, bn, bk, nw, ns, ws, group_m, flatten = cfg
    meta = rd.expt_data
    n_tiles = ogsgen.runtime.opt_flags.row_tiles(int(rd.expt_hist.sum()), bm, rd.n_expts_tot)
    rows = int(rd.expt_hist.sum())
    x_in = x_sorted if mode != "gather" else x
    y = torch.empty(rows, n // (2 if swiglu else 1), device="cuda", dtype=torch.bfloat16)
    x_desc = TensorDescriptor.from_tensor(x_in, [bm, bk])
    w_desc = TensorDescriptor.from_tensor(w, [1, bk, bn])
    sched = meta.block_schedule(bm)
    n_sms = torch.cuda.get_device_properties(0).multi_processor_count
    grid = (min(n_sms, n_tiles * triton.cdiv(n, bn)),)
    dst = si.dst_indx if mode == "scatter" else gi.src_indx

    def call():
        ragged_persistent[grid](y, y.stride(0), x_desc, x_in, x_in.stride(0), w_desc, meta.slice_sizes, meta.slice_offs,
                                meta.block_offs(bm), sched, rd.n_expts_tot, gi.src_indx, rd.n_expts_act, dst, n, k,
                                BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GATHER=mode == "gather", SCATTER=mode == "scatter",
                                SWIGLU=swiglu, NUM_SMS=grid[0], WS=ws, GROUP_M=group_m, FLATTEN=flatten,
                                num_warps=nw, num_stages=ns)
        return y
    return call


CONFIGS = [  # bm, bn, bk, warps, stages, warp-specialize, group_m, flatten
    (128, 256, 64, 8, 3, False, 8, True), (128, 256, 64, 8, 3, False, 8, False), (128, 256, 32, 8, 5, False, 8, True),
    (128, 256, 64, 8, 4, False, 8, True), (128, 128, 64, 8, 4, False, 8, True), (128, 256, 64, 8, 3, False, 1, True),
]
if os.environ.get("WS_ONLY"):  # Hopper warp specialization: its launches did not return, so its own process
    CONFIGS = [(128, 256, 64, 4, 3, True, 8, False)]
CASES = [  # name, E, top_k, K, N, tokens, mode, swiglu
    ("gpt-oss w2 T=8192", 128, 4, 2880, 2880, 8192, "scatter", False),
    ("gpt-oss w1 T=8192", 128, 4, 2880, 5760, 8192, "gather", True),
    ("DeepSeek w1 T=8192", 256, 8, 7168, 4096, 8192, "gather", False),
    ("gpt-oss w2 T=2048", 128, 4, 2880, 2880, 2048, "scatter", False),
    ("gpt-oss w1 T=2048", 128, 4, 2880, 5760, 2048, "gather", True),
    ("dense 4096x5760x2880", 1, 1, 2880, 5760, 4096, "plain", False),
]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    out = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for case in (CASES[:1] if os.environ.get("WS_ONLY") else CASES):
        try:
            run_case(case, results)
        except Exception as exc:
            results.append((case[0], "case", float("nan"), float("nan"), f"{type(exc).__name__}: {str(exc)[:300]}"))
            print(results[-1], flush=True)
    with open(out / ("tma_ws.csv" if os.environ.get("WS_ONLY") else "tma_persistent.csv"), "w", newline="") as f:
        csv.writer(f).writerows([("case", "impl", "us", "TFLOP/s", "max rel err")] + results)


def run_case(case, results):
    name, n_expts, top_k, k, n, tokens, mode, swiglu = case
    torch.manual_seed(0)
    logits = torch.randn(tokens, n_expts, device="cuda")
    rd, gi, si = ogsgen.routing(logits, top_k)
    rows = tokens * top_k
    x = torch.randn(tokens if mode == "gather" else rows, k, device="cuda").bfloat16()
    w = torch.randn(n_expts, k, n, device="cuda").bfloat16() / k ** 0.5
    x_sorted = x[gi.src_indx.long() // top_k].contiguous() if mode == "gather" else x
    act = ogsgen.FusedActivation(ogsgen.swiglu, (1.702, 7.0)) if swiglu else None
    kw = dict(gather_indx=gi) if mode == "gather" else {}
    reference = ogsgen.matmul_ogs(x, w, None, rd, fused_activation=act, **kw) if act else \
        ogsgen.matmul_ogs(x, w, None, rd, **kw)
    flops = 2 * rows * k * n
    t_ref = do_bench_cudagraph(lambda: ogsgen.matmul_ogs(x, w, None, rd, fused_activation=act, **kw)
                               if act else ogsgen.matmul_ogs(x, w, None, rd, **kw), rep=100, return_mode="median")
    if mode == "scatter":
        t_ref_sc = do_bench_cudagraph(lambda: ogsgen.matmul_ogs(x, w, None, rd, scatter_indx=si), rep=100,
                                      return_mode="median")
        results.append((name, "ogsgen (with scatter+reduce)", t_ref_sc * 1e3, flops / t_ref_sc / 1e9, ""))
    results.append((name, "ogsgen", t_ref * 1e3, flops / t_ref / 1e9, ""))
    print(results[-1], flush=True)
    for cfg in CONFIGS:
        try:
            call = run_proto(x, w, rd, gi, si, n, k, mode, swiglu, cfg, x_sorted)
            y = call()
            if mode == "scatter":  # the prototype writes sorted row p to gate row dst[p]
                y = y[si.dst_indx.long()]
            err = f"{((y.float() - reference.float()).abs().max() / reference.float().abs().max()).item():.2e}"
            t = do_bench_cudagraph(call, rep=100, return_mode="median")
            label = "x".join(map(str, cfg[:3])) + f" w{cfg[3]} s{cfg[4]} ws={cfg[5]} group={cfg[6]} flatten={cfg[7]}"
            results.append((name, "proto " + label,
                            t * 1e3, flops / t / 1e9, err))
        except Exception as exc:
            results.append((name, f"proto {cfg}", float("nan"), float("nan"),
                            f"{type(exc).__name__}: {str(exc)[:200]}"))
        print(results[-1], flush=True)


if __name__ == "__main__":
    main()
