"""Triton helpers for scaled formats, called by generated kernels and by the quantization kernels.

They mirror ``ogsgen.numerics.mx`` operation by operation (integer scale choice, threshold-based
e2m1 rounding) so that both produce the same bits.
"""
from contextlib import contextmanager

import triton
import triton.language as tl
from triton.language import target_info
from triton.language.target_info import cuda_capability_geq
from triton.runtime.jit import JITFunction

from ..spec.functions import settle_triton_cache_keys

# The packed e2m1 -> bf16 upcast, elementwise per byte: (low nibble, high nibble) times the byte's factor.
# Per 32-bit lane: 4 packed e2m1 bytes in ($4), two bf16x2 of low nibbles ($0, $1) and two of high nibbles
# ($2, $3) out. A byte pair is spread to the high bytes of the two 16-bit halves (prmt); shifts and masks put
# each nibble's sign at bit 15 and its exponent and mantissa bits at 8..6 (the high nibble's sign is there
# already), which reads as the e2m1 value times 2**-126. Two bf16x2 fmas with a -0 addend follow: times 2**126
# (exact), then times the block scale (the only rounding, as in the reference). $5 and $6 hold the scales of
# bytes (0, 1) and (2, 3).
def _byte_pair_ptx(selector: str, low: str, high: str, factors: str) -> str:
    return f"""prmt.b32 pair, $4, 0, {selector};
shr.b32 a, pair, 2;
shl.b32 b, pair, 4;
or.b32 a, a, b;
and.b32 a, a, 0x81C081C0;
fma.rn.bf16x2 a, a, bias, nz;
fma.rn.bf16x2 {low}, a, {factors}, nz;
shr.b32 a, pair, 6;
and.b32 a, a, 0x01C001C0;
and.b32 b, pair, 0x80008000;
or.b32 a, a, b;
fma.rn.bf16x2 a, a, bias, nz;
fma.rn.bf16x2 {high}, a, {factors}, nz;
"""


E2M1_BYTES_TO_BF16X2 = tl.constexpr("{\n.reg .b32 pair, a, b, bias, nz;\nmov.b32 bias, 0x7E807E80;\n"
                                    "mov.b32 nz, 0x80008000;\n" + _byte_pair_ptx("0x1404", "$0", "$2", "$5")
                                    + _byte_pair_ptx("0x3424", "$1", "$3", "$6") + "}")


@triton.jit
def pow2_of_scale(code):
    """2 ** (code - 127) in float32 for e8m0 scale bytes (code 0 is 2 ** -127; 255, e8m0's NaN, is NaN)."""
    code = code.to(tl.int32)
    value = (tl.minimum(tl.maximum(code, 1), 254) << 23).to(tl.float32, bitcast=True)
    return tl.where(code == 0, value * 0.5, tl.where(code == 255, float("nan"), value))


@triton.jit
def inverse_pow2_of_scale(code):
    """2 ** (127 - code) in float32 (the multiplier that undoes a scale), for codes 0..253 (254 gives 0, 255 -inf)."""
    return ((254 - code.to(tl.int32)) << 23).to(tl.float32, bitcast=True)


@triton.jit
def mx_scale_code(absmax, EMAX: tl.constexpr, MAX_MANTISSA: tl.constexpr, ROUND_UP: tl.constexpr):
    """e8m0 scale byte for blocks of float32 absmax (see ogsgen.numerics.mx.scale_codes): 255, e8m0's NaN, for a
    NaN or infinite absmax."""
    bits = absmax.to(tl.int32, bitcast=True)
    exponent = (bits >> 23) & 0xFF
    code = exponent - EMAX
    if ROUND_UP:
        code += ((bits & 0x7FFFFF) > MAX_MANTISSA).to(tl.int32)
    code = tl.where(absmax > 0, tl.minimum(tl.maximum(code, 0), 254), 0)
    return tl.where(exponent == 255, 255, code).to(tl.uint8)


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
def e2m1_times_2_14(codes):
    """e2m1 codes (int32, sign in bit 3) -> their values times 2**-14, in float32, exactly.

    The code's two exponent bits and mantissa bit become an fp16's lowest exponent bits and top mantissa
    bit (0.5 becomes a subnormal); the hardware fp16 -> fp32 conversion is exact. A few integer ops per
    value instead of an fp32 decode with selects.
    """
    half_bits = ((codes & 7) << 9) | ((codes & 8) << 12)
    return half_bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def bf16_bits_of_scale(code):
    """The bits (int32) of 2 ** (code - 127) as bf16 for e8m0 scale bytes: exact, bf16 has float32's exponents
    (code 0 is the subnormal 2 ** -127; 255, e8m0's NaN, is NaN, as in ``pow2_of_scale``)."""
    code = code.to(tl.int32)
    return tl.where(code == 255, 0x7FC0, tl.maximum(code << 7, 0x40))


