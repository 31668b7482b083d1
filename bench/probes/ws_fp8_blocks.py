"""Probe: a warp-specialized fp8e4m3_b128 grouped GEMM in Gluon (sm_90; Triton 3.6, 3.9) against ogsgen's tiled
kernel and DeepGEMM's contiguous GEMM, on the same e4m3 rows and per-(row, 128) scales: the GEMM alone on
expert-sorted rows, or gathered from token rows as w1 reads them (``:gather``).

    PYTHONPATH=.:third_party python bench/probes/ws_fp8_blocks.py \
        [--cases "Qwen3-30B-A3B w1:8192[:BLOCK_N:STAGES][:gather]" ...]

The kernel: a producer partition fills STAGES shared-memory slots (128 x rows, BLOCK_N w columns, 128 deep; w by
TMA, x by TMA or, gathered, by cp.async copies of 4 warps, since sm_90's TMA cannot gather rows); two consumer
warpgroups take 64 rows each, wait for their own wgmmas, free the slot and promote the partial product with the
step's scales (x's per row, w's per 128 x 128 block), so one promotes while the other's wgmmas run, which one
warpgroup cannot do on sm_90 (bench/NOTES.md 5.1). 256-column tiles are two 128-column wgmmas and promotions in
turn. Persistent: program p takes tiles p, p + grid, ... of (m-block, n-block), its m-blocks read from the routing's
RaggedTensorMetadata on the device (no host synchronization). Prints, per case, the output's difference from
ogsgen's and the CUDA-graph medians with L2 emptied before each call (bench_moe.graph_medians)."""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench_moe  # noqa: E402  (shapes, timing, DeepGEMM)
import deepgemm_peer  # noqa: E402

import ogsgen  # noqa: E402

# The copies into shared memory by their Triton 3.6 names, or by later releases' (async_load)
tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
cp_async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
partition_barrier = getattr(gl, "barrier", None) or gl.thread_barrier  # (a barrier of the partition's warps)
TILE = 128  # rows of an m-block and depth of a K step (the scales' 128), on the host
BLOCK_M, BLOCK_K, HALF = gl.constexpr(TILE), gl.constexpr(TILE), gl.constexpr(TILE // 2)  # (read in kernels)


@gluon.jit
def _tile(Schedule, SliceOffs, t, n_nb):
    """(expert, first sorted row, the expert's end row, n-block) of tile t: m-block t // n_nb of the schedule."""
    entry = gl.load(Schedule + t // n_nb)
    expert = (entry & 0xFFFF).to(gl.int32)
    return expert, gl.load(SliceOffs + expert) + (entry >> 16).to(gl.int32) * BLOCK_M, gl.load(
        SliceOffs + expert + 1), t % n_nb


@gluon.jit
def _token_rows(rows, in_rows, GatherSrc, top_k, GATHER: gl.constexpr):
    """The x row of each sorted row: its token's when gathered (sorted row p reads token src[p] // top_k)."""
    if GATHER:
        return gl.load(GatherSrc + rows, mask=in_rows, other=0) // top_k
    return rows


@gluon.jit
def _producer(x_desc, w_desc, X, stride_x, GatherSrc, top_k, x_bufs, w_bufs, ready, empty, Schedule, SliceOffs,
              BlockOffs, n_expts, n_nb, N, n_k, BN: gl.constexpr, STAGES: gl.constexpr, GATHER: gl.constexpr):
    n_tiles = gl.load(BlockOffs + n_expts) * n_nb
    ld: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0])  # (GATHER: 4 warps, 16 bytes a copy)
    i = 0
    for t in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        expert, row0, row_end, nb = _tile(Schedule, SliceOffs, t, n_nb)
        if GATHER:
            rows = row0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, ld))
            in_rows = rows < row_end
            x_ptrs = X + _token_rows(rows, in_rows, GatherSrc, top_k, GATHER).to(gl.int64)[:, None] * stride_x \
                + gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, ld))[None, :]
        for k in range(n_k):
            s = i % STAGES
            mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)  # (a new barrier's phase 1 counts as done)
            if GATHER:
                cp_async_load(x_bufs.index(s), x_ptrs + k * BLOCK_K, mask=in_rows[:, None])
                # Each thread's copies hold the slot's phase open until they land (the arrival adds to its count);
                # all of them before the arrival below that could otherwise close it.
                async_copy.mbarrier_arrive(ready.index(s))
                partition_barrier()
                mbarrier.expect(ready.index(s), BN * BLOCK_K)
            else:
                mbarrier.expect(ready.index(s), (BLOCK_M + BN) * BLOCK_K)
                tma_load(x_desc, [row0, k * BLOCK_K], ready.index(s), x_bufs.index(s))
            tma_load(w_desc, [expert * N + nb * BN, k * BLOCK_K], ready.index(s),
                                            w_bufs.index(s))
            i += 1


