"""fp8 e4m3 with float32 block scales (ogsgen.numerics.fp8_blocks) and the expert weights of the formats
fp8e4m3_b128 and fp8e4m3_channel, against an independent reference: the block rule in float64 and numpy float32,
e4m3 rounding by nearest value of e4m3's table (ties to the even code)."""
import math

import numpy as np
import pytest
import torch

import triton
import triton.language as tl

import ogsgen
from ogsgen.moe.weights import _interleave
from ogsgen.numerics import fp8_blocks
from ogsgen.numerics import FP8_BLOCK, FP8_E4M3_MAX, dequantize_fp8_torch, quantize_fp8, quantize_fp8_torch

NAN, INF = float("nan"), float("inf")
E4M3_TABLE = torch.arange(127, dtype=torch.uint8).view(torch.float8_e4m3fn).double()  # codes 0..126: 0 .. 448


def _e4m3_codes(values: np.ndarray) -> np.ndarray:
    """float32 values within +-448 -> e4m3 codes: the nearest value of e4m3's table, ties to the even code."""
    table = E4M3_TABLE.numpy()
    magnitude = np.abs(values.astype(np.float64))
    upper = np.searchsorted(table, magnitude).clip(1, len(table) - 1)
    lower = upper - 1
    below, above = magnitude - table[lower], table[upper] - magnitude
    code = np.where(below < above, lower, np.where(above < below, upper, np.where(lower % 2 == 0, lower, upper)))
    return (code | (np.signbit(values) << 7)).astype(np.uint8)


def _pow2_reference(amax: float) -> float:
    """The smallest power of two (float32's, 2**-149 at the least) s with amax <= 448 * s, in exact float64."""
    exponent = max(math.frexp(amax / FP8_E4M3_MAX)[1] - 2, -149)
    while FP8_E4M3_MAX * 2.0 ** exponent < amax:
        exponent += 1
    while exponent > -149 and FP8_E4M3_MAX * 2.0 ** (exponent - 1) >= amax:
        exponent -= 1
    return 2.0 ** exponent


def _block_slices(extent: int, block: int):
    size = block or max(extent, 1)
    return [slice(start, start + size) for start in range(0, max(extent, 1) if block == 0 else extent, size)]


def reference_quantize(t: torch.Tensor, block, pow2_scales=False):
    """The block rule, block by block, in float64 and numpy float32: (uint8 codes, float32 scales)."""
    x = t.float().cpu().numpy()
    lead, (rows, cols) = x.shape[:-2], x.shape[-2:]
    row_blocks, col_blocks = _block_slices(rows, block[0]), _block_slices(cols, block[1])
    codes = np.zeros(x.shape, np.uint8)
    scales = np.zeros((*lead, len(row_blocks), len(col_blocks)), np.float32)
    for index in np.ndindex(*lead):
        for i, rs in enumerate(row_blocks):
            for j, cs in enumerate(col_blocks):
                values = x[index][rs, cs]
                if not np.isfinite(values).all():
                    scales[index][i, j] = NAN  # (codes stay 0)
                    continue
                amax = float(np.abs(values).max()) if values.size else 0.0
                if pow2_scales:
                    scale = np.float32(_pow2_reference(amax) if amax else 0.0)
                else:
                    scale = np.float32(amax) / np.float32(FP8_E4M3_MAX)  # float32 division
                scale = np.float32(1.0) if scale == 0 else scale
                scales[index][i, j] = scale
                scaled = np.clip(values / scale, -FP8_E4M3_MAX, FP8_E4M3_MAX).astype(np.float32)
                codes[index][rs, cs] = _e4m3_codes(scaled)
    return torch.from_numpy(codes), torch.from_numpy(scales)


def reference_dequantize(codes: torch.Tensor, scales: torch.Tensor, block) -> torch.Tensor:
    """float64 values times their block's scale (exact), block by block."""
    values = codes.cpu().view(torch.float8_e4m3fn).double()
    out = torch.empty_like(values)
    rows, cols = values.shape[-2:]
    for i, rs in enumerate(_block_slices(rows, block[0])):
        for j, cs in enumerate(_block_slices(cols, block[1])):
            out[..., rs, cs] = values[..., rs, cs] * scales.cpu().double()[..., i, j, None, None]
    return out