@triton.jit
def bf16_of_scale(code):
    """``bf16_bits_of_scale`` as a bf16 value."""
    return bf16_bits_of_scale(code).to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def e2m1_bytes_to_bf16(values, factors):
    """Packed e2m1 bytes times bf16 factors of the same shape -> (low-nibble, high-nibble) bf16 values,
    with packed 16-bit arithmetic (about 3 instructions per value; see E2M1_BYTES_TO_BF16X2). Inline PTX:
    Triton's CPU interpreter cannot run it (the test harness executes its definition instead)."""
    return tl.inline_asm_elementwise(E2M1_BYTES_TO_BF16X2, constraints="=r,=r,=r,=r,r,r,r", args=[values, factors],
                                     dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)


@triton.jit
def upcast_mx_rows(values, scales, ELEMENT: tl.constexpr, OUT_DTYPE: tl.constexpr):
    """A (R, S) tile of MX rows quantized along their last axis, as OUT_DTYPE.

    values: (R, S // 2) packed e2m1 bytes (element 2i in the low nibble of byte i), or (R, S) fp8;
    scales: (R, S // 32) e8m0 bytes. Each value times its block's power of two, rounded once to OUT_DTYPE
    (as ``dequantize_mx_torch``): e2m1 to bf16 with packed bf16x2 arithmetic, the rest through float32.
    """
    ROWS: tl.constexpr = scales.shape[0]
    BLOCKS: tl.constexpr = scales.shape[1]
    if ELEMENT == "e2m1" and OUT_DTYPE == tl.bfloat16:
        factors = tl.broadcast_to(bf16_of_scale(scales)[:, :, None], (ROWS, BLOCKS, 16))
        low, high = e2m1_bytes_to_bf16(tl.reshape(values, (ROWS, BLOCKS, 16)), factors)
        return tl.reshape(tl.join(low, high), (ROWS, BLOCKS * 32))
    factors = pow2_of_scale(scales)[:, :, None]
    if ELEMENT == "e2m1":
        codes = tl.reshape(values.to(tl.int32), (ROWS, BLOCKS, 16))
        low = e2m1_times_2_14(codes & 15) * 16384.0 * factors
        high = e2m1_times_2_14(codes >> 4) * 16384.0 * factors
        w = tl.join(low.to(OUT_DTYPE), high.to(OUT_DTYPE))                # (ROWS, BLOCKS, 16, 2)
    else:
        w = (tl.reshape(values.to(tl.float32), (ROWS, BLOCKS, 32)) * factors).to(OUT_DTYPE)
    return tl.reshape(w, (ROWS, BLOCKS * 32))


# The hopper layout's upcast (ogsgen.numerics.layouts): one 32-bit word ($8) holds a thread's 8 values of a 16 x 16
# operand block; out come its four bf16x2 registers, unpacked to 8 bf16 ($0..$7: row r, row r + 8, then the same
# at K + 8; low lane first). Each register is an extraction that puts its nibbles' bits at 15, 8, 7, 6 of both
# lanes (the e2m1 value times 2**-126, as above), then the same two fmas: times 2**126, times the row's block
# scale. $9 holds the two rows' factors as bf16 (row r low, row r + 8 high); each fma reads one of them in both
# lanes (sm_90's fmas select halves of an operand for free).
# (One fma per register, with the factor 2**(code - 1), would do for scale codes <= 128, which trained weights keep
# to; a kernel cannot know that of its scales without reading them all: bench/NOTES.md, "One multiply".)
def _word_to_bf16_ptx() -> str:
    def register(factor, low, high):
        return (f"fma.rn.bf16x2 v, v, bias, nz;\nfma.rn.bf16x2 v, v, {factor}, nz;\n"
                f"mov.b32 {{{low}, {high}}}, v;\n")
    return ("{\n.reg .b32 v, u, nz, row, row8, bias;\nmov.b32 bias, 0x7E807E80;\n.reg .b16 scale, scale8;\n"
            "mov.b32 nz, 0x80008000;\n"
            "mov.b32 {scale, scale8}, $9;\nmov.b32 row, {scale, scale};\nmov.b32 row8, {scale8, scale8};\n"
            "shl.b32 v, $8, 6;\nand.b32 v, v, 0x81C081C0;\n" + register("row", "$0", "$1")
            + "shf.l.wrap.b32 v, $8, $8, 12;\nand.b32 v, v, 0x81C081C0;\n" + register("row8", "$2", "$3")
            + "shl.b32 v, $8, 2;\nand.b32 v, v, 0x81C081C0;\n" + register("row", "$4", "$5")
            + "shr.b32 v, $8, 8;\nand.b32 v, v, 0x00400040;\nand.b32 u, $8, 0x81808180;\nor.b32 v, v, u;\n"
            + register("row8", "$6", "$7") + "}")


