"""fp8 e4m3 values with float32 scales per block: the checkpoint formats of most fp8 MoE models.

``quantize_fp8_torch(t, block)`` quantizes the last two dims (R, C) of ``t`` in blocks of ``block = (br, bc)``
rows and columns that share one scale (0: the whole extent of that dim; the last, partial block of a dim has a
scale of its own). DeepSeek-V3/R1 and Qwen3-FP8 weights use (128, 128) blocks of the (out, in) matrix and
activations (1, 128); llm-compressor's "FP8-Dynamic" weights one scale per output column, (1, 0) over (out, in),
and activations one per row, (1, 0).

The rule, per block (``quantize_fp8`` on the device gives the same bits):

* amax = max |t| (t converted to float32);
* scale = amax / 448 in float32 (IEEE division, round to nearest even); with ``pow2_scales`` the smallest power of
  two (float32, subnormal ones included) >= amax / 448, computed exactly from amax's bits (DeepSeek-V3.1's UE8M0
  scales); an amax of 0, or a scale that underflows to 0, gives the scale 1.0;
* values = t / scale (float32 IEEE division, round to nearest even), clamped to +-448, converted to e4m3 (round to
  nearest even);
* a block holding a NaN or an infinity gets the scale NaN and element codes 0: it dequantizes to NaN everywhere
  (as MX blocks do, ``ogsgen.numerics.mx``).

Blocks of tiny values (amax below about 5e-36) get subnormal scales, which hold few bits: their largest values may
then saturate at 448; below about 3e-43 amax / 448 underflows to 0, so (without pow2_scales) the scale is 1.0 and the
values round to 0.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..devices import check_kernel_device, interpreting
from ..errors import SpecError, SpecTypeError
from ..spec.formats import FP8_BLOCK
from ..spec.functions import settle_triton_cache_keys
from . import interpreter
from .codecs import Codec

FP8_E4M3_MAX = 448.0     # e4m3's largest finite value: a block's scale maps its amax onto it
_E4M3_MAX = tl.constexpr(FP8_E4M3_MAX)  # (the kernels' copies: Triton reads globals only as constexpr)
_BLOCK = tl.constexpr(FP8_BLOCK)
QUANTIZE_SLAB = 1 << 24  # input elements quantized at a time by quantize_fp8_torch (a bounded temporary)
_NONFINITE_BITS = 0x7F800000  # |x|'s bits from here up: infinity and NaN
_MANTISSA_448 = 0x600000      # 448 = 1.75 * 2**8: the mantissa field of 1.75
_KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _check_block(block) -> tuple[int, int]:
    if (not isinstance(block, (tuple, list)) or len(block) != 2
            or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in block)):
        raise SpecError(f"block must be a pair (rows, columns) of non-negative ints sharing one scale, 0 meaning the "
                        f"whole extent, e.g. (1, 128) or (128, 128); got {block!r}")
    return int(block[0]), int(block[1])


def _check_float(t, name: str, min_ndim: int = 2) -> None:
    if not isinstance(t, torch.Tensor):
        raise SpecTypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}; pass torch.tensor(...)")
    if not t.dtype.is_floating_point:
        raise SpecError(f"{name} must be a float tensor, got {t.dtype}")
    if t.ndim < min_ndim:
        raise SpecError(f"{name} must have at least {min_ndim} dimensions (..., rows, columns), got shape "
                        f"{tuple(t.shape)}")


def _n_blocks(extent: int, block: int) -> int:
    return 1 if block == 0 else -(-extent // block)


def scales_shape(shape, block) -> tuple[int, ...]:
    """The shape of the scales of a tensor of ``shape`` quantized in blocks of ``block``."""
    br, bc = _check_block(block)
    *lead, rows, cols = shape
    return (*lead, _n_blocks(rows, br), _n_blocks(cols, bc))


def _abs_bits(t: torch.Tensor) -> torch.Tensor:
    """|t|'s float32 bits as int32: their integer order is |t|'s, and infinity and NaN come last."""
    return t.view(torch.int32) & 0x7FFFFFFF


def _pow2_at_least(amax_bits: torch.Tensor) -> torch.Tensor:
    """The smallest float32 power of two >= amax / 448 for positive finite amax, exactly (see _pow2_scale in Triton)."""
    # A subnormal amax is m * 2**-149: float(m) is exact and holds m's leading bit in its exponent field.
    normalized = torch.where(amax_bits < 0x800000, amax_bits.float().view(torch.int32) - (149 << 23), amax_bits)
    exponent = (normalized >> 23) - 8 + ((normalized & 0x7FFFFF) > _MANTISSA_448).int()  # biased, as float32's
    normal = exponent.clamp(min=0) << 23
    subnormal = torch.ones_like(exponent) << (exponent + 22).clamp(0, 22)  # 2**-149 at the least
    return torch.where(exponent >= 1, normal, subnormal).view(torch.float32)


def _block_scales(amax_bits: torch.Tensor, pow2_scales: bool) -> torch.Tensor:
    """float32 scales of blocks whose |max| has these bits."""
    # (448 as a tensor: torch on CUDA divides by a Python scalar as a multiply by its reciprocal, off by an ulp)
    amax = amax_bits.view(torch.float32)
    scale = _pow2_at_least(amax_bits) if pow2_scales else amax / torch.full_like(amax, FP8_E4M3_MAX)
    scale = torch.where((scale == 0) | (amax_bits == 0), 1.0, scale)
    return torch.where(amax_bits >= _NONFINITE_BITS, float("nan"), scale)


def quantize_fp8_torch(t: torch.Tensor, block, *, pow2_scales: bool = False):
    """Quantize the last two dims of ``t`` to e4m3 in blocks of ``block``: (values, scales).

    values: torch.float8_e4m3fn of t's shape; scales: float32 of shape (..., cdiv(R, br) or 1, cdiv(C, bc) or 1).
    The rule: this module's docstring. Works on any device; a slab of the leading dims at a time (QUANTIZE_SLAB).
    """
    br, bc = _check_block(block)
    _check_float(t, "t")
    *lead, rows, cols = t.shape
    n_r, n_c = _n_blocks(rows, br), _n_blocks(cols, bc)
    # A block of 0 spans the whole extent (one element of padding for an empty one: amax 0, scale 1).
    size_r, size_c = br or max(rows, 1), bc or max(cols, 1)
    matrices = t.reshape(math.prod(lead), rows, cols)  # (-1 is ambiguous for empty t)
    values = torch.empty(matrices.shape, dtype=torch.float8_e4m3fn, device=t.device)
    scales = torch.empty((matrices.shape[0], n_r, n_c), dtype=torch.float32, device=t.device)
    step = max(1, QUANTIZE_SLAB // max(rows * cols, 1))
    for start in range(0, matrices.shape[0], step):
        padded = torch.nn.functional.pad(matrices[start:start + step].float(),
                                         (0, n_c * size_c - cols, 0, n_r * size_r - rows))
        blocks = padded.unflatten(-1, (n_c, size_c)).unflatten(-3, (n_r, size_r))  # (L, n_r, size_r, n_c, size_c)
        amax_bits = _abs_bits(blocks).amax(dim=(-3, -1))
        block_scales = _block_scales(amax_bits, pow2_scales)
        scaled = (blocks / block_scales[:, :, None, :, None]).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX)
        scaled = scaled.where(amax_bits[:, :, None, :, None] < _NONFINITE_BITS, 0.0)
        values[start:start + step] = scaled.flatten(-2).flatten(-3, -2)[:, :rows, :cols].to(torch.float8_e4m3fn)
        scales[start:start + step] = block_scales
    return values.reshape(t.shape), scales.reshape(*lead, n_r, n_c)


def dequantize_fp8_torch(values: torch.Tensor, scales: torch.Tensor, block) -> torch.Tensor:
    """float32 values times their block's scale: the inverse of :func:`quantize_fp8_torch` (up to its rounding)."""
    br, bc = _check_block(block)
    _check_float(values, "values")
    _check_float(scales, "scales")
    if values.dtype != torch.float8_e4m3fn or scales.dtype != torch.float32:
        raise SpecError(f"values must be torch.float8_e4m3fn and scales float32, got {values.dtype} and "
                        f"{scales.dtype}")
    expected = scales_shape(values.shape, (br, bc))
    if tuple(scales.shape) != expected:
        raise SpecError(f"scales of values {tuple(values.shape)} in blocks of {(br, bc)} must have shape {expected}, "
                        f"got {tuple(scales.shape)}")
    rows, cols = values.shape[-2:]
    expanded = scales.repeat_interleave(br, dim=-2)[..., :rows, :] if br else scales
    expanded = expanded.repeat_interleave(bc, dim=-1)[..., :cols] if bc else expanded
    return values.float() * expanded