def assert_quantized_as_reference(t, block, pow2_scales, values, scales):
    codes_ref, scales_ref = reference_quantize(t, block, pow2_scales)
    assert values.dtype == torch.float8_e4m3fn and values.shape == t.shape
    assert scales.dtype == torch.float32 and scales.shape == scales_ref.shape
    assert torch.equal(values.cpu().view(torch.uint8), codes_ref)
    assert torch.equal(scales.cpu().nan_to_num(-1.0), scales_ref.nan_to_num(-1.0))


def spread(shape, device, dtype=torch.float32):
    """Random values whose magnitudes vary by row: blocks with very different scales."""
    return (torch.randn(shape, device=device) * torch.exp(4 * torch.randn((*shape[:-1], 1), device=device))).to(dtype)


# ---------------------------------------------------------------- the block rule (torch reference)

@pytest.mark.parametrize("pow2_scales", [False, True])
@pytest.mark.parametrize("shape,block", [((5, 300), (1, 128)), ((3, 200, 300), (128, 128)), ((4, 70), (1, 0)),
                                         ((2, 9, 13), (0, 0)), ((11, 17), (3, 5)), ((2, 130, 7), (128, 1)),
                                         ((6, 40), (0, 16))])
def test_quantize_fp8_torch_follows_the_block_rule(shape, block, pow2_scales):
    t = spread(shape, "cpu")
    t[..., :2, :] = 0.0  # an all-zero block somewhere: scale 1
    values, scales = quantize_fp8_torch(t, block, pow2_scales=pow2_scales)
    assert_quantized_as_reference(t, block, pow2_scales, values, scales)
    n_r, n_c = (-(-shape[-2] // block[0]) if block[0] else 1), (-(-shape[-1] // block[1]) if block[1] else 1)
    assert scales.shape == (*shape[:-2], n_r, n_c)  # the last, partial block of each dim has a scale of its own
    back = dequantize_fp8_torch(values, scales, block)
    assert torch.equal(back, reference_dequantize(values.view(torch.uint8), scales, block).float())
    # within half a step of e4m3: 2**-4 relative, or half its smallest subnormal (2**-9) times the block's scale
    scale_of = dequantize_fp8_torch(torch.ones_like(values), scales, block)
    assert ((back - t).abs() <= t.abs() / 16 + scale_of * 2.0 ** -10).all()


def test_block_rule_special_blocks_one_row_each():
    # Row by row (block (1, 0)): zero, tiny, subnormal, underflowing, e4m3 ties, exactly 448 * 2**e and the float
    # after it, the largest float32, NaN and infinities.
    tiny = torch.finfo(torch.float32).tiny
    after = float(np.nextafter(np.float32(448 * 2.0 ** -3), np.float32(INF)))
    rows = [[0.0, -0.0, 0.0, 0.0], [1e-30, -3e-31, 2e-32, 0.0], [1e-39, -1e-40, 1e-41, 0.0], [1e-44, 0.0, 0.0, 0.0],
            [448.0, 1.0625, 1.1875, -0.0], [448 * 2.0 ** -3, 3.0, 0.1, 0.0], [after, 1.0, 2.0, 3.0],
            [3.4028234663852886e38, 1.0, -1e38, 0.0], [tiny, tiny / 2, 0.0, 0.0], [1.0, NAN, 2.0, 3.0],
            [INF, 1.0, 0.0, 0.0], [-INF, 1.0, 0.0, 0.0], [5.0, 2.0, -1.0, 0.5]]
    t = torch.tensor(rows, dtype=torch.float32)
    for pow2_scales in (False, True):
        values, scales = quantize_fp8_torch(t, (1, 0), pow2_scales=pow2_scales)
        assert_quantized_as_reference(t, (1, 0), pow2_scales, values, scales)
        scales = scales[:, 0].tolist()
        assert scales[0] == 1.0 and values[0].view(torch.uint8).tolist() == [0, 0x80, 0, 0]  # zero block: scale 1
        assert scales[3] == (2.0 ** -149 if pow2_scales else 1.0)  # 1e-44 / 448 underflows to 0: scale 1
        assert scales[4] == 1.0 and values[4].float().tolist() == [448.0, 1.0, 1.25, 0.0]  # ties to even codes
        assert scales[5] == 0.125  # amax exactly 448 * 2**-3
        assert scales[6] == (2.0 ** -2 if pow2_scales else np.float32(after) / np.float32(448.0))
        assert all(math.isnan(s) for s in scales[9:12]) and not values[9:12].view(torch.uint8).any()
        dequantized = dequantize_fp8_torch(values, torch.tensor(scales)[:, None], (1, 0))
        assert dequantized[9:12].isnan().all() and dequantized[12:].isfinite().all()
        # (448 times the scale of the largest float32, rounded up, is past float32's range in float32 arithmetic)
        assert dequantized[:9].isfinite().all() or dequantized[:9].isinf().nonzero().tolist() == [[7, 0]]


def test_pow2_scales_are_the_smallest_powers_of_two_at_least_amax_over_448():
    # amax over float32's whole range, subnormals included, one per row
    exponents = torch.randint(-160, 128, (400, 1)).double()
    mantissas = 1 + torch.rand(400, 1, dtype=torch.float64)
    amax = (mantissas * 2.0 ** exponents).clamp(max=3.4e38).float()
    amax[:20, 0] = torch.tensor([448 * 2.0 ** e for e in range(-10, 10)]).float()  # boundaries
    t = torch.cat([amax, -amax / 3, torch.zeros_like(amax)], dim=1)
    _, scales = quantize_fp8_torch(t, (1, 0), pow2_scales=True)
    keep = amax[:, 0] > 0
    scale, amax64 = scales[keep, 0].double(), amax[keep, 0].double()
    mantissa, _ = torch.frexp(scale)
    assert (mantissa == 0.5).all()                      # powers of two
    assert (scale * FP8_E4M3_MAX >= amax64).all()        # nothing saturates
    assert ((scale / 2 * FP8_E4M3_MAX < amax64) | (scale == 2.0 ** -149)).all()  # the smallest such
    expected = torch.tensor([_pow2_reference(a) for a in amax64.tolist()], dtype=torch.float64)
    assert torch.equal(scale, expected)
    assert (scales[:20, 0] == torch.tensor([2.0 ** e for e in range(-10, 10)])).all()


def test_quantize_fp8_torch_in_slabs_equals_in_one_go(monkeypatch):
    t = spread((5, 3, 140, 130), "cpu")
    whole = quantize_fp8_torch(t, (128, 128))
    monkeypatch.setattr(fp8_blocks, "QUANTIZE_SLAB", 140 * 130 * 2)  # two matrices at a time, the last slab short
    slabs = quantize_fp8_torch(t, (128, 128))
    assert torch.equal(slabs[0].view(torch.uint8), whole[0].view(torch.uint8)) and torch.equal(slabs[1], whole[1])
    assert_quantized_as_reference(t, (128, 128), False, *slabs)


def test_dequantize_fp8_torch_checks_its_arguments():
    values, scales = quantize_fp8_torch(torch.randn(4, 300), (1, 128))
    with pytest.raises(ogsgen.SpecError, match=r"scales of values \(4, 300\) in blocks of \(1, 128\) must have "
                                               r"shape \(4, 3\), got \(4, 2\)"):
        dequantize_fp8_torch(values, scales[:, :2], (1, 128))
    with pytest.raises(ogsgen.SpecError, match="values must be torch.float8_e4m3fn and scales float32"):
        dequantize_fp8_torch(values.float(), scales, (1, 128))
    with pytest.raises(ogsgen.SpecError, match="block must be a pair"):
        dequantize_fp8_torch(values, scales, 128)


@pytest.mark.parametrize("block", [(1,), (1, -1), (1.0, 128), (True, 128), "1x128", None])
def test_bad_blocks_are_refused(block, device):
    for quantize in (quantize_fp8_torch, quantize_fp8):
        with pytest.raises(ogsgen.SpecError, match=r"block must be a pair \(rows, columns\) of non-negative ints"):
            quantize(torch.randn(4, 8, device=device), block)


def test_bad_inputs_are_refused(device):
    with pytest.raises(ogsgen.SpecTypeError, match="t must be a torch.Tensor, got list"):
        quantize_fp8_torch([[1.0]], (1, 128))
    with pytest.raises(ogsgen.SpecError, match="t must be a float tensor, got torch.int32"):
        quantize_fp8_torch(torch.ones(4, 8, dtype=torch.int32), (1, 128))
    with pytest.raises(ogsgen.SpecError, match=r"t must have at least 2 dimensions \(..., rows, columns\)"):
        quantize_fp8_torch(torch.ones(8), (1, 128))
    with pytest.raises(ogsgen.SpecError, match=r"x must be 2-D \(M, K\), got shape \(2, 4, 8\)"):
        quantize_fp8(torch.ones(2, 4, 8, device=device), (1, 128))
    with pytest.raises(ogsgen.SpecError, match="x has dtype torch.float64; quantize_fp8 takes bfloat16, float16"):
        quantize_fp8(torch.ones(4, 8, dtype=torch.float64, device=device), (1, 128))
    with pytest.raises(ogsgen.SpecError, match="x is on meta; ogsgen's kernels run on"):
        quantize_fp8(torch.ones(4, 8, device="meta"), (1, 128))


# ---------------------------------------------------------------- the Triton quantizer

@pytest.mark.parametrize("block", [(1, 128), (1, 0)])
@pytest.mark.parametrize("pow2_scales", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m,k", [(19, 300), (5, 64), (33, 256), (0, 128), (3, 0)])
def test_quantize_fp8_equals_torch_bit_for_bit(m, k, dtype, pow2_scales, block, device):
    x = spread((m, k), device, dtype)
    if m > 4 and k > 4:  # a zero row, a row of tiny values (subnormal in float32), a NaN and an infinity
        x[1] = 0.0
        x[2] = (torch.randn(k, device=device) * 1e-39).to(dtype) if dtype != torch.float16 else 6e-8
        x[3, k // 2], x[4, 1] = NAN, -INF
    values, scales = quantize_fp8(x, block, pow2_scales=pow2_scales)
    v_ref, s_ref = quantize_fp8_torch(x, block, pow2_scales=pow2_scales)
    assert values.shape == x.shape and scales.shape == s_ref.shape and scales.is_contiguous()
    assert torch.equal(values.view(torch.uint8), v_ref.view(torch.uint8))
    assert torch.equal(scales.nan_to_num(-1.0), s_ref.nan_to_num(-1.0))
    assert_quantized_as_reference(x, block, pow2_scales, values, scales)


def test_quantize_fp8_divides_as_ieee_at_every_scale_magnitude(device):
    """The device quantizer's division (as IEEE's, round to nearest) against torch's: the same bits for blocks whose
    amax spans float32's exponents, subnormal scales and scales whose significand is all ones included. (A division
    by one reciprocal per block with Markstein's correction, written with Triton's operations, passed this through
    the interpreter and failed it on an H100, 2026-12-07: bench/NOTES.md 5.1.)"""
    generator = torch.Generator().manual_seed(7)
    magnitudes = torch.tensor([2.0 ** e for e in range(-149, 121, 3)], dtype=torch.float64)
    x = torch.randn(len(magnitudes), 128, generator=generator, dtype=torch.float64) * magnitudes[:, None]
    all_ones = torch.tensor([0x3FFFFFFF, 0x1BFFFFFF, 0x5AFFFFFF], dtype=torch.int32).view(torch.float32) * 448
    x[:3, 0] = all_ones.double()  # amax / 448 of these rows: significands of all ones
    x[:3, 1:] = x[:3, 1:].clamp(-1, 1) * all_ones[:, None].double()
    x = x.float().to(device)
    values, scales = quantize_fp8(x, (1, 128))
    v_ref, s_ref = quantize_fp8_torch(x, (1, 128))
    assert torch.equal(scales, s_ref) and (s_ref < 2.0 ** -96).any() and (s_ref > 2.0 ** 100).any()
    assert torch.equal(values.view(torch.uint8), v_ref.view(torch.uint8))


def test_quantize_fp8_keeps_the_sign_of_zeros(device):
    """-0.0 (and values whose quotient rounds to a zero) quantize to e4m3's -0 (code 0x80), as torch's division and
    cast give. (Triton 3.6 compiles a float's unary minus as 0 - x, which makes -(+0) a +0: a division written with
    negations lost -0's sign on an H100 and in Triton 3.6's interpreter, 2026-12-07.)"""
    x = torch.tensor([[-0.0, 0.0, -1e-30, 1e-30, -3.0, 2.0, -0.0, 448.0 * 2.0 ** -20]], device=device).repeat(2, 16)
    x[1] *= 2.0 ** -100  # scales under the division's lift, where its operands are lifted first
    values, scales = quantize_fp8(x, (1, 128))
    v_ref, s_ref = quantize_fp8_torch(x, (1, 128))
    assert torch.equal(scales, s_ref)
    assert torch.equal(values.view(torch.uint8), v_ref.view(torch.uint8))
    assert (values.view(torch.uint8)[:, 0] == 0x80).all() and (values.view(torch.uint8)[:, 1] == 0).all()


@triton.jit
def _upcast(X, Out, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(Out + i, tl.load(X + i).to(tl.float32))


def test_bf16_subnormals_upcast_exactly(device):
    # bf16 activations below 2**-126 (float32's subnormals) read as their values (Triton's interpreter made them
    # other values, 1e-39 as 4.4e-39; ogsgen.numerics.interpreter corrects it), so that their block's scale is right.
    x = torch.tensor([1e-39, -2e-39, 5e-40, 1e-40, -9.2e-41, 1.2e-38, 1.0, 0.0], device=device).bfloat16()
    out = torch.empty(8, device=device)
    _upcast[(1,)](x, out, N=8)
    assert torch.equal(out, x.float())


@pytest.mark.parametrize("block", [(1, 128), (1, 0)])
def test_quantize_fp8_reads_strided_x_in_place(block, device):
    base = spread((40, 600), device, torch.bfloat16)
    for x in (base[3:20, 5:305], base.mT[7:207, 1:18], base[::3, ::2]):  # a row stride; a column stride too
        values, scales = quantize_fp8(x, block, pow2_scales=block == (1, 0))
        v_ref, s_ref = quantize_fp8_torch(x.contiguous(), block, pow2_scales=block == (1, 0))
        assert torch.equal(values.view(torch.uint8), v_ref.view(torch.uint8)) and torch.equal(scales, s_ref)


def test_quantize_fp8_other_blocks_run_the_torch_reference(device):
    x = spread((20, 70), device)
    values, scales = quantize_fp8(x, (16, 32))
    assert_quantized_as_reference(x, (16, 32), False, values, scales)


hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(m=st.integers(0, 9), k=st.integers(0, 300), block=st.sampled_from([(1, 128), (1, 0)]), pow2=st.booleans(),
       log_magnitude=st.integers(-140, 120), seed=st.integers(0, 2**31 - 1), specials=st.integers(0, 3))
def test_quantize_fp8_property(m, k, block, pow2, log_magnitude, seed, specials, device):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn((m, k), generator=generator, dtype=torch.float64) * 2.0 ** log_magnitude
    if m * k:
        x.view(-1)[torch.randint(m * k, (specials,), generator=generator)] = torch.tensor([NAN, INF, 0.0])[
            torch.randint(3, (specials,), generator=generator)].double()
    x = x.float().to(device)
    values, scales = quantize_fp8(x, block, pow2_scales=pow2)
    assert_quantized_as_reference(x, block, pow2, values, scales)


# ---------------------------------------------------------------- expert weights

FORMAT_BLOCKS = {"fp8e4m3_b128": (FP8_BLOCK, FP8_BLOCK), "fp8e4m3_channel": (1, 0)}


def expanded_scales(scales_out_in, n):
    """b128 scales (E, cdiv(N, 128), cdiv(K, 128)) -> one per column (E, N, cdiv(K, 128)); channel's as they are."""
    return scales_out_in.repeat_interleave(FP8_BLOCK, dim=1)[:, :n] if scales_out_in.shape[1] != n else scales_out_in


def check_prepared(prepared, codes, scales, bias, format, gate_up):
    """prepared against the checkpoint's codes (E, N, K) and scales (E, out blocks, in blocks), in float64."""
    n_expts, n, k = codes.shape
    block = FORMAT_BLOCKS[format]
    assert prepared.w.dtype == torch.float8_e4m3fn and prepared.w.shape == (n_expts, k, n)
    assert prepared.w.stride(-2) == 1  # K-contiguous
    checkpoint = reference_dequantize(codes, scales, block)  # (E, N, K)
    if gate_up == "concatenated":
        moved_codes, moved = _interleave(codes, 1), _interleave(checkpoint, 1)
        assert prepared.weight_scale.shape == (n_expts, scales.shape[2], n)  # b128's: one scale per column
        assert torch.equal(prepared.weight_scale.mT.cpu(), _interleave(expanded_scales(scales, n), 1).cpu())
        assert torch.equal(prepared.bias.cpu(), _interleave(bias, -1).float().cpu())
    else:
        moved_codes, moved = codes, checkpoint
        assert prepared.weight_scale.shape == (n_expts, scales.shape[2], scales.shape[1])
        assert torch.equal(prepared.weight_scale.mT.cpu(), scales.cpu())
    assert prepared.weight_scale.dtype == torch.float32
    assert torch.equal(prepared.w.mT.view(torch.uint8).cpu(), moved_codes.cpu())  # the checkpoint's values, moved
    assert torch.equal(prepared.dequantize().cpu(), moved.mT.float())             # what the kernel computes with
    back = prepared.dequantize(checkpoint_order=True).cpu()
    assert torch.equal(back, (checkpoint if prepared.layout == "out_in" else checkpoint.mT).float())
    assert prepared.precision_config().weight_scale is prepared.weight_scale


@pytest.mark.parametrize("format", list(FORMAT_BLOCKS))
@pytest.mark.parametrize("layout", ["out_in", "in_out"])
@pytest.mark.parametrize("gate_up", [None, "concatenated", "interleaved"])
def test_prepare_from_float_weights(format, layout, gate_up, device):
    n_expts, n, k = 2, 320, 200  # gate and up of 160: the interleaving splits blocks of 128 columns
    dense = spread((n_expts, n, k), device, torch.bfloat16)    # (E, out, in)
    bias = torch.randn(n_expts, n, device=device)
    weight = dense if layout == "out_in" else dense.mT.contiguous()
    prepared = ogsgen.prepare_expert_weights(weight, bias, layout=layout, gate_up=gate_up, format=format)
    codes, scales = reference_quantize(dense, FORMAT_BLOCKS[format])   # the checkpoint's own blocks of (out, in)
    check_prepared(prepared, codes, scales, bias.cpu(), format, gate_up)


def test_prepare_b128_with_pow2_scales(device):
    dense = spread((2, 256, 384), device)
    prepared = ogsgen.prepare_expert_weights(dense, format="fp8e4m3_b128", pow2_scales=True)
    codes, scales = reference_quantize(dense, (FP8_BLOCK, FP8_BLOCK), pow2_scales=True)
    check_prepared(prepared, codes, scales, None, "fp8e4m3_b128", None)
    assert (torch.frexp(prepared.weight_scale)[0] == 0.5).all()


def _checkpoint(format, n_expts, n, k, device):
    """An e4m3 checkpoint (E, out, in) and its scales (E, out blocks, in blocks)."""
    values, scales = quantize_fp8_torch(spread((n_expts, n, k), device), FORMAT_BLOCKS[format])
    return values, scales


@pytest.mark.parametrize("format,scale_shape", [("fp8e4m3_b128", "blocks"), ("fp8e4m3_channel", "(E, N)"),
                                                ("fp8e4m3_channel", "(E, N, 1)")])
def test_prepare_an_out_in_checkpoint_copies_nothing(format, scale_shape, device):
    values, scales = _checkpoint(format, 3, 200, 300, device)
    given = scales[..., 0] if scale_shape == "(E, N)" else scales
    prepared = ogsgen.prepare_expert_weights(values, format=format, weight_scale=given, gate_up="interleaved")
    assert prepared.w.data_ptr() == values.data_ptr() and prepared.w.shape == (3, 300, 200)
    assert prepared.weight_scale.data_ptr() == given.data_ptr()
    assert prepared.weight_scale.shape == ((3, 3, 2) if format == "fp8e4m3_b128" else (3, 1, 200))
    check_prepared(prepared, values.view(torch.uint8), scales, None, format, "interleaved")


@pytest.mark.parametrize("format", list(FORMAT_BLOCKS))
@pytest.mark.parametrize("layout", ["out_in", "in_out"])
def test_prepare_a_concatenated_checkpoint_interleaves_values_and_scales(format, layout, device):
    values, scales = _checkpoint(format, 2, 384, 136, device)   # gate and up of 192 = 1.5 blocks
    bias = torch.randn(2, 384, device=device)
    weight = values if layout == "out_in" else values.mT.contiguous()
    given = scales if layout == "out_in" else scales.mT.contiguous()   # channel: (E, N, 1) / (E, 1, N)
    prepared = ogsgen.prepare_expert_weights(weight, bias, layout=layout, gate_up="concatenated", format=format,
                                             weight_scale=given)
    check_prepared(prepared, values.view(torch.uint8), scales, bias.cpu(), format, "concatenated")
    if format == "fp8e4m3_b128":
        assert prepared.weight_scale.shape == (2, 2, 384)  # one scale per column: the kernel's N-granularity 1


@pytest.mark.parametrize("format", list(FORMAT_BLOCKS))
def test_prepare_an_in_out_checkpoint(format, device):
    values, scales = _checkpoint(format, 2, 200, 260, device)
    given = scales.mT.contiguous() if format == "fp8e4m3_b128" else scales[..., 0]   # (E, in blocks, out blocks)
    prepared = ogsgen.prepare_expert_weights(values.mT.contiguous(), layout="in_out", format=format,
                                             weight_scale=given)
    assert prepared.weight_scale.data_ptr() == given.data_ptr()  # scales are taken as they are; values made K-major
    check_prepared(prepared, values.view(torch.uint8), scales, None, format, None)


def test_prepare_refuses_bad_fp8_arguments(device):
    values, scales = _checkpoint("fp8e4m3_b128", 2, 200, 300, device)
    prepare = ogsgen.prepare_expert_weights
    cases = [
        (lambda: prepare(values, format="fp8e4m3_b128"), r"needs its checkpoint's float32 scales: pass weight_scale="),
        (lambda: prepare(values, format="fp8e4m3_b128", weight_scale=scales[:, :1]),
         r"weight_scale of format 'fp8e4m3_b128' for a 'out_in' weight \(2, 200, 300\) must have shape "
         r"\(2, 2, 3\), got \(2, 1, 3\)"),
        (lambda: prepare(values, format="fp8e4m3_b128", layout="in_out", weight_scale=scales.mT),
         r"for a 'in_out' weight \(2, 200, 300\) must have shape \(2, 2, 3\), got \(2, 3, 2\)"),
        (lambda: prepare(values, format="fp8e4m3_channel", weight_scale=scales),
         r"must have shape \(2, 200\) or \(2, 200, 1\), got \(2, 2, 3\)"),
        (lambda: prepare(values, format="fp8e4m3_b128", weight_scale=scales.bfloat16()),
         r"weight_scale must be a float32 tensor, got torch.bfloat16; convert it with .float\(\)"),
        (lambda: prepare(values, format="fp8e4m3_b128", weight_scale=scales.to("meta")),
         r"weight_scale is on meta but weight is on"),
        (lambda: prepare(values.float(), format="fp8e4m3_b128", weight_scale=scales),
         r"with weight_scale=, weight must be the checkpoint's torch.float8_e4m3fn values"),
        (lambda: prepare(values, format="mxfp8e4m3", weight_scale=scales),
         r"weight_scale= goes with an e4m3 checkpoint of format 'fp8e4m3_b128' or 'fp8e4m3_channel'"),
        (lambda: prepare(values, format="fp8e4m3_b128", weight_scale=scales, pow2_scales=True),
         r"a checkpoint's scales are taken as they are"),
        (lambda: prepare(values.float(), format="fp8e4m3_channel", pow2_scales=True),
         r"pow2_scales applies to format='fp8e4m3_b128', not 'fp8e4m3_channel'"),
        (lambda: prepare(values.float(), format="fp8e4m3_b128", pow2_scales=1), r"pow2_scales must be a bool"),
        (lambda: prepare(values[:, :199], format="fp8e4m3_b128", weight_scale=scales, gate_up="concatenated"),
         r"gate_up needs an even number of output features, got 199"),
        (lambda: prepare(values, torch.zeros(2, 300), format="fp8e4m3_b128", weight_scale=scales),
         r"bias must have shape \(E, out\) = \(2, 200\), got \(2, 300\)"),
    ]
    for call, message in cases:
        with pytest.raises(ogsgen.SpecError, match=message):
            call()
