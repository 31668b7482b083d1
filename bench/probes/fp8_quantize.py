"""quantize_fp8 on a GPU: bit for bit against quantize_fp8_torch (on the GPU and on the CPU), edge cases included,
then its time against the bytes it must move (2 read + 1 written per bf16 value, plus the scales) and a sweep of
tile sizes. Run from the repository root: PYTHONPATH=. python3 bench/probes/fp8_quantize.py [--sweep]."""
import sys

import torch
import triton

from ogsgen.numerics import quantize_fp8, quantize_fp8_torch
from ogsgen.numerics.fp8_blocks import _quantize_fp8_rows

NAN, INF = float("nan"), float("inf")


def same(a, b):
    return torch.equal(a.cpu().view(torch.uint8) if a.dtype == torch.float8_e4m3fn else a.cpu().nan_to_num(-1.0),
                       b.cpu().view(torch.uint8) if b.dtype == torch.float8_e4m3fn else b.cpu().nan_to_num(-1.0))


def cases():
    g = torch.Generator(device="cuda").manual_seed(0)
    m, k = 300, 7168 + 37
    x = torch.randn(m, k, device="cuda", generator=g) * torch.exp(4 * torch.randn(m, 1, device="cuda", generator=g))
    x[1] = 0.0
    x[2, :5], x[3, 7], x[4, 300] = NAN, INF, -INF
    # amax at every float32 exponent, subnormals included: subnormal scales, underflowing ones
    exponents = torch.arange(-149, 128, device="cuda").repeat_interleave(1)[: m - 10]
    x[10:10 + len(exponents)] *= 0
    x[10:10 + len(exponents), :200] = (torch.rand(len(exponents), 200, device="cuda", generator=g) + 1) * \
        torch.pow(2.0, exponents.double()).float()[:, None].clamp(max=1.7e38)
    yield "fp32", x
    yield "bf16", x.bfloat16()
    yield "fp16", x.clamp(-6e4, 6e4).half()
    yield "bf16 strided", x.bfloat16().mT.contiguous().mT[5:250, 3:4003]
    yield "bf16 column stride", x.bfloat16()[:, ::3]
    yield "bf16 K=100", x.bfloat16()[:, :100]
    yield "M=1", x[:1]


def check():
    failures = 0
    for name, x in cases():
        for block in ((1, 128), (1, 0)):
            for pow2 in (False, True):
                v, s = quantize_fp8(x, block, pow2_scales=pow2)
                vr, sr = quantize_fp8_torch(x, block, pow2_scales=pow2)
                vc, sc = quantize_fp8_torch(x.cpu(), block, pow2_scales=pow2)
                ok = same(v, vr) and same(s, sr) and same(vr, vc) and same(sr, sc)
                if not ok:
                    failures += 1
                    bad = (v.cpu().view(torch.uint8) != vc.view(torch.uint8)).nonzero()[:5].tolist()
                    bad_s = (s.cpu().nan_to_num(-1) != sc.nan_to_num(-1)).nonzero()[:5].tolist()
                    print(f"MISMATCH {name} block={block} pow2={pow2}: kernel==torch(cuda) {same(v, vr)}/{same(s, sr)}"
                          f" torch cuda==cpu {same(vr, vc)}/{same(sr, sc)} values at {bad} scales at {bad_s}")
                    for r, c in bad_s[:2]:
                        print("   scale", s[r, c].item(), sc[r, c].item(), "amax row", x[r].abs().max().item())
    print(f"bit-for-bit check: {failures} mismatching cases")


def bench(x, block, block_m, block_k, num_warps):
    per_row = block == (1, 0)
    n_rows, n_cols = x.shape
    values = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    scales = torch.empty((n_rows, 1 if per_row else triton.cdiv(n_cols, 128)), device=x.device)
    grid = (triton.cdiv(n_rows, block_m), 1 if per_row else scales.shape[1])

    def launch():
        _quantize_fp8_rows[grid](x, values, scales, n_rows, n_cols, x.stride(0), x.stride(1), values.stride(0),
                                 scales.stride(0), PER_ROW=per_row, POW2=False, BLOCK_M=block_m, BLOCK_K=block_k,
                                 num_warps=num_warps)
    return triton.testing.do_bench(launch, warmup=50, rep=200, return_mode="median") * 1e-3


def timings(sweep):
    copy_x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    copy_t = triton.testing.do_bench(lambda: copy_x.clone(), return_mode="median") * 1e-3
    print(f"device copy: {2 * copy_x.numel() / copy_t / 1e12:.2f} TB/s")
    print("block     M     K   time_us   TB/s  (bytes: 2 read + 1 written + scales; default launch)")
    for k in (7168, 2048):
        for m in (1, 16, 128, 1024, 8192, 32768):
            x = torch.randn(m, k, device="cuda").bfloat16()
            for block in ((1, 128), (1, 0)):
                t = triton.testing.do_bench(lambda: quantize_fp8(x, block), warmup=50, rep=200,
                                            return_mode="median") * 1e-3
                n_scales = m * (1 if block == (1, 0) else triton.cdiv(k, 128))
                moved = 3 * m * k + 4 * n_scales
                print(f"{str(block):9} {m:5} {k:5} {t * 1e6:9.1f} {moved / t / 1e12:6.2f}")
                if sweep and m in (16, 8192, 32768):
                    for block_m in ((4, 8, 16, 32, 64) if block == (1, 128) else (1, 2, 4, 8, 16)):
                        for block_k in ((128,) if block == (1, 128) else (512, 1024, 2048)):
                            for warps in (2, 4, 8):
                                t = bench(x, block, block_m, block_k, warps)
                                print(f"    BLOCK_M={block_m:2} BLOCK_K={block_k:4} warps={warps}: "
                                      f"{t * 1e6:8.1f} us {moved / t / 1e12:6.2f} TB/s")


if __name__ == "__main__":
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    check()
    timings("--sweep" in sys.argv)