def _quantize_weights(rows: torch.Tensor, fmt, pow2_scales: bool = False):
    """e4m3 values of (..., N, K) floats and their scales, in the checkpoint's blocks of (out, in): 128 x 128, or
    one per output column (channel)."""
    if pow2_scales and not fmt.block_size:
        raise SpecError(f"pow2_scales applies to format='fp8e4m3_b128', not {fmt.name!r}; leave it False")
    values, scales = quantize_fp8_torch(rows, (FP8_BLOCK, FP8_BLOCK) if fmt.block_size else (1, 0),
                                        pow2_scales=pow2_scales)
    return values, scales, None


def _dequantize_weights(values, block_scales, fmt):
    block = (FP8_BLOCK if fmt.block_size else 0, fmt.scale_block_n(block_scales, values.shape[-1]))
    return dequantize_fp8_torch(values, block_scales, block)



@triton.jit
def _pow2_scale(amax_bits):
    """_pow2_at_least, op for op."""
    normalized = tl.where(amax_bits < 0x800000, amax_bits.to(tl.float32).to(tl.int32, bitcast=True) - (149 << 23),
                          amax_bits)
    exponent = (normalized >> 23) - 8 + ((normalized & 0x7FFFFF) > 0x600000).to(tl.int32)
    normal = tl.maximum(exponent, 0) << 23
    subnormal = tl.full(exponent.shape, 1, tl.int32) << tl.minimum(tl.maximum(exponent + 22, 0), 22)
    return tl.where(exponent >= 1, normal, subnormal).to(tl.float32, bitcast=True)


