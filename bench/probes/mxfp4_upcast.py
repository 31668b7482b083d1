"""Probe: which mxfp4 weight layout and upcast make Hopper's in-kernel fp4 -> bf16 path fast.

    PYTHONPATH=. python bench/probes/mxfp4_upcast.py --out OUT          # on the GPU: times every candidate
    python bench/probes/mxfp4_upcast.py --ptx OUT                       # no GPU: sm_90 PTX statistics only

A stripped-down batched kernel (one program per BLOCK_N x BLOCK_M tile of one expert; no routing) with three
independent choices, each a constexpr:

* LAYOUT 0 ``strided``: byte i of a K row pair holds K rows 2i (low nibble) and 2i + 1 (high nibble);
  LAYOUT 1 ``hopper_value``: within every 32-row scale block, byte j holds rows j (low) and j + 16 (high),
  so the two nibble planes are two K sub-tiles and no interleave has to be undone in registers.
* DECODE 0: the exact fp32 decode of ogsgen.numerics.jit (what the template used first);
  DECODE 1: the nibble's exponent and mantissa bits placed into an fp16 (subnormal for 0.5, which the
  hardware conversion handles), times 2**14 and the block scale.
* SWAP 0: acc (M, N) = x @ w, w as the B operand (through shared memory);
  SWAP 1: acc^T (N, M) = w^T @ x^T, so the upcast weights are wgmma's A operand, which may stay in registers.

Results (time, effective TB/s, PTX statistics) go to OUT/mxfp4_probe.csv; bench/NOTES.md discusses them.
"""
from __future__ import annotations

import argparse
import csv
import itertools
import re
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

from ogsgen.numerics.jit import e2m1_times_2_14, pow2_of_scale


@triton.jit
def _decode_e2m1_fp32(codes):
    """The first in-kernel decode (DECODE 0): fp32 bits assembled per value, 0 and 0.5 by a select."""
    exponent = (codes >> 1) & 3
    mantissa = codes & 1
    normal = ((exponent + 126) << 23 | mantissa << 22).to(tl.float32, bitcast=True)
    magnitude = tl.where(exponent == 0, mantissa.to(tl.float32) * 0.5, normal)
    return tl.where((codes & 8) != 0, -magnitude, magnitude)


@triton.jit
def _upcast(nibbles, factors, DECODE: tl.constexpr):
    """e2m1 nibbles (int32) times their block's scale factor, as bf16."""
    if DECODE == 0:
        return (_decode_e2m1_fp32(nibbles) * factors).to(tl.bfloat16)
    return (e2m1_times_2_14(nibbles) * (factors * 16384.0)).to(tl.bfloat16)


