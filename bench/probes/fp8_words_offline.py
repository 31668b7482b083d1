"""Probe, no GPU needed: e4m3 x with mxfp4 w through byte permutes straight into the fp8 wgmma's operand registers.

    PYTHONPATH=. python bench/probes/fp8_words_offline.py [--tiles 128x64x4x3 ...] [--time 8192x5760x2880 ...]

The design of bench/NOTES.md 5.3, not built into the kernels: words that hold a thread's fp8 fragment values nibble
after nibble (row r at K 4t..4t+3 in the low half, row r + 8 in the high half; per 16-row slab and 64-deep group,
128 words in the order (r, t, j), j the 16-deep block), each turned into two e4m3 registers by one `prmt` of an
8-byte table (the e4m3 bytes of the e2m1 magnitudes times 2**d, d per row and 32-deep block) and one `prmt` for the
signs. First an exhaustive check of that conversion against torch's e4m3 (every 4 codes, every d of the window),
then per tile an sm_90 compile of a kernel whose K loop converts such words and feeds the fp8 wgmma: its layout
conversions (TTGIR) and its K loop's instruction mix (SASS). Run it with the GPU machine's Triton (3.6).
"""
from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import torch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile as triton_compile

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from ogsgen.numerics.mx import decode_e2m1  # noqa: E402
from ogsgen.runtime import wgmma_hazards  # noqa: E402

MAGNITUDES = (0x00, 0x30, 0x38, 0x3C, 0x40, 0x44, 0x48, 0x4C)  # e4m3 bytes of e2m1 codes 0..7 (0 to 6)
SMALLEST_D = -5  # 0.5 * 2**d stays an e4m3 normal, which the exponent add below gives
# $0, $1: rows r's and r + 8's four e4m3 bytes; $2: the word; $3 and $7: row r's table, $11 and $15 row r + 8's
# (32-bit inputs take four registers each where four bytes take one).
WORD_TO_E4M3 = tl.constexpr(
    "{\n.reg .b32 sel, sh, sg;\nand.b32 sel, $2, 0x7777;\nprmt.b32 $0, $3, $7, sel;\nshl.b32 sh, $2, 4;\n"
    "prmt.b32 sg, sh, $2, 0x5140;\nand.b32 sg, sg, 0x80808080;\nor.b32 $0, $0, sg;\nshr.b32 sel, $2, 16;\n"
    "and.b32 sel, sel, 0x7777;\nprmt.b32 $1, $11, $15, sel;\nprmt.b32 sg, sh, $2, 0x7362;\n"
    "and.b32 sg, sg, 0x80808080;\nor.b32 $1, $1, sg;\n}")


def table(d: int) -> tuple[int, int]:
    """The two table registers of one row and block: magnitude bytes with d added to their exponent field."""
    entries = [m + (d << 3) if m else 0 for m in MAGNITUDES]
    return tuple(sum(e << (8 * i) for i, e in enumerate(entries[half * 4:half * 4 + 4])) for half in (0, 1))


def _prmt(a, b, selector):
    pool = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
    return sum(np.choose((selector >> (4 * i)) & 7, pool) << (8 * i) for i in range(4))


def emulate(words, d_low: int, d_high: int):
    """WORD_TO_E4M3 on uint32 words, row r's block at d_low and row r + 8's at d_high: its two outputs."""
    (lo, hi), (lo8, hi8) = table(d_low), table(d_high)
    shifted = (words << 4) & 0xFFFFFFFF
    signs = [_prmt(shifted, words, np.full_like(words, sel)) & 0x80808080 for sel in (0x5140, 0x7362)]
    return (_prmt(lo, hi, words & 0x7777) | signs[0], _prmt(lo8, hi8, (words >> 16) & 0x7777) | signs[1])