E2M1_WORD_TO_BF16 = tl.constexpr(_word_to_bf16_ptx())

# bf16_bits_of_scale of two e8m0 codes at once ($1: one code in each 16-bit half): both shifted into their
# exponent fields; code 255 (e8m0's NaN) shifts to 0x7F80, bf16's infinity, and only it carries into bit 15 when
# 0x80 is added, which sets the quiet bit 0x40 (NaN, 0x7FC0); then code 0's clamp to the subnormal (packed 16-bit
# max: sm_90 and later).
E8M0_PAIR_TO_BF16X2 = tl.constexpr("{\n.reg .b32 nan, bottom;\nmov.b32 bottom, 0x00400040;\nshl.b32 $0, $1, 7;\n"
                                   "add.u32 nan, $0, 0x00800080;\nand.b32 nan, nan, 0x80008000;\n"
                                   "shr.b32 nan, nan, 9;\nor.b32 $0, $0, nan;\nmax.u16x2 $0, $0, bottom;\n}")


@contextmanager
def compiling_for(target):
    """Present ``target`` (a triton GPUTarget) as the GPU that kernels compiled inside compile for. Helpers here
    choose their PTX with ``cuda_capability_geq``, which asks the active driver: right for a launch, wrong for
    an offline compile for another GPU (or on a machine without one), which needs this. Not thread-safe."""
    def current_target():
        return target
    current_target.__triton_builtin__ = True  # as target_info.current_target, which it stands in for
    real, target_info.current_target = target_info.current_target, current_target
    try:
        yield
    finally:
        target_info.current_target = real


@triton.jit
def bf16_pair_of_scales(low_code, high_code):
    """``bf16_of_scale`` of two e8m0 codes as one bf16x2 register's bits (int32), low_code's in the low half."""
    if cuda_capability_geq(9, 0):
        pair = low_code.to(tl.int32) | (high_code.to(tl.int32) << 16)
        bits = tl.inline_asm_elementwise(E8M0_PAIR_TO_BF16X2, constraints="=r,r", args=[pair], dtype=tl.int32,
                                         is_pure=True, pack=1)
    else:  # Ampere and Ada have no packed 16-bit min and max (and Triton's interpreter takes this path)
        bits = bf16_bits_of_scale(low_code) | (bf16_bits_of_scale(high_code) << 16)
    return bits


@triton.jit
def upcast_mxfp4_hopper_words(words, scales):
    """A (R, S) bf16 tile, in K order, of mxfp4 rows stored in the hopper layout (ogsgen.numerics.layouts).

    words: (R // 16, S * 2) int32, S a multiple of 64: per 16-row slab, 128 words per 64 columns in the order
    (r, t, j); scales: (R, S // 32) e8m0 bytes. The joins and the final
    permute only rename registers when the result feeds a 16-bit MMA's register operand (a word is one thread's
    four registers of a 16 x 16 block).
    """
    SLABS: tl.constexpr = words.shape[0]
    GROUPS: tl.constexpr = words.shape[1] // 128
    words = tl.reshape(words, (SLABS, GROUPS, 8, 4, 4))                                   # [s, g, r, t, j]
    codes = tl.permute(tl.reshape(scales, (SLABS, 2, 8, GROUPS, 2)), (0, 3, 2, 4, 1))    # [s, g, r, jh, q]
    factors = bf16_pair_of_scales(*tl.split(codes))                                      # [s, g, r, jh]
    factors = tl.broadcast_to(tl.reshape(factors, (SLABS, GROUPS, 8, 1, 2, 1)), (SLABS, GROUPS, 8, 4, 2, 2))
    v = tl.inline_asm_elementwise(E2M1_WORD_TO_BF16,
                                  constraints="=h,=h,=h,=h,=h,=h,=h,=h,r,r",
                                  args=[words, tl.reshape(factors, (SLABS, GROUPS, 8, 4, 4))],
                                  dtype=(tl.bfloat16,) * 8, is_pure=True, pack=1)
    w = tl.join(tl.join(tl.join(v[0], v[1]), tl.join(v[2], v[3])),
                tl.join(tl.join(v[4], v[5]), tl.join(v[6], v[7])))                      # [s, g, r, t, j, lane, q, h]
    w = tl.permute(w, (0, 6, 2, 1, 4, 7, 3, 5))                                          # [s, q, r, g, j, h, t, lane]
    return tl.reshape(w, (SLABS * 16, GROUPS * 64))


