"""Probe: a warp-specialized design for e4m3 x with mxfp4 w, compiled for sm_90 offline (no GPU), or run (--run).

    PYTHONPATH=. python bench/probes/ws_e4m3x_mxfp4_offline.py [--run M N K]

A dense prototype, not a matmul_ogs kernel. It asks whether the design fits Hopper's registers and how many
instructions each partition issues per K step. On an H100 (2026-12-08, 8192 x 5760 x 3072) its error equalled
matmul_ogs's with e4m3 x and it took 556 µs against matmul_ogs's 538 (e4m3 x) and 638 (bf16 x): no faster than
the tiled kernel (bench/NOTES.md 5.3). ``--run`` (a Hopper GPU;
M, N multiples of 128, K of 128) also launches it on random e4m3 x and mxfp4 w whose scale codes lie within 9 of
each other (every tile folds), prints its error against a float32 reference, and times it (CUDA graphs) against
matmul_ogs on the same values with e4m3 x (hopper_fp8 weights) and with bf16 x (hopper weights). Per 128 x 128
output tile and 128-deep K step:

- a loader warp copies x's e4m3 tile [128, 128] and w's e2m1 bytes [128, 64] (strided: a byte holds two K
  values) into one of 3 slots by TMA;
- a converter warpgroup turns w's bytes into e4m3 values in a second shared-memory slot [128, 128]. It uses the
  byte permutes of the hopper_fp8 reader (ogsgen.numerics.jit.WORD_TO_E4M3), with each (column, block of 32) table
  built from d = code - top + 6, where top is the column's largest code. It folds every block, so a tile whose
  codes spread wider than the fold window would need another path;
- two consumer warpgroups (64 x rows each) run fp8 wgmmas on the two slots into one accumulator over all of K:
  there is no promotion, and the epilogue multiplies by 2 ** (top - 133).
Prints registers/stack bytes, shared memory and each partition's K loop (instruction count and opcode mix).
"""
from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

from triton.backends.compiler import GPUTarget
from triton.compiler import compile as triton_compile
from triton.experimental.gluon._runtime import GluonASTSource

sys.path.insert(0, str(Path(__file__).resolve().parent))
from offline_sm90_check import registers_of  # noqa: E402

from ogsgen.numerics.gluon_hopper import (fence_async_shared, gl, gluon, mbarrier, tma_load,  # noqa: E402
                                          warpgroup_mma, warpgroup_mma_wait)
from ogsgen.numerics.jit import WORD_TO_E4M3  # noqa: E402
from ogsgen.runtime import wgmma_hazards  # noqa: E402

# The 13 warps launch as 16 (512 threads), so a thread has at most 65536 / 512 = 128 registers; the launch refused
# the 152 that 13 warps alone would allow (an H100, 2026-12-08).
MAXNREG = 128


