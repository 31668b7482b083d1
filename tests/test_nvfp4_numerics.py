"""NVFP4 (ogsgen.numerics.nvfp4) against an independent reference: the 16 e2m1 values from a table written here, e4m3
block scales read by torch's float8_e4m3fn -> float64 conversion, products in float64; the quantization rule
(ModelOpt's) re-derived with nearest-value searches over those tables; the Triton upcast bit for bit."""
import numpy as np
import pytest
import torch

import triton
import triton.language as tl

from ogsgen.errors import SpecError, SpecTypeError
from ogsgen.numerics.jit import E2M1_BYTES_TO_BF16X2
from ogsgen.numerics.nvfp4 import dequantize_nvfp4, quantize_nvfp4, upcast_nvfp4_rows
from test_ptx_upcast import run_ptx

NAN, INF = float("nan"), float("inf")
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]  # code -> value
E4M3 = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).double()                      # bits -> value


def reference_values(codes: torch.Tensor) -> torch.Tensor:
    """uint8 bytes (..., K // 2) -> their e2m1 values (..., K) in float64, value 2i from byte i's low nibble."""
    table = torch.tensor(E2M1, dtype=torch.float64)
    nibbles = torch.empty((*codes.shape[:-1], codes.shape[-1] * 2), dtype=torch.long)
    nibbles[..., 0::2] = (codes % 16).long()
    nibbles[..., 1::2] = (codes // 16).long()
    return table[nibbles]


def reference_dequantize(codes, block_scales, global_scale) -> torch.Tensor:
    """float64 e2m1 * e4m3 * global scale (exact in float64: 5 + 24 significant bits), rounded once to float32."""
    scales = E4M3[block_scales.view(torch.uint8).long()].repeat_interleave(16, dim=-1)
    g = global_scale.double()
    g = g.reshape(-1, *[1] * (codes.ndim - 1)) if g.ndim == 1 and g.numel() > 1 else g.reshape(())
    return (reference_values(codes) * scales * g).float()


def assert_same_floats(actual: torch.Tensor, expected: torch.Tensor):
    """Bit for bit (the sign of zero included), NaN where NaN (of any payload)."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    nan = torch.isnan(expected)
    assert torch.equal(torch.isnan(actual), nan)
    bits = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[actual.dtype]
    assert torch.equal(actual[~nan].view(bits), expected[~nan].view(bits))


# ---------------------------------------------------------------- dequantize


def every_byte_and_scale(rows: int = 16):
    """(codes, block_scales): every byte (16 x 16 code pairs) in each row, shuffled; every e4m3 bit pattern twice."""
    codes = torch.stack([torch.randperm(256) for _ in range(rows)]).to(torch.uint8)     # K = 512: 32 blocks a row
    scales = torch.randperm(rows * 32).remainder(256).to(torch.uint8).reshape(rows, 32)
    return codes, scales.view(torch.float8_e4m3fn)


@pytest.mark.parametrize("global_scale", [1.0, 1 / 2688, 3.7e-3, 2.0 ** -120, 1.5e-45, 7.1e35, 0.0, -2.5])
def test_dequantize_every_code_times_every_scale(global_scale):
    # Global scales whose products are normal, subnormal (2**-120, 1.5e-45: e2m1 * e4m3 down to 2**-10 of them),
    # past float32's range (7.1e35 * 2688: inf), zero and negative (the formula as it stands).
    codes, scales = every_byte_and_scale()
    g = torch.tensor(global_scale, dtype=torch.float32)
    out = dequantize_nvfp4(codes, scales, g)
    assert out.shape == (16, 512) and out.dtype == torch.float32
    assert_same_floats(out, reference_dequantize(codes, scales, g))


def test_dequantize_per_expert_global_scales_and_leading_dims():
    codes, scales = every_byte_and_scale(rows=12)
    codes, scales = codes.reshape(3, 2, 2, 256), scales.reshape(3, 2, 2, 32)
    g = torch.tensor([0.25, 3.0e-3, 1.7e-6], dtype=torch.float32)
    out = dequantize_nvfp4(codes, scales, g)
    assert out.shape == (3, 2, 2, 512)
    assert_same_floats(out, reference_dequantize(codes, scales, g))
    for e in range(3):  # each expert by its own scalar
        assert_same_floats(out[e], dequantize_nvfp4(codes[e], scales[e], g[e]))
    # a (1,) global scale is a per-tensor one
    assert_same_floats(dequantize_nvfp4(codes, scales, g[:1]), reference_dequantize(codes, scales, g[0]))


def test_dequantize_hand_computed():
    # bytes 0x71: low nibble 1 (0.5) first, then 7 (6); 0xF8: -0 then -6; scales 2 (0x40), 2**-9 (0x01), NaN
    codes = torch.tensor([[0x71, 0xF8] + [0x00] * 6 + [0x2A] + [0x00] * 7], dtype=torch.uint8)     # K = 32
    out = dequantize_nvfp4(codes, torch.tensor([[0x40, 0x01]], dtype=torch.uint8).view(torch.float8_e4m3fn),
                           torch.tensor(0.5))
    assert out[0, :4].tolist() == [0.5, 6.0, -0.0, -6.0] and str(out[0, 2].item()) == "-0.0"
    assert out[0, 16:18].tolist() == [-1.0 * 2 ** -10, 1.0 * 2 ** -10]                      # 0x2A: -1, then 1
    nan_scale = torch.tensor([[0x7F, 0xFF]], dtype=torch.uint8).view(torch.float8_e4m3fn)
    assert torch.isnan(dequantize_nvfp4(codes, nan_scale, torch.tensor(1.0))).all()


# ---------------------------------------------------------------- quantize


def nearest_e2m1_codes(y: np.ndarray) -> np.ndarray:
    """float32 values -> e2m1 codes: the nearest of the 8 magnitudes (ties to the even code), saturating at 6; the
    sign bit for negative values (not for -0.0)."""
    table = np.array(E2M1[:8])
    distance = np.abs(np.abs(y.astype(np.float64))[..., None] - table)
    best = distance.min(axis=-1, keepdims=True)
    candidates = np.where(distance == best, np.arange(8), 99)
    even = np.where(candidates % 2 == 0, candidates, 99).min(axis=-1)
    magnitude = np.where(even < 99, even, candidates.min(axis=-1))
    return (magnitude | ((y < 0) << 3)).astype(np.uint8)


def nearest_e4m3_bits(q: np.ndarray) -> np.ndarray:
    """Positive float32 values in [2**-9, 448] -> the bits of the nearest e4m3 value, ties to the even code."""
    table = E4M3[:127].numpy()
    distance = np.abs(q.astype(np.float64)[..., None] - table)
    best = distance.min(axis=-1, keepdims=True)
    candidates = np.where(distance == best, np.arange(127), 999)
    even = np.where(candidates % 2 == 0, candidates, 999).min(axis=-1)
    return np.where(even < 999, even, candidates.min(axis=-1)).astype(np.uint8)


def reference_quantize(w: torch.Tensor, per_expert: bool = False):
    """ModelOpt's rule for finite weights, in numpy float32 and the searches above: (codes, scale bits, g)."""
    x = w.float().numpy()
    amax = np.abs(x.reshape(x.shape[0], -1) if per_expert else x.reshape(1, -1)).max(axis=1)
    g = (amax / np.float32(2688)).astype(np.float32)
    g = np.where(g > 0, g, np.float32(1)).reshape(-1, *[1] * (x.ndim - 1)) if per_expert else np.float32(
        g[0] if g[0] > 0 else 1)
    blocks = x.reshape(*x.shape[:-1], -1, 16)
    q = (np.abs(blocks).max(axis=-1) / (np.float32(6) * g)).astype(np.float32)
    q = np.clip(np.where(q == 0, np.float32(1), q), np.float32(2.0 ** -9), np.float32(448))
    bits = nearest_e4m3_bits(q)
    s = E4M3[torch.from_numpy(bits).long()].float().numpy()
    y = (blocks / (s * g)[..., None]).astype(np.float32)
    nibbles = nearest_e2m1_codes(y).reshape(x.shape)
    codes = nibbles[..., 0::2] | (nibbles[..., 1::2] << 4)
    return torch.from_numpy(codes), torch.from_numpy(bits), torch.from_numpy(np.asarray(g, np.float32)).flatten()


def spread(shape, dtype=torch.float32):
    """Random weights whose magnitudes vary by row and by block: blocks with very different scales."""
    w = torch.randn(shape) * torch.exp(2 * torch.randn((*shape[:-1], 1)))
    return (w * torch.exp(torch.randn((*shape[:-1], shape[-1] // 16, 1))).repeat_interleave(16, -1)
            .flatten(-2)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("per_expert", [False, True])
def test_quantize_follows_modelopts_rule_and_round_trips_within_half_a_step(dtype, per_expert):
    w = spread((3, 8, 64), dtype)
    w[1, 2, :16] = 0.0  # a zero block: scale 1.0, codes 0
    codes, scales, g = quantize_nvfp4(w, per_expert=per_expert)
    assert codes.dtype == torch.uint8 and codes.shape == (3, 8, 32)
    assert scales.dtype == torch.float8_e4m3fn and scales.shape == (3, 8, 4)
    assert g.dtype == torch.float32 and g.shape == ((3,) if per_expert else ())
    codes_ref, bits_ref, g_ref = reference_quantize(w, per_expert)
    assert torch.equal(g.flatten(), g_ref)
    assert torch.equal(scales.view(torch.uint8), bits_ref)
    assert torch.equal(codes, codes_ref)
    assert scales[1, 2, 0].item() == 1.0 and (codes[1, 2, :8] == 0).all()
    # Each value within half a step of the e2m1 grid where it falls, in units of its block's s * g (float64); past 6
    # (a block scale rounded down) by what it exceeds 6 * s * g; plus float32's roundings (of y, and of the result).
    back = dequantize_nvfp4(codes, scales, g).double()
    unit = (scales.double().repeat_interleave(16, -1) * (g.double().reshape(3, 1, 1) if per_expert else g.double()))
    y = w.double().abs() / unit
    half_step = torch.where(y <= 2, 0.25, torch.where(y <= 4, 0.5, torch.where(y <= 6, 1.0, y - 6)))
    assert ((back - w.double()).abs() <= (half_step + 2.0 ** -18) * unit).all()
    assert (y <= 6.4).all()  # (a rounded block scale is at most 1/16 below block amax / 6g: little saturates)


def test_quantize_hand_computed_blocks():
    # The value 2688 makes the global scale 2688 / 2688 = 1 exactly, so that each block's scale is e4m3(amax / 6).
    w = torch.zeros(6, 32)
    w[0, 0] = 2688.0                                           # scale 448, code 7 (6 * 448)
    w[1, :16] = torch.tensor([6, 3, -1.5, 0.5, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -5.5, 4, -0.1, -0.0, 1])
    w[2, :4] = torch.tensor([3.0, 1.25, 0.375, -0.125])        # amax 3: scale 0.5, then 6, 2.5, 0.75, -0.25
    w[3, :2] = torch.tensor([7.0, -3.0])                       # 7 / 6 = 1.1667: scale 1.125; 7 / 1.125 = 6.2 -> 6
    w[4, :2] = torch.tensor([1e-4, -2e-3])                     # amax / 6 < 2**-9: scale 2**-9; 1e-4 -> 0
    w[5, 16:] = 0.0                                            # zero blocks: scale 1, codes 0
    codes, scales, g = quantize_nvfp4(w)
    assert g.item() == 1.0
    assert scales.float().tolist() == [[448.0, 1.0], [1.0, 1.0], [0.5, 1.0], [1.125, 1.0], [2.0 ** -9, 1.0],
                                       [1.0, 1.0]]
    nibbles = torch.stack([codes & 15, codes >> 4], -1).flatten(-2)
    assert nibbles[0, :2].tolist() == [7, 0]
    # 6->6, 3->3, -1.5, 0.5, 0.25->0 (tie, even), 0.75->1 (tie, even), 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4,
    # -5.5->-6, 4, -0.1->-0 (code 8), -0.0->+0 (code 0), 1
    assert nibbles[1, :16].tolist() == [7, 5, 11, 1, 0, 2, 2, 4, 4, 6, 6, 15, 6, 8, 0, 2]
    assert nibbles[2, :4].tolist() == [7, 4, 2, 8]            # 6, 2.5 -> 2, 0.75 -> 1, -0.25 -> -0
    assert nibbles[3, :2].tolist() == [7, 13]                 # 6 (saturated: 6.75 for 7), -3 / 1.125 = -2.67 -> -3
    assert nibbles[4, :2].tolist() == [0, 10]                 # 1e-4 / 2**-9 = 0.05 -> 0; -2e-3 / 2**-9 = -1.02 -> -1
    assert (nibbles[:, 16:] == 0).all() and (nibbles[5] == 0).all()
    assert dequantize_nvfp4(codes, scales, g)[3, 0].item() == 6.75


def test_quantize_global_scales_given_zero_experts_and_saturation():
    w = torch.zeros(3, 2, 32)
    w[0, 0, 0], w[1, 1, 5] = 2688.0, -1344.0                  # expert amax 2688 -> g 1, 1344 -> g 0.5; expert 2 zero
    codes, scales, g = quantize_nvfp4(w, per_expert=True)
    assert g.tolist() == [1.0, 0.5, 1.0]
    assert scales[:, :, 0].float().tolist() == [[448.0, 1.0], [1.0, 448.0], [1.0, 1.0]]
    assert (dequantize_nvfp4(codes, scales, g) == w).all()
    # A given global scale is kept; below amax / 2688 the block scale saturates at 448 and the values at +-6.
    codes, scales, g = quantize_nvfp4(w, torch.tensor(0.25))
    assert g.item() == 0.25 and scales[0, 0, 0].float().item() == 448.0
    assert dequantize_nvfp4(codes, scales, g)[0, 0, 0].item() == 6 * 448 * 0.25
    # An all-zero tensor: global scale 1 (ModelOpt's 0 / 0 would give NaN block scales), block scales 1, codes 0.
    codes, scales, g = quantize_nvfp4(torch.zeros(2, 64, dtype=torch.bfloat16))
    assert g.item() == 1.0 and (scales.float() == 1.0).all() and (codes == 0).all()


def test_quantize_nonfinite_blocks_are_nan_and_left_out_of_the_global_amax():
    w = torch.zeros(2, 64)
    w[0, 3], w[0, 20], w[1, 40], w[1, 0] = NAN, INF, -INF, 2688.0
    codes, scales, g = quantize_nvfp4(w)
    assert g.item() == 1.0
    assert scales.view(torch.uint8).tolist() == [[0x7F, 0x7F, 0x38, 0x38], [0x7E, 0x38, 0x7F, 0x38]]
    nibbles = torch.stack([codes & 15, codes >> 4], -1).flatten(-2)
    assert (nibbles[0, :32] == 0).all() and (nibbles[1, 32:48] == 0).all()
    back = dequantize_nvfp4(codes, scales, g)
    assert torch.isnan(back[0, :32]).all() and torch.isnan(back[1, 32:48]).all() and back[1, 0].item() == 2688.0


# ---------------------------------------------------------------- the Triton upcast


@triton.jit
def _upcast_tile(Values, Scales, Out, ROWS: tl.constexpr, K: tl.constexpr):
    rows = tl.arange(0, ROWS)
    values = tl.load(Values + rows[:, None] * (K // 2) + tl.arange(0, K // 2)[None, :])
    scales = tl.load(Scales + rows[:, None] * (K // 16) + tl.arange(0, K // 16)[None, :])
    out = upcast_nvfp4_rows(values, scales, "e2m1", Out.dtype.element_ty)
    tl.store(Out + rows[:, None] * K + tl.arange(0, K)[None, :], out)


@pytest.mark.parametrize("out_dtype,scale_bits", [(torch.bfloat16, False), (torch.bfloat16, True),
                                                  (torch.float32, False), (torch.float16, True)])
def test_triton_upcast_is_dequantize_bit_for_bit(device, out_dtype, scale_bits):
    # A 64 x 64 tile: every byte 8 times, every e4m3 bit pattern once (subnormals, 0, -0, 448, NaN 0x7F and 0xFF;
    # negative ones too, which checkpoints do not hold), as float8 or as their uint8 bits.
    codes = torch.randperm(64 * 32).remainder(256).to(torch.uint8).reshape(64, 32)
    scales = torch.randperm(256).to(torch.uint8).reshape(64, 4)
    out = torch.empty(64, 64, dtype=out_dtype, device=device)
    _upcast_tile[(1,)](codes.to(device), (scales if scale_bits else scales.view(torch.float8_e4m3fn)).to(device),
                       out, ROWS=64, K=64)
    expected = dequantize_nvfp4(codes, scales.view(torch.float8_e4m3fn), torch.tensor(1.0))
    assert_same_floats(out.cpu(), expected.to(out_dtype))   # (e2m1 * e4m3: exact in each dtype)
    assert_same_floats(expected, reference_dequantize(codes, scales, torch.tensor(1.0)))


def test_the_packed_bf16_ptx_is_exact_with_e4m3_factors():
    # On a GPU the bf16 upcast runs mxfp4's packed PTX (E2M1_BYTES_TO_BF16X2, which the interpreter runs by its
    # definition) with the e4m3 scales as bf16 factors, most of them not powers of two. Emulated instruction by
    # instruction (tests/test_ptx_upcast.py): every byte, in each of a register's 4 positions, times every e4m3 bit
    # pattern gives the exact product, NaN for the NaN scales.
    first, scale = (a.ravel().astype(np.uint64) for a in np.meshgrid(np.arange(256), np.arange(256), indexing="ij"))
    data = [(first + np.uint64(j)) % np.uint64(256) for j in range(4)]
    word = data[0] | (data[1] << np.uint64(8)) | (data[2] << np.uint64(16)) | (data[3] << np.uint64(24))
    bf16 = torch.from_numpy(scale.astype(np.uint8)).view(torch.float8_e4m3fn).to(torch.bfloat16)
    factor = bf16.view(torch.int16).numpy().astype(np.uint16).astype(np.uint64)
    out = run_ptx(E2M1_BYTES_TO_BF16X2.value, {"$4": word, "$5": factor | (factor << np.uint64(16)),
                                                "$6": factor | (factor << np.uint64(16))})
    table = np.array(E2M1)
    for register, shift, pair in (("$0", 0, (0, 1)), ("$1", 0, (2, 3)), ("$2", 4, (0, 1)), ("$3", 4, (2, 3))):
        for lane, byte in enumerate(pair):
            got = ((out[register] >> np.uint64(16 * lane)) & np.uint64(0xFFFF)).astype(np.uint16)
            want = torch.from_numpy(table[((data[byte] >> np.uint64(shift)) & np.uint64(15)).astype(np.int64)]
                                    * E4M3[scale.astype(np.int64)].numpy()).to(torch.bfloat16)
            want = want.view(torch.int16).numpy().astype(np.uint16)
            nan = (want & 0x7FFF) > 0x7F80
            assert np.array_equal((got & 0x7FFF) > 0x7F80, nan) and np.array_equal(got[~nan], want[~nan])


# ---------------------------------------------------------------- bad inputs

CODES, SCALES, ONE = torch.zeros(2, 16, dtype=torch.uint8), torch.ones(2, 2).to(torch.float8_e4m3fn), torch.tensor(1.)


@pytest.mark.parametrize("args,error,match", [
    ((CODES.view(torch.int8), SCALES, ONE), SpecError, r"codes must be torch.uint8.*codes.view\(torch.uint8\)"),
    ((CODES, SCALES.view(torch.uint8), ONE), SpecError,
     r"block_scales must be torch.float8_e4m3fn.*view\(torch.float8_e4m3fn\)"),
    ((CODES, SCALES, ONE.double()), SpecError, r"global_scale must be torch.float32.*weight_scale_2\) is float32: pass it .float\(\)"),
    ((CODES, SCALES, 1.0), SpecTypeError, "global_scale must be a torch.Tensor"),
    ((CODES.numpy(), SCALES, ONE), SpecTypeError, "codes must be a torch.Tensor"),
    ((CODES[:, :12], SCALES, ONE), SpecError, r"codes of shape \(2, 12\) has K = 24 .* multiple of 16 \(whole blocks\); pad K with zeros to 32"),
    ((CODES, SCALES[:, :1], ONE), SpecError, r"block_scales must have one scale per 16 values of K: shape \(2, 2\)"),
    ((CODES, SCALES, torch.tensor([1.0, 2.0, 3.0])), SpecError,
     r"global_scale must be a scalar .*\(shape \(2,\)\), got shape \(3,\)"),
    ((CODES, SCALES, torch.tensor(NAN)), SpecError, "global_scale holds NaN or infinity"),
    ((CODES, SCALES, torch.tensor([1.0, INF])), SpecError, "global_scale holds NaN or infinity"),
])
def test_dequantize_refuses_bad_inputs_naming_the_argument(args, error, match):
    with pytest.raises(error, match=match):
        dequantize_nvfp4(*args)


@pytest.mark.parametrize("args,kwargs,match", [
    ((torch.zeros(2, 32, dtype=torch.int32),), {}, "weight must be float32, bfloat16 or float16, got torch.int32"),
    ((torch.zeros(2, 40),), {}, r"weight of shape \(2, 40\) has K = 40 .* multiple of 16 \(whole blocks\); pad K .* to 48"),
    ((torch.zeros(2, 32), torch.tensor(0.0)), {}, "global_scale must be positive"),
    ((torch.zeros(2, 32), torch.tensor(INF)), {}, "global_scale holds NaN or infinity"),
    ((torch.zeros(2, 32), torch.tensor(1.0, dtype=torch.float16)), {}, "global_scale must be torch.float32"),
    ((torch.zeros(2, 32), torch.ones(2)), {"per_expert": True}, "per_expert=True .* but global_scale is given"),
    ((torch.zeros(32),), {"per_expert": True}, r"per_expert=True needs experts along dim 0 .* shape \(32,\)"),
])
def test_quantize_refuses_bad_inputs_naming_the_argument(args, kwargs, match):
    with pytest.raises(SpecError, match=match):
        quantize_nvfp4(*args, **kwargs)