# e4m3 x with mxfp4 w (docs/formats.md, "fp8 activations with mxfp4 weights"). e2m1 values have two significant bits,
# so e2m1 * 2**j is an e4m3 value for j in [-8, 6]. Where a W tile's every column has its scale codes over K within 14
# of its largest, r (11 in the hopper_fp8 layout, whose conversion gives e4m3 normals only), each block of code s
# becomes the e4m3 values e2m1 * 2**(s - r + 6) exactly, one fp8 dot accumulates all of K, and the result is
# multiplied by x's scale, then by 2**(r - 133) (exact: in this order no scale code under- or overflows a product that
# fp32 holds). Other tiles take each K step's blocks alone. (A branch on the codes inside the K loop would keep Triton
# from pipelining its loads: the choice is made once, before it.)


@triton.jit
def mxfp4_fold_reference(ScalePtrs, mask_n, n_blocks, stride_k, BLOCKS: tl.constexpr, WINDOW: tl.constexpr):
    """(the largest e8m0 code of each column of a W tile over its n_blocks blocks of K, whether every column's codes
    lie within WINDOW of it), read BLOCKS at a time from ScalePtrs ((BN, BLOCKS) pointers at the first ones). Columns
    past N read 0."""
    top = tl.zeros((ScalePtrs.shape[0],), dtype=tl.int32)
    floor = tl.full((ScalePtrs.shape[0],), 255, dtype=tl.int32)
    blocks = tl.arange(0, BLOCKS)
    for b in range(0, tl.cdiv(n_blocks, BLOCKS)):
        valid = mask_n[:, None] & (b * BLOCKS + blocks[None, :] < n_blocks)
        codes = tl.load(ScalePtrs + b * BLOCKS * stride_k, mask=valid, other=0).to(tl.int32)
        top = tl.maximum(top, tl.max(codes, axis=1))
        floor = tl.minimum(floor, tl.min(tl.where(valid, codes, top[:, None]), axis=1))
    return top, tl.min(floor - top) >= -WINDOW


# The hopper_fp8 layout's word (ogsgen.numerics.layouts.hopper_fp8) -> two registers of 4 e4m3 values, rows r ($0)
# and r + 8 ($1). Each output byte is a byte permute of its row's 8-byte table ($3, $7 for row r; $11, $15 for row
# r + 8: with 4 bytes packed per call, a 32-bit input takes 4 registers) indexed by a nibble's magnitude bits, or-ed
# with the nibble's sign: the signs come from a permute of the word and the word shifted left by 4, which puts
# nibble i's sign bit (3 + 4i) at bit 7 of byte i. $2: the word, its 4 bytes.
WORD_TO_E4M3 = tl.constexpr(
    "{\n.reg .b32 sel, sh, sg;\nand.b32 sel, $2, 0x7777;\nprmt.b32 $0, $3, $7, sel;\nshl.b32 sh, $2, 4;\n"
    "prmt.b32 sg, sh, $2, 0x5140;\nand.b32 sg, sg, 0x80808080;\nor.b32 $0, $0, sg;\nshr.b32 sel, $2, 16;\n"
    "and.b32 sel, sel, 0x7777;\nprmt.b32 $1, $11, $15, sel;\nprmt.b32 sg, sh, $2, 0x7362;\n"
    "and.b32 sg, sg, 0x80808080;\nor.b32 $1, $1, sg;\n}")


@triton.jit
def e4m3_magnitude_tables(d):
    """The e4m3 bytes of the e2m1 magnitudes 0, 0.5, 1, ..., 6 times 2 ** d, as two int32 (bytes 0-3: magnitude
    codes 0-3; 4-7), for d in [-5, 6]: each magnitude's e4m3 byte at 2**0 with d added to its exponent field (below
    2**-5, 0.5 becomes an e4m3 subnormal, which this add does not give)."""
    return 0x3C383000 + d * 0x08080800, 0x4C484440 + d * 0x08080808


