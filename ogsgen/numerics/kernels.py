"""MX quantization and dequantization on the device (Triton); ``ogsgen.numerics.mx`` holds the torch references."""
from __future__ import annotations

import math
import torch
import triton
import triton.language as tl

from ..devices import check_kernel_device
from ..errors import SpecError
from ..spec.formats import ELEMENTS, FP8_ELEMENTS
from . import interpreter
from .codecs import Codec
from .jit import pack_e2m1_rows, scale_mx_rows, upcast_mx_rows
from .mx import ELEMENT_MAX, FP8_DTYPES, MX_BLOCK, _check, _check_axis, _check_tensor, dequantize_mx_torch

_TL_FP8 = {name: getattr(tl, ELEMENTS[name].tl_dtype.removeprefix("tl.")) for name in FP8_ELEMENTS}


@triton.jit
def _quantize_rows(X, Values, Scales, n_rows, size, stride_x, stride_v, stride_s,
                   ELEMENT: tl.constexpr, EMAX: tl.constexpr, MAX_MANTISSA: tl.constexpr, MAX_VALUE: tl.constexpr,
                   ROUND_UP: tl.constexpr, OUT_DTYPE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_S + tl.arange(0, BLOCK_S)
    mask_r = rows < n_rows
    tile = tl.load(X + rows.to(tl.int64)[:, None] * stride_x + cols[None, :],
                   mask=mask_r[:, None] & (cols[None, :] < size), other=0.0).to(tl.float32)
    scaled, scales = scale_mx_rows(tile, EMAX, MAX_MANTISSA, MAX_VALUE, ROUND_UP)
    scale_cols = tl.program_id(1) * (BLOCK_S // 32) + tl.arange(0, BLOCK_S // 32)
    tl.store(Scales + rows[:, None] * stride_s + scale_cols[None, :], scales,
             mask=mask_r[:, None] & (scale_cols[None, :] < tl.cdiv(size, 32)))
    if ELEMENT == "e2m1":
        byte_cols = tl.program_id(1) * (BLOCK_S // 2) + tl.arange(0, BLOCK_S // 2)
        tl.store(Values + rows.to(tl.int64)[:, None] * stride_v + byte_cols[None, :], pack_e2m1_rows(scaled),
                 mask=mask_r[:, None] & (byte_cols[None, :] < size // 2))
    else:
        tl.store(Values + rows.to(tl.int64)[:, None] * stride_v + cols[None, :], scaled.to(OUT_DTYPE),
                 mask=mask_r[:, None] & (cols[None, :] < size))


@triton.jit
def _dequantize_rows(Values, Scales, Out, n_rows, size, stride_v, stride_s, stride_o,
                     ELEMENT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr):
    # The matmul's upcast helper, so that this reference path and the kernels dequantize alike.
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    mask_r = rows < n_rows
    if ELEMENT == "e2m1":
        value_cols = tl.program_id(1) * (BLOCK_S // 2) + tl.arange(0, BLOCK_S // 2)
        values = tl.load(Values + rows.to(tl.int64)[:, None] * stride_v + value_cols[None, :],
                         mask=mask_r[:, None] & (value_cols[None, :] < size // 2), other=0)
    else:
        value_cols = tl.program_id(1) * BLOCK_S + tl.arange(0, BLOCK_S)
        values = tl.load(Values + rows.to(tl.int64)[:, None] * stride_v + value_cols[None, :],
                         mask=mask_r[:, None] & (value_cols[None, :] < size), other=0.0)
    scale_cols = tl.program_id(1) * (BLOCK_S // 32) + tl.arange(0, BLOCK_S // 32)
    scales = tl.load(Scales + rows[:, None] * stride_s + scale_cols[None, :],
                     mask=mask_r[:, None] & (scale_cols[None, :] < tl.cdiv(size, 32)), other=0)
    out = upcast_mx_rows(values, scales, ELEMENT, Out.dtype.element_ty)
    cols = tl.program_id(1) * BLOCK_S + tl.arange(0, BLOCK_S)
    tl.store(Out + rows.to(tl.int64)[:, None] * stride_o + cols[None, :], out,
             mask=mask_r[:, None] & (cols[None, :] < size))


_BLOCK_R, _BLOCK_S = 16, 128


def _prepare_interpreter(t: torch.Tensor, element: str) -> None:
    """On the CPU: Triton's interpreter corrected before the launch, as matmul_ogs does (uncorrected, it rounds fp32
    to fp8 and reads fp8's NaN wrongly, and cannot run the e2m1 upcast's PTX)."""
    if not t.is_cuda:
        interpreter.prepare((element,))


def quantize_mx(x: torch.Tensor, element: str, axis: int = -1, rounding: str = "up"):
    """Quantize ``x`` along ``axis`` to MX on its device: (values, scales), as ``quantize_mx_torch``."""
    _check(element, rounding)
    _check_tensor(x, "x")
    axis = _check_axis(axis, x, "x")
    check_kernel_device(x, "x")
    size = x.shape[axis]
    if element == "e2m1" and size % 2:
        raise SpecError(f"e2m1 packs two values per byte along axis {axis}: its size must be even, got {size}")
    lead = x.movedim(axis, -1).shape[:-1]
    # (-1 is ambiguous for empty x; resolve_neg: a lazily negated view's memory, which the kernel reads, holds -x)
    rows = x.movedim(axis, -1).reshape(math.prod(lead), size).contiguous().resolve_neg()
    n_rows = rows.shape[0]
    values = torch.empty((n_rows, size // 2 if element == "e2m1" else size), device=x.device,
                         dtype=torch.uint8 if element == "e2m1" else FP8_DTYPES[element])
    scales = torch.empty((n_rows, -(-size // MX_BLOCK)), device=x.device, dtype=torch.uint8)
    largest, emax, max_mantissa = ELEMENT_MAX[element]
    if n_rows and size:
        _prepare_interpreter(x, element)
        grid = (triton.cdiv(n_rows, _BLOCK_R), triton.cdiv(size, _BLOCK_S))
        _quantize_rows[grid](rows, values, scales, n_rows, size, rows.stride(0), values.stride(0), scales.stride(0),
                             ELEMENT=element, EMAX=emax, MAX_MANTISSA=max_mantissa, MAX_VALUE=largest,
                             ROUND_UP=rounding == "up", OUT_DTYPE=_TL_FP8.get(element, tl.uint8),
                             BLOCK_R=_BLOCK_R, BLOCK_S=_BLOCK_S)
    return (values.reshape(*lead, values.shape[-1]).movedim(-1, axis),
            scales.reshape(*lead, scales.shape[-1]).movedim(-1, axis))


def dequantize_mx(values: torch.Tensor, scales: torch.Tensor, element: str, axis: int = -1,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Inverse of :func:`quantize_mx` on the device, as ``dequantize_mx_torch``."""
    _check(element)
    _check_tensor(values, "values")
    _check_tensor(scales, "scales")
    axis = _check_axis(axis, values, "values")
    check_kernel_device(values, "values")
    if scales.device != values.device:
        raise SpecError(f"scales are on {scales.device} but values are on {values.device}; move both to one device")
    packed = values.movedim(axis, -1)
    size = packed.shape[-1] * (2 if element == "e2m1" else 1)
    n_rows = math.prod(packed.shape[:-1])
    rows = packed.reshape(n_rows, packed.shape[-1]).contiguous()
    row_scales = scales.movedim(axis, -1).reshape(n_rows, scales.shape[axis]).contiguous()
    out = torch.empty((rows.shape[0], size), device=values.device, dtype=dtype)
    if rows.shape[0] and size:
        _prepare_interpreter(values, element)
        grid = (triton.cdiv(rows.shape[0], _BLOCK_R), triton.cdiv(size, _BLOCK_S))
        _dequantize_rows[grid](rows, row_scales, out, rows.shape[0], size, rows.stride(0), row_scales.stride(0),
                               out.stride(0), ELEMENT=element, BLOCK_R=_BLOCK_R, BLOCK_S=_BLOCK_S)
    return out.reshape(*packed.shape[:-1], size).movedim(-1, axis)


def _scale_mx_rows_args(element: str) -> tuple[str, ...]:
    """scale_mx_rows's constants for an output of ``element`` (scales rounded up: no value saturates), as source."""
    largest, emax, max_mantissa = ELEMENT_MAX[element]
    return str(emax), hex(max_mantissa), repr(largest), "True"


def _quantize_weights(rows: torch.Tensor, fmt, rounding: str = "up"):
    """MX values and e8m0 scales of (..., N, K) floats, quantized along K on their device."""
    values, scales = quantize_mx(rows.float().contiguous(), fmt.element, axis=-1, rounding=rounding)
    return values, scales, None


CODEC = Codec(_quantize_weights,
              lambda values, block_scales, fmt: dequantize_mx_torch(values.mT, block_scales.mT, fmt.element).mT,
              options=("rounding",), runs_kernels=True, reader=upcast_mx_rows, writer=scale_mx_rows,
              writer_args=lambda fmt: _scale_mx_rows_args(fmt.element))