@triton.jit
def _block_scale(amax_bits, POW2: tl.constexpr):
    """_block_scales, op for op (div_rn: Triton's `/` on float32 is approximate)."""
    if POW2:
        scale = _pow2_scale(amax_bits)
    else:
        scale = tl.math.div_rn(amax_bits.to(tl.float32, bitcast=True), _E4M3_MAX)
    scale = tl.where((scale == 0) | (amax_bits == 0), 1.0, scale)
    return tl.where(amax_bits >= 0x7F800000, float("nan"), scale)


@triton.jit
def _load_tile(X, rows, cols, mask_m, n_cols, stride_xm, stride_xk):
    x = tl.load(X + rows.to(tl.int64)[:, None] * stride_xm + cols.to(tl.int64)[None, :] * stride_xk,
                mask=mask_m[:, None] & (cols[None, :] < n_cols), other=0.0)
    return x.to(tl.float32)


@triton.jit
def _divided_by_scale(tile, scale):
    """tile / scale for the e4m3 cast: div_rn's bits wherever the quotient is a normal float32 (and so the cast's
    everywhere: a subnormal quotient casts to a signed 0 either way), with one division per scale instead of one
    per value (div_rn per value, a range check and a slow path each, made an fp8 output cost more than a bf16 one).
    Markstein's correction: with r = 1/scale rounded to nearest and q = tile * r, the residual scale * q - tile is
    exact and q - residual * r rounds to the quotient rounded to nearest. Scales under 2**-96 would give r = inf:
    both operands are lifted by 2**64 first (exact). The residual is multiplied by -r, never negated: Triton 3.6
    compiles a float's unary minus as 0 - x, whose -(+0) is +0, and a -0 quotient would lose its sign."""
    lift = tl.where(scale < 2.0**-96, 2.0**64, 1.0)
    scale = scale * lift
    tile = tile * lift
    r = tl.math.div_rn(1.0, scale)
    q = tile * r
    return tl.fma(tl.fma(scale, q, -tile), -r, q)


@triton.jit
def _e4m3_range(tile, scale, amax_bits):
    """tile / scale clamped to e4m3's range (0 in blocks with a NaN or an infinity), ready for the cast; scale and
    amax_bits broadcast over the tile."""
    scaled = tl.minimum(tl.maximum(_divided_by_scale(tile, scale), -_E4M3_MAX), _E4M3_MAX)
    return tl.where(amax_bits < 0x7F800000, scaled, 0.0)


@triton.jit
def scale_fp8_rows(tile):
    """Quantize a float32 (R, C) output tile (columns past the output 0) as quantize_fp8(t, (1, 128)) does, in
    blocks of 128 columns of a row: (values (R, C) for the e4m3 cast, scales (R, C // 128) float32)."""
    ROWS: tl.constexpr = tile.shape[0]
    BLOCKS: tl.constexpr = tile.shape[1] // _BLOCK
    blocks = tl.reshape(tile, (ROWS, BLOCKS, _BLOCK))
    amax_bits = tl.max(blocks.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=2)
    scales = _block_scale(amax_bits, False)
    return tl.reshape(_e4m3_range(blocks, scales[:, :, None], amax_bits[:, :, None]), (ROWS, BLOCKS * _BLOCK)), scales


@triton.jit
def _store_e4m3(Values, tile, scale, amax_bits, rows, cols, mask_m, n_cols, stride_vm):
    scaled = _e4m3_range(tile, scale[:, None], amax_bits[:, None])
    tl.store(Values + rows.to(tl.int64)[:, None] * stride_vm + cols[None, :], scaled.to(tl.float8e4nv),
             mask=mask_m[:, None] & (cols[None, :] < n_cols))