@triton.jit
def _over_word_bytes(table, SHAPE: tl.constexpr):
    """A (S, G, 8, 2) table per row and 32-deep block, broadcast over the bytes (S, G, 8, t, j, byte) it converts."""
    spread = tl.broadcast_to(tl.reshape(table, (SHAPE[0], SHAPE[1], 8, 1, 2, 1, 1)),
                             (SHAPE[0], SHAPE[1], 8, 4, 2, 2, 4))
    return tl.reshape(spread, SHAPE)


@triton.jit
def mxfp4_words_as_e4m3(w, d):
    """A (R, S) e4m3 tile, in K order, of mxfp4 rows stored in the hopper_fp8 layout, each block's values times
    2 ** d (d: (R, S // 32) int32 in [-5, 6]). w: (R // 16, S * 8) uint8, S a multiple of 64: per 16-row slab, 512
    bytes per 64 columns in the order (r, t, j, byte). The tables are made after d's layout change (one int32 per
    row and block moves, not two); the join and the final permute only rename registers when the result feeds an fp8
    wgmma's register operand."""
    SLABS: tl.constexpr = w.shape[0]
    GROUPS: tl.constexpr = w.shape[1] // 512
    SHAPE: tl.constexpr = (SLABS, GROUPS, 8, 4, 4, 4)
    d_r, d_r8 = tl.split(tl.permute(tl.reshape(d, (SLABS, 2, 8, GROUPS, 2)), (0, 3, 2, 4, 1)))      # [s, g, r, jh]
    low_r, high_r = e4m3_magnitude_tables(d_r)
    low_r8, high_r8 = e4m3_magnitude_tables(d_r8)
    row_r, row_r8 = tl.inline_asm_elementwise(
        WORD_TO_E4M3, "=r,=r," + "r," * 16 + "r",
        [tl.reshape(w, SHAPE), _over_word_bytes(low_r, SHAPE), _over_word_bytes(high_r, SHAPE),
         _over_word_bytes(low_r8, SHAPE), _over_word_bytes(high_r8, SHAPE)],
        dtype=(tl.float8e4nv, tl.float8e4nv), is_pure=True, pack=4)                       # [s, g, r, t, j, i]
    values = tl.permute(tl.join(row_r, row_r8), (0, 6, 2, 1, 4, 3, 5))                    # [s, q, r, g, j, t, i]
    return tl.reshape(values, (SLABS * 16, GROUPS * 64))


@triton.jit
def _mxfp4_as_e4m3(w, codes, LAYOUT: tl.constexpr):
    """A (R, S) e4m3 tile of mxfp4 rows (strided bytes or hopper words, as the upcasts above) times 2 ** (code - 127)
    per block: exact where every product is an e4m3 value (0 below e4m3's smallest subnormal)."""
    if LAYOUT == "hopper":
        values = upcast_mxfp4_hopper_words(w, codes)
    else:
        values = upcast_mx_rows(w, codes, "e2m1", tl.bfloat16)
    return values.to(tl.float8e4nv)


@triton.jit
def dot_mxfp4_folded(acc, w, w_scales, top, x, LAYOUT: tl.constexpr, MAX_NUM_IMPRECISE_ACC: tl.constexpr):
    """acc + W^T @ X^T for one K step of e4m3 x (BM, BK) and a (BN, BK) mxfp4 W^T tile (in ``LAYOUT``, scales
    (BN, BK // 32)) whose columns' codes lie within the layout's fold window of ``top``: W as
    e2m1 * 2**(s - top + 6)."""
    if LAYOUT == "hopper_fp8":  # (its window is 11: s - top + 6 >= -5; blocks past K hold zeros, any table will do)
        folded = mxfp4_words_as_e4m3(w, w_scales.to(tl.int32) - top[:, None] + 6)
    else:
        codes = tl.maximum(w_scales.to(tl.int32) - top[:, None] + 133, 0)  # (blocks past K: code 0, values 0)
        folded = _mxfp4_as_e4m3(w, codes.to(tl.uint8), LAYOUT)
    return tl.dot(folded, tl.trans(x), acc, max_num_imprecise_acc=MAX_NUM_IMPRECISE_ACC)


@triton.jit
def unfold_mxfp4_scales(acc, top, x_scales):
    """The folded product acc (BN, BM) times x's scale (a scalar, or (1, BM) per row), then 2 ** (top - 133) per
    column (NaN for e8m0's NaN)."""
    return acc * x_scales * (pow2_of_scale(top) * (1.0 / 64))[:, None]


