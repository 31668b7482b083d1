"""Microscaling (MX) formats: blocks of 32 values along one axis share a power-of-two e8m0 scale.

Elements: ``e2m1`` (fp4, packed two per byte along the quantized axis, the even index in the low
nibble), ``e4m3`` and ``e5m2`` (fp8). A scale byte ``s`` means ``2**(s - 127)``.

Scale choice (``rounding``):

* ``"up"`` (default): the smallest power of two for which no value of the block exceeds the
  element's largest finite value, so nothing saturates;
* ``"down"``: the OCP MX rule, ``floor(log2(absmax)) - emax``; the largest values may saturate.

Values round to nearest, ties to even. The scale is computed from the bits of the block's absmax
with integer operations only, so this torch version and the Triton one (``ogsgen.numerics.jit``,
``ogsgen.numerics.quantize_mx``) agree bit for bit.

NaN and infinities: a block that holds a NaN or an infinity gets the scale byte 0xFF, e8m0's NaN (the OCP MX
rule: every value of the block reads as NaN; no element format can hold an infinity past its scale), and its
element codes are all 0. Dequantizing, and the matmul's upcast, give NaN for every value of such a block.
"""
from __future__ import annotations

import math

import torch

from ..errors import SpecError, SpecTypeError
from ..spec.formats import ELEMENTS as _ELEMENTS, FP8_ELEMENTS, MX_BLOCK, MX_ELEMENTS

ELEMENTS = MX_ELEMENTS
# element -> (largest finite value, its binary exponent, its mantissa bits as an fp32 mantissa field)
ELEMENT_MAX = {name: (_ELEMENTS[name].max_finite, _ELEMENTS[name].mx_emax, _ELEMENTS[name].mx_max_mantissa)
               for name in MX_ELEMENTS}
FP8_DTYPES = {name: _ELEMENTS[name].torch_dtype for name in FP8_ELEMENTS}
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
ROUNDINGS = ("up", "down")


def _check(element: str, rounding: str = "up"):
    if element not in ELEMENTS:
        raise SpecError(f"element must be one of {ELEMENTS}, got {element!r}")
    if rounding not in ROUNDINGS:
        raise SpecError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")


def _check_tensor(t, name: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise SpecTypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}; pass torch.tensor(...)")


def _check_axis(axis, t: torch.Tensor, name: str) -> int:
    """``axis`` as an index in [0, t.ndim): an int in [-ndim, ndim), never wrapped around."""
    if not isinstance(axis, int) or isinstance(axis, bool):
        raise SpecTypeError(f"axis must be an int, got {axis!r}")
    if not -t.ndim <= axis < t.ndim:
        raise SpecError(f"axis={axis} is out of range for {name} of shape {tuple(t.shape)}; give an axis from "
                        f"{-t.ndim} to {t.ndim - 1}")
    return axis % t.ndim


NAN_SCALE = 0xFF  # e8m0's NaN: the scale of a block that holds a NaN or an infinity


def scale_codes(absmax: torch.Tensor, element: str, rounding: str = "up") -> torch.Tensor:
    """e8m0 scale bytes for blocks with the given float32 absmax (NaN or inf: NAN_SCALE)."""
    _, emax, max_mantissa = ELEMENT_MAX[element]
    bits = absmax.float().contiguous().view(torch.int32)
    exponent = ((bits >> 23) & 0xFF) - 127
    code = exponent - emax + 127
    if rounding == "up":
        code = code + ((bits & 0x7FFFFF) > max_mantissa).int()
    code = torch.where(absmax > 0, code.clamp(0, 254), 0)
    return torch.where(exponent == 128, NAN_SCALE, code).to(torch.uint8)


def _pow2(codes: torch.Tensor) -> torch.Tensor:
    """2**(code - 127) as float32, built from its bits (exact); NaN for NAN_SCALE."""
    factor = torch.where(codes == 0, 0.5, torch.where(codes == NAN_SCALE, float("nan"), 1.0))
    return (codes.int().clamp(1, 254) << 23).view(torch.float32) * factor