@triton.jit(do_not_specialize=["n_rows"])
def _quantize_fp8_rows(X, Values, Scales, n_rows, n_cols, stride_xm, stride_xk, stride_vm, stride_sm,
                       PER_ROW: tl.constexpr, POW2: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """Rows of X to e4m3 with one scale per BLOCK_K columns (one read of X), or per row (PER_ROW: two reads)."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = rows < n_rows
    if PER_ROW:
        amax_bits = tl.zeros([BLOCK_M], tl.int32)
        for start in range(0, n_cols, BLOCK_K):
            cols = start + tl.arange(0, BLOCK_K)
            tile = _load_tile(X, rows, cols, mask_m, n_cols, stride_xm, stride_xk)
            amax_bits = tl.maximum(amax_bits, tl.max(tile.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=1))
        scale = _block_scale(amax_bits, POW2)
        tl.store(Scales + rows.to(tl.int64) * stride_sm, scale, mask=mask_m)
        for start in range(0, n_cols, BLOCK_K):
            cols = start + tl.arange(0, BLOCK_K)
            tile = _load_tile(X, rows, cols, mask_m, n_cols, stride_xm, stride_xk)
            _store_e4m3(Values, tile, scale, amax_bits, rows, cols, mask_m, n_cols, stride_vm)
    else:
        cols = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
        tile = _load_tile(X, rows, cols, mask_m, n_cols, stride_xm, stride_xk)
        amax_bits = tl.max(tile.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=1)
        scale = _block_scale(amax_bits, POW2)
        tl.store(Scales + rows.to(tl.int64) * stride_sm + tl.program_id(1), scale, mask=mask_m)
        _store_e4m3(Values, tile, scale, amax_bits, rows, cols, mask_m, n_cols, stride_vm)


CODEC = Codec(_quantize_weights, _dequantize_weights, options=("pow2_scales",), writer=scale_fp8_rows)
settle_triton_cache_keys(scale_fp8_rows)  # (generated kernels call it: see ogsgen.numerics.jit's helpers)

_ROW_BLOCKS = ((1, 128), (1, 0))  # the blocks quantize_fp8 runs as one Triton kernel


def row_quantization(x: torch.Tensor, values: torch.Tensor, scales: torch.Tensor, block, pow2_scales: bool = False):
    """(kernel, grid, arguments) of the Triton launch that quantizes 2-D x into ``values`` and ``scales`` in blocks
    (1, 128) or (1, 0), for a caller that launches it itself (matmul_ogs notes it in its launch plan). Only
    checked by quantize_fp8; x is read in place, any strides."""
    n_rows, n_cols = x.shape
    per_row = block == (1, 0)
    block_m = 4 if per_row else 16
    grid = (triton.cdiv(n_rows, block_m), 1 if per_row else scales.shape[1], 1)
    args = dict(X=x, Values=values, Scales=scales, n_rows=n_rows, n_cols=n_cols, stride_xm=x.stride(0),
                stride_xk=x.stride(1), stride_vm=values.stride(0), stride_sm=scales.stride(0), PER_ROW=per_row,
                POW2=pow2_scales, BLOCK_M=block_m, BLOCK_K=1024 if per_row else FP8_BLOCK)
    return _quantize_fp8_rows, grid, args


def quantize_fp8(x: torch.Tensor, block, *, pow2_scales: bool = False):
    """:func:`quantize_fp8_torch` of a 2-D x (M, K) on its device, bit for bit: (values, scales).

    Blocks (1, 128) (one scale per row and 128 columns: one pass over x) and (1, 0) (per row: two) run a Triton
    kernel that reads x in place (any strides), allocates only the outputs and never waits for the device; other
    blocks run quantize_fp8_torch. x: bfloat16, float16 or float32.
    """
    block = _check_block(block)
    _check_float(x, "x")
    if x.ndim != 2:
        raise SpecError(f"x must be 2-D (M, K), got shape {tuple(x.shape)}; flatten the leading dims, or use "
                        f"quantize_fp8_torch")
    if x.dtype not in _KERNEL_DTYPES:
        raise SpecError(f"x has dtype {x.dtype}; quantize_fp8 takes bfloat16, float16 and float32")
    check_kernel_device(x, "x")
    if block not in _ROW_BLOCKS:
        return quantize_fp8_torch(x, block, pow2_scales=pow2_scales)
    x = x.resolve_neg()  # a lazily negated view (torch._neg_view): the kernel reads memory, which holds -x
    values = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    scales = torch.empty(scales_shape(x.shape, block), dtype=torch.float32, device=x.device)
    if scales.numel():
        if interpreting():
            interpreter.prepare(("e4m3",))  # the uncorrected interpreter rounds fp32 -> e4m3 wrongly
        kernel, grid, args = row_quantization(x, values, scales, block, pow2_scales)
        kernel[grid](**args)
    return values, scales