@triton.jit
def dot_mxfp4_blocks(acc, w, w_scales, x, x_scales, LAYOUT: tl.constexpr, MAX_NUM_IMPRECISE_ACC: tl.constexpr):
    """acc + W^T @ X^T for one K step as ``dot_mxfp4_folded`` takes it, whatever the codes: an fp8 dot per block of 32
    (its values e2m1 * 2**6, the other blocks' 0), times x's scale and 2 ** (s - 133)."""
    BLOCKS: tl.constexpr = w_scales.shape[1]
    codes = w_scales.to(tl.int32)
    x_t = tl.trans(x)
    for j in tl.static_range(BLOCKS):
        block = tl.broadcast_to((tl.arange(0, BLOCKS) == j)[None, :], codes.shape)
        if LAYOUT == "hopper_fp8":  # (its tables have no zero scale: the other blocks' words are zeroed)
            offs = tl.arange(0, w.shape[1])
            in_block = (offs // 512 * 2 + offs // 8 % 2 == j)[None, :]
            alone = mxfp4_words_as_e4m3(tl.where(in_block, w, 0), tl.full(codes.shape, 6, tl.int32))
        else:
            alone = _mxfp4_as_e4m3(w, tl.where(block, 133, 0).to(tl.uint8), LAYOUT)
        product = tl.dot(alone, x_t, max_num_imprecise_acc=MAX_NUM_IMPRECISE_ACC)
        acc += unfold_mxfp4_scales(product, tl.max(tl.where(block, codes, 0), axis=1), x_scales)
    return acc


# A kernel that must run each wgmma to completion before its next instruction (an MX kernel's WAIT_MMA) carries
# this instruction. ogsgen's compile (ogsgen.runtime.wgmma_hazards.waiting_for_each_wgmma_compiles) deletes it
# and makes every wgmma.wait_group wait for all groups; compiled any other way, ptxas refuses it by name, so
# no such binary runs with wgmmas in flight.
WGMMA_WAITS_MARKER = "ogsgen_wait_mma_kernel_needs_the_ogsgen_runtime_compile"
REQUEST_WGMMA_WAITS = tl.constexpr(f"{WGMMA_WAITS_MARKER};\nmov.b32 $0, 0;")


@triton.jit
def request_wgmma_waits():
    """Mark the kernel for ogsgen's compile to wait for each wgmma (see WGMMA_WAITS_MARKER). For K loops whose
    dot reads registers written in the loop (the upcast W): ptxas may reuse them while an asynchronous wgmma
    still reads them (triton-lang/triton#9433; ogsgen.runtime.wgmma_hazards). The wait is added to the PTX, not
    to Triton's IR, so the K loop keeps its register operands and its pipelined loads."""
    tl.inline_asm_elementwise(REQUEST_WGMMA_WAITS, "=r", [], dtype=tl.int32, is_pure=False, pack=1)


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
    # (a NaN counts as inf: the max drops NaN, and a block with either gets the NaN scale, its values 0)
    absmax = tl.max(tl.where(blocks == blocks, tl.abs(blocks), float("inf")), axis=2)
    scales = mx_scale_code(absmax, EMAX, MAX_MANTISSA, ROUND_UP)
    scaled = blocks * inverse_pow2_of_scale(scales)[:, :, None]
    scaled = tl.minimum(tl.maximum(scaled, -MAX_VALUE), MAX_VALUE)
    scaled = tl.where((scales != 255)[:, :, None], scaled, 0.0)
    return tl.reshape(scaled, (BLOCK_M, BLOCK_N)), scales


@triton.jit
def pack_e2m1_rows(scaled):
    """(BLOCK_M, BLOCK_N) float32 -> (BLOCK_M, BLOCK_N // 2) bytes of two e2m1 codes (even column low)."""
    even, odd = tl.split(tl.reshape(encode_e2m1(scaled), (scaled.shape[0], scaled.shape[1] // 2, 2)))
    return even | (odd << 4)


# Generated kernels and the quantization kernels share these helpers, and Triton 3.6 keys a kernel by what it
# finds already keyed among its callees (ogsgen.spec.functions.settle_triton_cache_keys): key every helper now,
# callees first, so that no kernel's key depends on which kernel a process compiled first.
for _helper in [value for value in list(globals().values()) if isinstance(value, JITFunction)]:
    settle_triton_cache_keys(_helper)