def check_conversion() -> int:
    """Every 4 codes of a half word at every d of the window against torch's e4m3 of e2m1 * 2**d; the cases."""
    words = np.arange(1 << 16, dtype=np.int64)
    codes = torch.from_numpy(np.stack([(words >> (4 * i)) & 15 for i in range(4)], -1))
    for d in range(SMALLEST_D, 7):
        want = (decode_e2m1(codes) * 2.0 ** d).to(torch.float8_e4m3fn).view(torch.uint8).numpy().astype(np.int64)
        for out in emulate(words | (words << 16), d, d):
            got = np.stack([(out >> (8 * i)) & 0xFF for i in range(4)], -1)
            if not np.array_equal(got, want):
                raise SystemExit(f"the conversion is wrong at d={d}")
    return (1 << 16) * (7 - SMALLEST_D)


@triton.jit
def words_dot(W, T, X, Y, M, K, BN: tl.constexpr, BM: tl.constexpr):
    """Y (N, M) = W^T X^T over K, a (BN, BM) tile per program, W^T from words (one table per row here: the probe
    counts the K loop's conversion, not the scales' loads)."""
    SLABS: tl.constexpr = BN // 16
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    W += pid_n * SLABS * (K // 64 * 512)
    T += pid_n * BN * 2
    X += pid_m * BM * K
    Y += pid_n * BN * M + pid_m * BM
    rows = tl.arange(0, SLABS)[:, None, None, None] * 16 + tl.arange(0, 8)[None, :, None, None]
    word = (tl.arange(0, 8)[None, :, None, None] * 4 + tl.arange(0, 4)[None, None, :, None]) * 16
    offs = tl.arange(0, SLABS)[:, None, None, None] * (K // 64 * 512) + word + tl.arange(0, 16)[None, None, None, :]
    shape: tl.constexpr = (SLABS, 8, 4, 4, 4)
    low_table = tl.broadcast_to(tl.load(T + rows * 2)[:, :, :, :, None], shape)
    low_table_high = tl.broadcast_to(tl.load(T + rows * 2 + 1)[:, :, :, :, None], shape)
    high_table = tl.broadcast_to(tl.load(T + (rows + 8) * 2)[:, :, :, :, None], shape)
    high_table_high = tl.broadcast_to(tl.load(T + (rows + 8) * 2 + 1)[:, :, :, :, None], shape)
    offs_m, offs_k = tl.arange(0, BM), tl.arange(0, 64)
    acc = tl.zeros((BN, BM), dtype=tl.float32)
    for k in range(0, K // 64):
        bytes_ = tl.reshape(tl.load(W + offs + k * 512), shape)                         # (s, r, t, j, byte)
        low, high = tl.inline_asm_elementwise(WORD_TO_E4M3, "=r,=r," + "r," * 16 + "r",
                                              [bytes_, low_table, low_table_high, high_table, high_table_high],
                                              dtype=(tl.float8e4nv, tl.float8e4nv), is_pure=True, pack=4)
        w = tl.permute(tl.join(low, high), (0, 5, 1, 3, 2, 4))                           # (s, q, r, j, t, i)
        x = tl.load(X + offs_m[:, None] * K + k * 64 + offs_k[None, :])
        acc = tl.dot(tl.reshape(w, (BN, 64)), tl.trans(x), acc)
    tl.store(Y + tl.arange(0, BN)[:, None] * M + offs_m[None, :], acc)


def compile_tile(bn: int, bm: int, warps: int, stages: int) -> str:
    signature = {"W": "*u8", "T": "*i32", "X": "*fp8e4nv", "Y": "*fp32", "M": "i32", "K": "i32", "BN": "constexpr",
                 "BM": "constexpr"}
    aligned = {(i,): [["tt.divisibility", 16]] for i in range(6)}  # as a launch specializes them
    compiled = triton_compile(ASTSource(words_dot, signature, {"BN": bn, "BM": bm}, aligned),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
    sass = wgmma_hazards.sass_of(compiled.asm["cubin"])
    loop = max((b for b in wgmma_hazards.loops(sass) if any("QGMMA" in text for _, text in b)), key=len)
    mix = Counter(re.sub(r"^@!?U?P[T0-9]+\s+", "", text).split()[0].split(".")[0] for _, text in loop)
    # (the words come through shared memory as the pipeliner stages every operand: LDS; a layout conversion of the
    # converted values would add stores to it or shuffles)
    return (f"{bn}x{bm}x{warps}x{stages}: K loop {len(loop)} instructions, {mix['STS'] + mix['SHFL']} shared-memory "
            f"stores or shuffles: " + " ".join(f"{op} {n}" for op, n in mix.most_common()))


def words_reference(words: torch.Tensor, d: torch.Tensor, k: int) -> torch.Tensor:
    """W^T (N, K) in float32 of uint8 ``words`` (slabs of K // 64 groups of (r, t, j, byte)), row n times 2**d[n]."""
    nibbles = torch.stack([(words >> 4 * h) & 15 for h in (0, 1)], -1).view(-1, k // 64, 8, 4, 4, 2, 2, 2)
    # (s, g, r, t, j, half: q, byte in the half, nibble) -> (s, q, r, g, j, t, i)
    codes = nibbles.permute(0, 5, 2, 1, 4, 3, 6, 7).reshape(d.numel(), k).long()
    return decode_e2m1(codes) * torch.exp2(d.float())[:, None]


def time_words(m: int, n: int, k: int, bn: int, bm: int, warps: int, stages: int) -> str:
    """On a GPU: the words kernel at one tile (checked against words_reference) against ogsgen's dense mxfp4 matmul
    of the same size with bf16 x and with e4m3 x (CUDA-graph medians)."""
    import ogsgen
    from triton.testing import do_bench_cudagraph
    words = torch.randint(0, 256, (n // 16 * k // 64 * 512,), dtype=torch.uint8, device="cuda")
    d = torch.randint(SMALLEST_D, 7, (n,), device="cuda")
    tables = torch.tensor([table(int(v)) for v in d.tolist()]).to(torch.int32).cuda()
    x, y = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn), torch.empty(n, m, device="cuda")
    times = {"words": lambda: words_dot[(n // bn, m // bm)](words, tables, x, y, m, k, bn, bm, num_warps=warps,
                                                             num_stages=stages)}
    times["words"]()
    err = ((y - words_reference(words, d, k) @ x.float().T).abs().max() / y.abs().max()).item()
    values, scales = ogsgen.numerics.quantize_mx(torch.randn(n, k, device="cuda").bfloat16(), "e2m1")
    w, x16 = ogsgen.swizzle_mx_values(values.mT), torch.randn(m, k, device="cuda").bfloat16()
    x8, x_scale = ogsgen.numerics.quantize_fp8(x16, (1, 0))
    for name, xs, act_scale in (("bf16 x", x16, None), ("e4m3 x", x8, x_scale)):
        pc = ogsgen.PrecisionConfig(weight_scale=scales.mT.contiguous(), act_scale=act_scale)
        times[name] = lambda xs=xs, pc=pc: ogsgen.matmul_ogs(xs, w, None, precision_config=pc)
    return f"M={m} N={n} K={k} {bn}x{bm}x{warps}x{stages} (words' max error / max {err:.1e}): " + ", ".join(
        f"{name} {(us := do_bench_cudagraph(run) * 1e3):.1f} us {2 * m * n * k / us / 1e6:.0f} TF/s"
        for name, run in times.items())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiles", nargs="+", default=["128x64x4x3"], help="BNxBMxWARPSxSTAGES (W rows, x rows)")
    parser.add_argument("--time", nargs="+", default=[], metavar="MxNxK", help="on a GPU, at these sizes")
    args = parser.parse_args()
    if not args.time:
        print(f"conversion exact: {check_conversion()} half words x d in [{SMALLEST_D}, 6]")
    for tile in args.tiles:
        for size in args.time or [None]:
            print(time_words(*map(int, size.split("x")), *map(int, tile.split("x"))) if size
                  else compile_tile(*map(int, tile.split("x"))), flush=True)


if __name__ == "__main__":
    main()