def encode_e2m1(values: torch.Tensor) -> torch.Tensor:
    """float32 -> 4-bit e2m1 codes (sign in bit 3), nearest value, ties to even; saturates at 6."""
    a = values.abs()
    magnitude = ((a > 0.25).int() + (a >= 0.75).int() + (a > 1.25).int() + (a >= 1.75).int()
                 + (a > 2.5).int() + (a >= 3.5).int() + (a > 5.0).int())
    return (magnitude | (torch.signbit(values).int() << 3)).to(torch.uint8)


def decode_e2m1(codes: torch.Tensor) -> torch.Tensor:
    table = torch.tensor(E2M1_VALUES, device=codes.device)
    magnitude = table[(codes & 7).int()]
    return torch.where((codes & 8) != 0, -magnitude, magnitude)


def quantize_mx_torch(x: torch.Tensor, element: str, axis: int = -1, rounding: str = "up"):
    """Quantize ``x`` along ``axis`` to MX: returns (values, scales).

    values: uint8 codes packed two per byte along ``axis`` for e2m1 (that axis must be even), float8
    for e4m3/e5m2; scales: uint8 with ``cdiv(size, 32)`` entries along ``axis``.
    """
    _check(element, rounding)
    _check_tensor(x, "x")
    axis = _check_axis(axis, x, "x")
    size = x.shape[axis]
    if element == "e2m1" and size % 2:
        raise SpecError(f"e2m1 packs two values per byte along axis {axis}: its size must be even, got {size}")
    moved = x.float().movedim(axis, -1)
    padded_size = -(-size // MX_BLOCK) * MX_BLOCK
    blocks = torch.nn.functional.pad(moved, (0, padded_size - size)).unflatten(-1, (-1, MX_BLOCK))
    codes = scale_codes(blocks.abs().amax(-1), element, rounding)  # (amax: NaN where a block holds one)
    largest = ELEMENT_MAX[element][0]
    scaled = (blocks / _pow2(codes)[..., None]).clamp(-largest, largest)
    scaled = scaled.where(codes[..., None] != NAN_SCALE, 0.0).flatten(-2)[..., :size]
    if element == "e2m1":
        nibbles = encode_e2m1(scaled)
        values = nibbles[..., 0::2] | (nibbles[..., 1::2] << 4)
    else:
        values = scaled.to(FP8_DTYPES[element])
    return values.movedim(-1, axis), codes.movedim(-1, axis)


DEQUANTIZE_SLAB = 1 << 24  # output elements decoded at a time by dequantize_mx_torch


def dequantize_mx_torch(values: torch.Tensor, scales: torch.Tensor, element: str, axis: int = -1,
                        dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Inverse of :func:`quantize_mx_torch` (exact: every MX value is representable in float32).

    Decodes a slab of rows at a time (DEQUANTIZE_SLAB output elements), so that a model's weights take the
    output's memory plus a bounded temporary rather than several float32/int64 copies of the whole tensor.
    """
    _check(element)
    _check_tensor(values, "values")
    _check_tensor(scales, "scales")
    axis = _check_axis(axis, values, "values")
    rows = values.movedim(axis, -1)
    row_scales = scales.movedim(axis, -1)
    size = rows.shape[-1] * (2 if element == "e2m1" else 1)
    out = torch.empty((*rows.shape[:-1], size), dtype=dtype, device=values.device)
    n_rows = math.prod(rows.shape[:-1])  # (a -1 would be ambiguous for empty values)
    flat_rows, flat_scales = rows.reshape(n_rows, rows.shape[-1]), row_scales.reshape(n_rows, row_scales.shape[-1])
    flat_out = out.view(n_rows, size)
    step = max(1, DEQUANTIZE_SLAB // max(size, 1))
    for start in range(0, flat_rows.shape[0], step):
        flat_out[start:start + step] = _dequantize_rows(flat_rows[start:start + step],
                                                        flat_scales[start:start + step], element, size)
    return out.movedim(-1, axis)


def _dequantize_rows(rows: torch.Tensor, scales: torch.Tensor, element: str, size: int) -> torch.Tensor:
    """Float32 values of MX rows (the last axis is the quantized one)."""
    if element == "e2m1":
        decoded = decode_e2m1(torch.stack([rows & 0xF, rows >> 4], dim=-1).flatten(-2))
    else:
        decoded = rows.view(FP8_DTYPES[element]).float()
    return decoded * _pow2(scales).repeat_interleave(MX_BLOCK, dim=-1)[..., :size]
