"""Triton helpers for scaled formats, called by generated kernels and by the quantization kernels.

They mirror ``ogsgen.numerics.mx`` operation by operation (integer scale choice, threshold-based
e2m1 rounding) so that both produce the same bits.
"""
import triton
import triton.language as tl


@triton.jit
def pow2_of_scale(code):
    """2 ** (code - 127) in float32 for e8m0 scale bytes (code 0 is 2 ** -127)."""
    code = code.to(tl.int32)
    value = (tl.minimum(tl.maximum(code, 1), 254) << 23).to(tl.float32, bitcast=True)
    return tl.where(code == 0, value * 0.5, value)


@triton.jit
def inverse_pow2_of_scale(code):
    """2 ** (127 - code) in float32 (the multiplier that undoes a scale), for codes 0..253."""
    return ((254 - code.to(tl.int32)) << 23).to(tl.float32, bitcast=True)


@triton.jit
def mx_scale_code(absmax, EMAX: tl.constexpr, MAX_MANTISSA: tl.constexpr, ROUND_UP: tl.constexpr):
    """e8m0 scale byte for blocks of float32 absmax (see ogsgen.numerics.mx.scale_codes)."""
    bits = absmax.to(tl.int32, bitcast=True)
    code = ((bits >> 23) & 0xFF) - EMAX
    if ROUND_UP:
        code += ((bits & 0x7FFFFF) > MAX_MANTISSA).to(tl.int32)
    return tl.where(absmax > 0, tl.minimum(tl.maximum(code, 0), 254), 0).to(tl.uint8)


@triton.jit
def encode_e2m1(values):
    """float32 -> e2m1 codes (uint8, sign in bit 3): nearest, ties to even, saturating at 6."""
    a = tl.abs(values)
    magnitude = ((a > 0.25).to(tl.int32) + (a >= 0.75).to(tl.int32) + (a > 1.25).to(tl.int32)
                 + (a >= 1.75).to(tl.int32) + (a > 2.5).to(tl.int32) + (a >= 3.5).to(tl.int32)
                 + (a > 5.0).to(tl.int32))
    sign = (values.to(tl.int32, bitcast=True) >> 31) & 1
    return (magnitude | (sign << 3)).to(tl.uint8)


@triton.jit
def decode_e2m1(codes):
    """e2m1 codes -> float32: exponent field 0 is 0 or 0.5, else 2**(e-1) * (1 + m/2)."""
    codes = codes.to(tl.int32)
    exponent = (codes >> 1) & 3
    mantissa = codes & 1
    normal = ((exponent + 126) << 23 | mantissa << 22).to(tl.float32, bitcast=True)
    magnitude = tl.where(exponent == 0, mantissa.to(tl.float32) * 0.5, normal)
    return tl.where((codes & 8) != 0, -magnitude, magnitude)


@triton.jit
def dequant_mx_k_tile(values, scales, ELEMENT: tl.constexpr, BLOCK_K: tl.constexpr):
    """A (BLOCK_K, BLOCK_N) float32 tile of MX weights quantized along K.

    values: (BLOCK_K // 2, BLOCK_N) packed e2m1 bytes, or (BLOCK_K, BLOCK_N) fp8;
    scales: (BLOCK_K // 32, BLOCK_N) e8m0 bytes.
    """
    if ELEMENT == "e2m1":
        # Byte i holds K rows 2i (low nibble) and 2i + 1 (high nibble).
        low = decode_e2m1(values & 0xF)
        high = decode_e2m1(values >> 4)
        w = tl.reshape(tl.permute(tl.join(low, high), (0, 2, 1)), (BLOCK_K, values.shape[1]))
    else:
        w = values.to(tl.float32)
    factors = pow2_of_scale(scales)
    w = tl.reshape(w, (BLOCK_K // 32, 32, values.shape[1])) * factors[:, None, :]
    return tl.reshape(w, (BLOCK_K, values.shape[1]))


@triton.jit
def scale_mx_rows(tile, EMAX: tl.constexpr, MAX_MANTISSA: tl.constexpr, MAX_VALUE: tl.constexpr,
                  ROUND_UP: tl.constexpr):
    """Scale a float32 (BLOCK_M, BLOCK_N) tile along N in blocks of 32 for MX quantization.

    Returns (scaled, scales): the values divided by their block's scale and clamped to the element's
    range (ready for an fp8 cast or ``pack_e2m1_rows``), and the (BLOCK_M, BLOCK_N // 32) scale bytes.
    """
    BLOCK_M: tl.constexpr = tile.shape[0]
    BLOCK_N: tl.constexpr = tile.shape[1]
    blocks = tl.reshape(tile, (BLOCK_M, BLOCK_N // 32, 32))
    scales = mx_scale_code(tl.max(tl.abs(blocks), axis=2), EMAX, MAX_MANTISSA, ROUND_UP)
    scaled = blocks * inverse_pow2_of_scale(scales)[:, :, None]
    scaled = tl.minimum(tl.maximum(scaled, -MAX_VALUE), MAX_VALUE)
    return tl.reshape(scaled, (BLOCK_M, BLOCK_N)), scales


@triton.jit
def pack_e2m1_rows(scaled):
    """(BLOCK_M, BLOCK_N) float32 -> (BLOCK_M, BLOCK_N // 2) bytes of two e2m1 codes (even column low)."""
    even, odd = tl.split(tl.reshape(encode_e2m1(scaled), (scaled.shape[0], scaled.shape[1] // 2, 2)))
    return even | (odd << 4)