@triton.jit
def probe_kernel(Y, X, W, S, M, N, K,
                 stride_x_e, stride_x_m, stride_w_e, stride_w_n, stride_s_e, stride_s_n, stride_y_s, stride_y_e,
                 stride_y_m, LAYOUT: tl.constexpr, DECODE: tl.constexpr, SWAP: tl.constexpr, SPLIT: tl.constexpr,
                 PREFETCH: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n = tl.program_id(0) // SPLIT
    pid_k = tl.program_id(0) % SPLIT
    pid_m = tl.program_id(1)
    expert = tl.program_id(2).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_n = offs_n < N
    rows = tl.where(offs_m < M, offs_m, 0)
    offs_b = tl.arange(0, BLOCK_K // 2)                      # bytes of the K tile
    offs_s = offs_b // 16                                     # the scale block of each byte
    WPtrs = W + expert * stride_w_e + offs_n[:, None] * stride_w_n + offs_b[None, :]
    SPtrs = S + expert * stride_s_e + offs_n[:, None] * stride_s_n + offs_s[None, :]
    if LAYOUT == 0:
        offs_k = tl.arange(0, BLOCK_K)
    else:
        offs_k = (offs_b // 16) * 32 + offs_b % 16            # K rows of the low nibbles; +16 for the high
    XPtrs = X + expert * stride_x_e + rows[:, None] * stride_x_m + offs_k[None, :]
    if SWAP:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    WPtrs += pid_k * (BLOCK_K // 2)
    SPtrs += pid_k * (BLOCK_K // 32)
    XPtrs += pid_k * BLOCK_K
    if PREFETCH:  # registers double-buffer the weight bytes: the next tile's loads are in flight during the math
        next_packed = tl.load(WPtrs, mask=mask_n[:, None], other=0)
        next_scales = tl.load(SPtrs, mask=mask_n[:, None], other=0)
    for k in range(pid_k, tl.cdiv(K, BLOCK_K), SPLIT):
        if PREFETCH:
            packed = next_packed.to(tl.int32)
            factors = pow2_of_scale(next_scales)
            more = k + SPLIT < tl.cdiv(K, BLOCK_K)
            next_packed = tl.load(WPtrs + SPLIT * (BLOCK_K // 2), mask=mask_n[:, None] & more, other=0)
            next_scales = tl.load(SPtrs + SPLIT * (BLOCK_K // 32), mask=mask_n[:, None] & more, other=0)
        else:
            packed = tl.load(WPtrs, mask=mask_n[:, None], other=0).to(tl.int32)     # (BLOCK_N, BLOCK_K // 2)
            factors = pow2_of_scale(tl.load(SPtrs, mask=mask_n[:, None], other=0))
        low = _upcast(packed & 15, factors, DECODE)
        high = _upcast(packed >> 4, factors, DECODE)
        if LAYOUT == 0:
            w = tl.reshape(tl.join(low, high), (BLOCK_N, BLOCK_K))             # k = 2i, 2i + 1
            x = tl.load(XPtrs)
            if SWAP:
                acc = tl.dot(w, tl.trans(x), acc)
            else:
                acc = tl.dot(x, tl.trans(w), acc)
        else:
            x_low = tl.load(XPtrs)
            x_high = tl.load(XPtrs + 16)
            if SWAP:
                acc = tl.dot(low, tl.trans(x_low), acc)
                acc = tl.dot(high, tl.trans(x_high), acc)
            else:
                acc = tl.dot(x_low, tl.trans(low), acc)
                acc = tl.dot(x_high, tl.trans(high), acc)
        WPtrs += SPLIT * (BLOCK_K // 2)
        SPtrs += SPLIT * (BLOCK_K // 32)
        XPtrs += SPLIT * BLOCK_K
    if SWAP:
        acc = tl.trans(acc)
    YPtrs = Y + pid_k * stride_y_s + expert * stride_y_e + offs_m[:, None] * stride_y_m + offs_n[None, :]
    tl.store(YPtrs, acc, mask=(offs_m[:, None] < M) & mask_n[None, :])


def to_probe_layout(packed: torch.Tensor) -> torch.Tensor:
    """Strided packed bytes (..., K // 2), K rows 2i/2i+1 per byte -> LAYOUT 1 (rows j / j + 16 per 32-row block)."""
    low, high = packed & 15, packed >> 4
    codes = torch.stack([low, high], dim=-1).flatten(-2)              # (..., K) one code per K row
    blocks = codes.unflatten(-1, (-1, 2, 16))                          # (..., K // 32, half, j)
    return (blocks[..., 0, :] | (blocks[..., 1, :] << 4)).flatten(-2)


def make_operands(experts, m, n, k, device):
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(experts, m, k, generator=g).to(device, torch.bfloat16)
    packed = torch.randint(0, 256, (experts, n, k // 2), generator=g, dtype=torch.uint8).to(device)
    scales = torch.randint(118, 130, (experts, n, k // 32), generator=g, dtype=torch.uint8).to(device)
    return x, packed, scales


def reference(x, packed, scales):
    from ogsgen.numerics.mx import dequantize_mx_torch
    w = dequantize_mx_torch(packed, scales, "e2m1")                    # (E, N, K) float32
    return (x.float() @ w.mT)


# (M, BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages); K (2880) must be a multiple of BLOCK_K
CONFIGS = {1: [(16, 128, 64, 4, 3), (16, 64, 64, 4, 3), (16, 256, 64, 8, 3)],
           256: [(64, 128, 64, 4, 3), (128, 128, 64, 8, 3), (128, 256, 64, 8, 3)],
           2048: [(128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (64, 256, 64, 8, 3)]}
SPLITS = {1: (1, 3), 256: (1,), 2048: (1,)}


def candidates():
    for m, configs in CONFIGS.items():
        for cfg, layout, decode, swap, split, prefetch in itertools.product(configs, (0, 1), (0, 1), (0, 1),
                                                                          SPLITS[m], (0, 1)):
            yield dict(M=m, BLOCK_M=cfg[0], BLOCK_N=cfg[1], BLOCK_K=cfg[2], num_warps=cfg[3], num_stages=cfg[4],
                       layout=layout, decode=decode, swap=swap, split=split, prefetch=prefetch)


def launch(x, w, s, y, row):
    e, m, k = x.shape
    n = w.shape[1]
    grid = (triton.cdiv(n, row["BLOCK_N"]) * row["split"], triton.cdiv(m, row["BLOCK_M"]), e)
    probe_kernel[grid](y, x, w, s, m, n, k, x.stride(0), x.stride(1), w.stride(0), w.stride(1), s.stride(0),
                       s.stride(1), y.stride(0), y.stride(1), y.stride(2), **_constexprs(row),
                       num_warps=row["num_warps"], num_stages=row["num_stages"])


def _constexprs(row):
    return dict(LAYOUT=row["layout"], DECODE=row["decode"], SWAP=row["swap"], SPLIT=row["split"],
                PREFETCH=row["prefetch"], BLOCK_M=row["BLOCK_M"], BLOCK_N=row["BLOCK_N"], BLOCK_K=row["BLOCK_K"])


def ptx_stats(row, arch=90):
    from triton.backends.compiler import GPUTarget
    sig = {"Y": "*fp32", "X": "*bf16", "W": "*u8", "S": "*u8"}
    sig.update({name: "i32" for name in ("M", "N", "K", "stride_x_e", "stride_x_m", "stride_w_e", "stride_w_n",
                                         "stride_s_e", "stride_s_n", "stride_y_s", "stride_y_e", "stride_y_m")})
    consts = _constexprs(row)
    sig.update({name: "constexpr" for name in consts})
    src = triton.compiler.ASTSource(fn=probe_kernel, signature=sig, constexprs=consts)
    compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                              options={"num_warps": row["num_warps"], "num_stages": row["num_stages"]})
    ptx = compiled.asm["ptx"]
    return {"wgmma": len(re.findall(r"wgmma\.mma_async", ptx)), "mma_sync": len(re.findall(r"\bmma\.sync", ptx)),
            "st_shared": len(re.findall(r"st\.shared", ptx)), "ld_shared": len(re.findall(r"ld\.shared", ptx)),
            "ldmatrix": len(re.findall(r"ldmatrix", ptx)), "shfl": len(re.findall(r"shfl\.sync", ptx)),
            "cp_async": len(re.findall(r"cp\.async\.(?:ca|cg)", ptx)),
            "ld_global": len(re.findall(r"ld\.global", ptx)), "lines": ptx.count("\n"),
            "shared_bytes": compiled.metadata.shared}


def compile_all(rows, parallel):
    """PTX statistics per candidate, each compiled in a forked process: some block shapes abort the compiler
    (an LLVM error kills the process, it raises nothing), and the probe must survive them."""
    import multiprocessing as mp
    ctx = mp.get_context("fork")
    results, running, queue = {}, {}, ctx.Queue()

    def child(index, cand):
        try:
            queue.put((index, ptx_stats(cand)))
        except Exception as exc:
            queue.put((index, {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}))

    pending = list(enumerate(rows))
    while pending or running:
        while pending and len(running) < parallel:
            index, cand = pending.pop(0)
            proc = ctx.Process(target=child, args=(index, cand))
            proc.start()
            running[index] = proc
        for index, proc in list(running.items()):
            proc.join(timeout=0.05)
            if not proc.is_alive():
                del running[index]
        while not queue.empty():
            index, stats = queue.get()
            results[index] = stats
    while not queue.empty():
        index, stats = queue.get()
        results[index] = stats
    return [results.get(i, {"error": "compiler aborted"}) for i in range(len(rows))]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="time every candidate on the GPU; CSV into this folder")
    parser.add_argument("--ptx", type=Path, help="no GPU: compile for sm_90 and write PTX statistics here")
    parser.add_argument("--parallel", type=int, default=8, help="compiler processes")
    parser.add_argument("--experts", type=int, default=4)
    parser.add_argument("--n", type=int, default=5760)
    parser.add_argument("--k", type=int, default=2880)
    args = parser.parse_args()
    rows = list(candidates())
    for row, stats in zip(rows, compile_all(rows, args.parallel)):
        row.update(stats)
    if args.out:
        cache = {}
        for row in rows:
            if "error" in row:
                print(row, flush=True)
                continue
            m = row["M"]
            if m not in cache:
                x, packed, scales = make_operands(args.experts, m, args.n, args.k, "cuda")
                cache[m] = (x, packed, to_probe_layout(packed), scales, reference(x, packed, scales))
            x, packed, swizzled, scales, ref = cache[m]
            w = packed if row["layout"] == 0 else swizzled
            y = torch.zeros(row["split"], args.experts, m, args.n, device="cuda", dtype=torch.float32)
            try:
                fn = lambda: launch(x, w, scales, y, row)  # noqa: E731
                fn()
                torch.cuda.synchronize()
                row["max_rel_err"] = float(((y.sum(0) - ref).abs().max() / ref.abs().max()).item())
                ms = triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median")
                weight_bytes = packed.numel() + scales.numel()
                row["us"] = round(ms * 1e3, 2)
                row["TBps"] = round((weight_bytes + x.numel() * 2 + y[0].numel() * 2) / ms / 1e9, 3)
                row["TFps"] = round(2 * args.experts * m * args.n * args.k / ms / 1e9, 1)
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            print(row, flush=True)
    out_dir = args.out or args.ptx
    out_dir.mkdir(parents=True, exist_ok=True)
    keys = list(dict.fromkeys(key for row in rows for key in row))
    with open(out_dir / "mxfp4_probe.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
    if not args.out:
        for row in rows:
            print(row)


if __name__ == "__main__":
    sys.exit(main())