@gluon.jit
def _consumer(x_bufs, w_bufs, ready, empty, Schedule, SliceOffs, BlockOffs, n_expts, n_nb, GatherSrc, top_k, XS, WS,
              Y, N, n_k, ws_e, ws_n, ws_k, WG: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
              GATHER: gl.constexpr):
    # One wgmma and one promotion per 128 columns (w's scale block): a 64 x 256 tile is two of them in turn, so the
    # wgmma's partial product stays 64 registers next to the 128 of the two accumulators.
    SUB: gl.constexpr = 128
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, SUB, 32])
    zero = gl.zeros((HALF, SUB), dtype=gl.float32, layout=mma)
    n_tiles = gl.load(BlockOffs + n_expts) * n_nb
    i = 0
    for t in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        expert, row0, row_end, nb = _tile(Schedule, SliceOffs, t, n_nb)
        rows = row0 + WG * HALF + gl.arange(0, HALF, layout=gl.SliceLayout(1, mma))
        in_rows = rows < row_end
        xs_ptr = XS + _token_rows(rows, in_rows, GatherSrc, top_k, GATHER).to(gl.int64) * n_k
        ws_ptr = WS + expert * ws_e + nb * (BN // SUB) * ws_n
        x_scale = gl.load(xs_ptr, mask=in_rows, other=0.0)
        w_scale_lo = gl.load(ws_ptr)
        w_scale_hi = gl.load(ws_ptr + (BN // SUB - 1) * ws_n)
        acc_lo = gl.zeros((HALF, SUB), dtype=gl.float32, layout=mma)
        acc_hi = gl.zeros((HALF, SUB), dtype=gl.float32, layout=mma)  # (BN = 256 only)
        for k in range(n_k):
            s = i % STAGES
            k_next = gl.minimum(k + 1, n_k - 1)  # the next step's scales, loaded under this step's wgmmas
            x_scale_next = gl.load(xs_ptr + k_next, mask=in_rows, other=0.0)
            w_scale_lo_next = gl.load(ws_ptr + k_next * ws_k)
            w_scale_hi_next = gl.load(ws_ptr + (BN // SUB - 1) * ws_n + k_next * ws_k)
            mbarrier.wait(ready.index(s), (i // STAGES) & 1)
            if GATHER:
                fence_async_shared()  # x came by cp.async (the generic proxy); the wgmma reads it as the async proxy
            x_s = x_bufs.index(s).slice(WG * HALF, HALF)
            w_lo = w_bufs.index(s).slice(0, SUB).permute((1, 0))
            part = warpgroup_mma(x_s, w_lo, zero, use_acc=False, is_async=True)
            part, _, _ = warpgroup_mma_wait(num_outstanding=0, deps=(part, x_s, w_lo))
            if BN == 2 * SUB:
                acc_lo += part * (x_scale * w_scale_lo)[:, None]
                w_hi = w_bufs.index(s).slice(SUB, SUB).permute((1, 0))
                part = warpgroup_mma(x_s, w_hi, zero, use_acc=False, is_async=True)
                part, _, _ = warpgroup_mma_wait(num_outstanding=0, deps=(part, x_s, w_hi))
                mbarrier.arrive(empty.index(s), count=1)
                acc_hi += part * (x_scale * w_scale_hi)[:, None]
            else:
                mbarrier.arrive(empty.index(s), count=1)
                acc_lo += part * (x_scale * w_scale_lo)[:, None]
            x_scale, w_scale_lo, w_scale_hi = x_scale_next, w_scale_lo_next, w_scale_hi_next
            i += 1
        cols = nb * BN + gl.arange(0, SUB, layout=gl.SliceLayout(0, mma))
        y_ptrs = Y + rows.to(gl.int64)[:, None] * N + cols[None, :]
        gl.store(y_ptrs, acc_lo.to(gl.bfloat16), mask=in_rows[:, None])
        if BN == 2 * SUB:
            gl.store(y_ptrs + SUB, acc_hi.to(gl.bfloat16), mask=in_rows[:, None])


@gluon.jit
def ws_fp8_blocks_kernel(x_desc, w_desc, X, stride_x, GatherSrc, top_k, XS, WS, Y, Schedule, SliceOffs, BlockOffs,
                         n_expts, n_nb, N, n_k, ws_e, ws_n, ws_k, BN: gl.constexpr, STAGES: gl.constexpr,
                         GATHER: gl.constexpr):
    x_bufs = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BLOCK_M, BLOCK_K], x_desc.layout)
    w_bufs = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BN, BLOCK_K], w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)  # both consumers free a slot
    fence_async_shared()  # the barriers' initialization seen by the TMA unit
    gl.warp_specialize([
        (_consumer, (x_bufs, w_bufs, ready, empty, Schedule, SliceOffs, BlockOffs, n_expts, n_nb, GatherSrc, top_k,
                     XS, WS, Y, N, n_k, ws_e, ws_n, ws_k, 0, BN, STAGES, GATHER)),
        (_consumer, (x_bufs, w_bufs, ready, empty, Schedule, SliceOffs, BlockOffs, n_expts, n_nb, GatherSrc, top_k,
                     XS, WS, Y, N, n_k, ws_e, ws_n, ws_k, 1, BN, STAGES, GATHER)),
        (_producer, (x_desc, w_desc, X, stride_x, GatherSrc, top_k, x_bufs, w_bufs, ready, empty, Schedule,
                     SliceOffs, BlockOffs, n_expts, n_nb, N, n_k, BN, STAGES, GATHER)),
    ], [4, 4 if GATHER else 1], [232, 40])


def ws_fp8_blocks(x8, x_scale, w, w_scale, routing, gather_src=None, block_n=128, stages=4):
    """y (rows, N) bf16, rows in expert-sorted order: x8 e4m3 with x_scale (per row and 128 columns), sorted rows
    (rows, K), or token rows (T, K) that sorted row p reads as token gather_src[p] // top_k; times each row's
    expert's w (E, N, K) e4m3 K-contiguous with w_scale (E, N / 128, K / 128). ``routing``: ogsgen's RoutingData."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    (k, (e, n, _)), meta = (x8.shape[1], w.shape), routing.expt_data
    rows = x8.shape[0] if gather_src is None else gather_src.shape[0]
    n_nb = n // block_n
    y = torch.empty(rows, n, device=x8.device, dtype=torch.bfloat16)
    x_desc = TensorDescriptor.from_tensor(x8, [TILE, TILE],
                                          gl.NVMMASharedLayout.get_default_for([TILE, TILE], gl.float8e4nv))
    w_desc = TensorDescriptor.from_tensor(w.reshape(e * n, k), [block_n, TILE],
                                          gl.NVMMASharedLayout.get_default_for([block_n, TILE], gl.float8e4nv))
    grid = min(torch.cuda.get_device_properties(x8.device).multi_processor_count, meta.block_schedule(TILE).numel())
    # 12 warps (two consumer warpgroups, the producer's warpgroup) at 168 registers: 232 each consumer, 40 producer
    ws_fp8_blocks_kernel[(grid,)](
        x_desc, w_desc, x8, x8.stride(0), x8 if gather_src is None else gather_src, routing.n_expts_act, x_scale,
        w_scale, y, meta.block_schedule(TILE), meta.slice_offs, meta.block_offs(TILE), e, n_nb, n, k // TILE,
        *w_scale.stride(), block_n, stages, gather_src is not None, num_warps=4, maxnreg=168)
    return y


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", nargs="+", default=["Qwen3-30B-A3B w1:8192"],
                        help="SHAPE:T[:BLOCK_N:STAGES][:gather], SHAPE one of bench_moe.MOE_SHAPES")
    args = parser.parse_args()
    deep_gemm = bench_moe.deep_gemm_or_none()
    for case in args.cases:
        name, tokens, *rest = case.split(":")
        gather = rest[-1:] == ["gather"]
        block_n, stages = map(int, rest[:2]) if len(rest) >= 2 else (128, 4)
        n_expts, top_k, k, n, _ = bench_moe.MOE_SHAPES[name]
        bench_moe.seed_case(name, tokens)
        dense = torch.randn(n_expts, k, n, device="cuda", dtype=torch.bfloat16) / k ** 0.5
        prepared = ogsgen.prepare_expert_weights(dense.mT, format="fp8e4m3_b128")
        del dense
        x8, x_scale = ogsgen.numerics.quantize_fp8(torch.randn(int(tokens), k, device="cuda", dtype=torch.bfloat16),
                                                   (1, TILE))
        logits = torch.randn(int(tokens), n_expts, device="cuda")
        routing, gather_indx, _ = ogsgen.routing(logits, top_k)
        src = gather_indx.src_indx.long() // top_k
        rows, rows_scale = (x8, x_scale) if gather else (x8[src].contiguous(), x_scale[src].contiguous())
        pc = replace(prepared.precision_config(), act_scale=rows_scale)
        indx = dict(gather_indx=gather_indx) if gather else {}
        runs = {"ogsgen": lambda: ogsgen.matmul_ogs(rows, prepared.w, None, routing, precision_config=pc, **indx),
                "warp-specialized": lambda: ws_fp8_blocks(rows, rows_scale, prepared.w.mT, prepared.weight_scale.mT,
                                                          routing, gather_indx.src_indx if gather else None,
                                                          block_n, stages)}
        if deep_gemm is not None:
            topk_ids = torch.topk(logits, top_k, dim=1).indices
            runs["DeepGEMM contiguous"] = deepgemm_peer.contiguous(deep_gemm, x8, x_scale, prepared.w,
                                                                   prepared.weight_scale, topk_ids, True, None)[0]
        base, probe = runs["ogsgen"]().float(), runs["warp-specialized"]().float()
        differs = ((probe - base).abs().max() / base.abs().max()).item()
        flops = 2 * src.numel() * k * n
        times = bench_moe.graph_medians(list(runs.values()))
        print(f"{case}: warp-specialized vs ogsgen, largest difference {differs:.1e} of the largest |y|; " + "; ".join(
            f"{impl} {ms * 1e3:.0f} us {flops / ms / 1e9:.0f} TF/s" if not isinstance(ms, Exception)
            else f"{impl} {type(ms).__name__}" for impl, ms in zip(runs, times)), flush=True)


if __name__ == "__main__":
    main()