@gluon.jit
def _load(XDesc, WQDesc, WS, Top, Y, N, K, x_bufs, wq_bufs, w8_bufs, ld_ready, ld_empty, w8_ready, w8_empty,
          WG: gl.constexpr):
    for k in range(K // 128):
        s = k % 3
        mbarrier.wait(ld_empty.index(s), ((k // 3) & 1) ^ 1)  # (a new barrier's phase 1 counts as done)
        mbarrier.expect(ld_ready.index(s), 128 * 128 + 128 * 64)
        tma_load(XDesc, [gl.program_id(0) * 128, k * 128], ld_ready.index(s), x_bufs.index(s))
        tma_load(WQDesc, [gl.program_id(1) * 128, k * 64], ld_ready.index(s), wq_bufs.index(s))


@gluon.jit
def _convert(XDesc, WQDesc, WS, Top, Y, N, K, x_bufs, wq_bufs, w8_bufs, ld_ready, ld_empty, w8_ready, w8_empty,
             WG: gl.constexpr):
    BYTES: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0])  # [columns, bytes]: a thread's words
    rows = gl.program_id(1) * 128 + gl.arange(0, 128, layout=gl.SliceLayout(1, BYTES))
    blocks = gl.arange(0, 64, layout=gl.SliceLayout(0, BYTES)) // 16  # a byte's block of 32 K values
    top = gl.load(Top + rows)
    for k in range(K // 128):
        s = k % 3
        mbarrier.wait(ld_ready.index(s), (k // 3) & 1)
        mbarrier.wait(w8_empty.index(s), ((k // 3) & 1) ^ 1)
        words = wq_bufs.index(s).load(BYTES)
        mbarrier.arrive(ld_empty.index(s), count=1)
        d = gl.load(WS + rows[:, None] * (K // 32) + k * 4 + blocks[None, :]).to(gl.int32) - top[:, None] + 6
        low, high = 0x3C383000 + d * 0x08080800, 0x4C484440 + d * 0x08080808
        first, second = gl.inline_asm_elementwise(WORD_TO_E4M3, "=r,=r," + "r," * 16 + "r",
                                                  [words, low, high, low, high],
                                                  dtype=(gl.float8e4nv, gl.float8e4nv), is_pure=True, pack=4)
        # first: K 8j..8j+3 of word j, second: 8j+4..8j+7
        values = gl.join(first.reshape((128, 16, 4)), second.reshape((128, 16, 4)))
        w8_bufs.index(s).store(values.permute((0, 1, 3, 2)).reshape((128, 128)))
        fence_async_shared()
        mbarrier.arrive(w8_ready.index(s), count=1)


@gluon.jit
def _compute(XDesc, WQDesc, WS, Top, Y, N, K, x_bufs, wq_bufs, w8_bufs, ld_ready, ld_empty, w8_ready, w8_empty,
             WG: gl.constexpr):
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 128, 32])
    acc = gl.zeros((64, 128), dtype=gl.float32, layout=MMA)
    for k in range(K // 128):
        s = k % 3
        mbarrier.wait(ld_ready.index(s), (k // 3) & 1)
        mbarrier.wait(w8_ready.index(s), (k // 3) & 1)
        x_tile = x_bufs.index(s).slice(WG * 64, 64)
        w_tile = w8_bufs.index(s).permute((1, 0))
        acc = warpgroup_mma(x_tile, w_tile, acc, is_async=True)
        acc, _, _ = warpgroup_mma_wait(num_outstanding=0, deps=(acc, x_tile, w_tile))
        mbarrier.arrive(ld_empty.index(s), count=1)
        mbarrier.arrive(w8_empty.index(s), count=1)
    rows = gl.program_id(0) * 128 + WG * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, MMA))
    cols = gl.program_id(1) * 128 + gl.arange(0, 128, layout=gl.SliceLayout(0, MMA))
    scale = gl.exp2((gl.load(Top + cols) - 133).to(gl.float32))
    gl.store(Y + rows[:, None] * N + cols[None, :], (acc * scale[None, :]).to(gl.bfloat16))


@gluon.jit
def ws_e4m3x_mxfp4(XDesc, WQDesc, WS, Top, Y, N, K):
    x_bufs = gl.allocate_shared_memory(gl.float8e4nv, [3, 128, 128], XDesc.layout)
    wq_bufs = gl.allocate_shared_memory(gl.uint8, [3, 128, 64], WQDesc.layout)
    w8_bufs = gl.allocate_shared_memory(gl.float8e4nv, [3, 128, 128], XDesc.layout)
    ld_ready = gl.allocate_shared_memory(gl.int64, [3, 1], mbarrier.MBarrierLayout())
    ld_empty = gl.allocate_shared_memory(gl.int64, [3, 1], mbarrier.MBarrierLayout())
    w8_ready = gl.allocate_shared_memory(gl.int64, [3, 1], mbarrier.MBarrierLayout())
    w8_empty = gl.allocate_shared_memory(gl.int64, [3, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(3):
        mbarrier.init(ld_ready.index(s), count=1)
        mbarrier.init(ld_empty.index(s), count=3)  # the converter and both consumers
        mbarrier.init(w8_ready.index(s), count=1)
        mbarrier.init(w8_empty.index(s), count=2)
    fence_async_shared()
    # The converter is the default partition: ptxas compiles every partition under the launch's register cap
    # (MAXNREG), which the consumers' 64 x 128 accumulators fit.
    gl.warp_specialize([
        (_convert, (XDesc, WQDesc, WS, Top, Y, N, K, x_bufs, wq_bufs, w8_bufs, ld_ready, ld_empty, w8_ready,
                    w8_empty, 0)),
        (_compute, (XDesc, WQDesc, WS, Top, Y, N, K, x_bufs, wq_bufs, w8_bufs, ld_ready, ld_empty, w8_ready,
                    w8_empty, 0)),
        (_compute, (XDesc, WQDesc, WS, Top, Y, N, K, x_bufs, wq_bufs, w8_bufs, ld_ready, ld_empty, w8_ready,
                    w8_empty, 1)),
        (_load, (XDesc, WQDesc, WS, Top, Y, N, K, x_bufs, wq_bufs, w8_bufs, ld_ready, ld_empty, w8_ready,
                 w8_empty, 0)),
    ], [4, 4, 1], [184, 184, 40])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=int, nargs=3, metavar=("M", "N", "K"), help="also launch and time it (GPU)")
    args = parser.parse_args()
    x_layout = gl.NVMMASharedLayout.get_default_for([128, 128], gl.float8e4nv)
    wq_layout = gl.NVMMASharedLayout.get_default_for([128, 64], gl.uint8)
    signature = {"XDesc": f"tensordesc<fp8e4nv[128, 128],{x_layout!r}>",
                 "WQDesc": f"tensordesc<u8[128, 64],{wq_layout!r}>",
                 "WS": "*u8", "Top": "*i32", "Y": "*bf16", "N": "i32", "K": "i32"}
    names = list(signature)
    aligned = {(names.index(n),): [["tt.divisibility", 16]] for n in ("WS", "Top", "Y", "N", "K")}
    compiled = triton_compile(GluonASTSource(ws_e4m3x_mxfp4, signature, {}, aligned),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "maxnreg": MAXNREG})
    sass = wgmma_hazards.sass_of(compiled.asm["cubin"])
    print(f"registers/stack bytes {registers_of(compiled.asm['cubin'])}, shared memory {compiled.metadata.shared}")
    for partition, body in _partition_loops(sass):
        opcodes = Counter(re.sub(r"^@!?U?P[T0-9]+\s+", "", text).split()[0].split(".")[0] for _, text in body)
        print(f"{partition} K loop: {len(body)} instructions: "
              + " ".join(f"{op} {n}" for op, n in opcodes.most_common(12)))
    if args.run:
        run_on_gpu(*args.run)


def run_on_gpu(m: int, n: int, k: int):
    """Launch the prototype on random operands, check it against float32 and time it against matmul_ogs."""
    import torch
    from triton.testing import do_bench_cudagraph

    import ogsgen
    from ogsgen.numerics.gluon_hopper import hopper_descriptor
    from ogsgen.numerics.layouts import swizzle_mx_values
    from ogsgen.numerics.mx import decode_e2m1

    torch.manual_seed(0)
    x = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
    values = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda")  # (N, K / 2): two K values a byte
    scales = torch.randint(118, 127, (n, k // 32), dtype=torch.uint8, device="cuda")
    top = scales.amax(1).int()
    y = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    x_desc = hopper_descriptor(x, [128, 128], gl.NVMMASharedLayout.get_default_for([128, 128], gl.float8e4nv))
    w_desc = hopper_descriptor(values, [128, 64], gl.NVMMASharedLayout.get_default_for([128, 64], gl.uint8))
    codes = torch.stack([values & 15, values >> 4], -1).flatten(-2).long()
    w_ref = decode_e2m1(codes).float() * torch.exp2(scales.float() - 127).repeat_interleave(32, 1)
    reference = x.float() @ w_ref.T
    e4m3_w, bf16_w = (swizzle_mx_values(values.mT, layout) for layout in ("hopper_fp8", "hopper"))
    e4m3_pc = ogsgen.PrecisionConfig(weight_scale=scales.mT, act_scale=torch.ones(m, 1, device="cuda"))
    bf16_pc, x_bf16 = ogsgen.PrecisionConfig(weight_scale=scales.mT), x.bfloat16()

    def prototype():
        ws_e4m3x_mxfp4[(m // 128, n // 128)](x_desc, w_desc, scales, top, y, n, k, num_warps=4, maxnreg=MAXNREG)
        return y

    calls = {"prototype": prototype,
             "matmul_ogs, e4m3 x": lambda: ogsgen.matmul_ogs(x, e4m3_w, None, precision_config=e4m3_pc),
             "matmul_ogs, bf16 x": lambda: ogsgen.matmul_ogs(x_bf16, bf16_w, None, precision_config=bf16_pc)}
    for name, call in calls.items():
        out = call().float()
        rms = ((out - reference).pow(2).mean() / reference.pow(2).mean()).sqrt().item()
        us = do_bench_cudagraph(call) * 1e3
        print(f"{name:20s} relative rms error {rms:.1e}  {us:9.1f} us  {2 * m * n * k / us / 1e6:7.1f} TF/s")


def _partition_loops(sass: str):
    """(name, body) of the consumers' K loops (with QGMMA) and the converter's (the shortest loop with PRMT; the
    listing's other loops around it are its barrier waits' retry branches)."""
    bodies = [(body, [text for _, text in body]) for body in wgmma_hazards.loops(sass)]
    yield from (("consumer", body) for body, texts in bodies if any("QGMMA" in t for t in texts) and len(body) < 200)
    converter = [body for body, texts in bodies if any("PRMT" in t for t in texts)]
    yield "converter", min(converter, key=len)


if __name__ == "__main__":
    main()
