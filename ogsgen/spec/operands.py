"""Scaled operands: a matmul operand's values together with the scales that go with them, described once.

A :class:`ScaledOperand` names everything a kernel needs to read an operand: the tensor of values (packed e2m1
bytes and swizzled words included), its :class:`~ogsgen.spec.formats.NumericFormat` (element, scaling, block along
K, value layout), its logical K, its block scales (the scale element and block come from the format; the columns of
w that share one scale from the scales' layout) and its per-tensor scale (one float32 for the tensor, or one per
expert or batch entry). ``matmul_ogs`` takes w as one (:meth:`ScaledOperand.of` declares it, and
``prepare_expert_weights(...).operand`` is one), or builds x's and w's at its entry from plain tensors and the
PrecisionConfig (``ogsgen.runtime.operands``); the kernel parameters (``kernel_abi``) read them, so that nothing in
between learns a format from dtypes or shapes again.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import SpecError, SpecTypeError
from .formats import BY_NAME, MXFP4, SWIZZLED_MXFP4, NumericFormat, format_named


@dataclass(frozen=True)
class ScaledOperand:
    values: torch.Tensor                         # (a SwizzledMxValues, as declared, until matmul_ogs's entry)
    format: NumericFormat
    k: int                                       # logical K: a packed or swizzled tensor's rows are not
    block_scales: torch.Tensor | None = None     # one per format.block_size values of K (0: all of K)
    scale_block_n: int = 1                       # w: columns that share one block scale (1, or 128 for 128 x 128)
    global_scale: torch.Tensor | None = None     # float32: one for the tensor, or one per expert or batch entry

    @classmethod
    def of(cls, values, format: str | NumericFormat, *, block_scales: torch.Tensor | None = None,
           global_scale: torch.Tensor | None = None) -> "ScaledOperand":
        """Weights declared by their format, for ``matmul_ogs(x, w, ...)``: nothing is inferred from dtypes.

        ``values`` (..., K, N) as the format stores them: packed e2m1 bytes (uint8 (..., K // 2, N), two values a
        byte along K, the low nibble first), a ``SwizzledMxValues`` (mxfp4), or fp8. ``format`` names one of
        ``ogsgen.spec.formats.BY_NAME`` ("mxfp4", "nvfp4", "mxfp8e4m3", "fp8e4m3_b128", "fp8e4m3_channel",
        "fp8e4m3", ...). ``block_scales``: e8m0 bytes (uint8), e4m3 (float8_e4m3fn) or float32, as the format's
        scale element, (..., cdiv(K, block), N) (fp8e4m3_b128: or (..., cdiv(K, 128), cdiv(N, 128)); channel:
        (..., 1, N)). ``global_scale``: float32, one element or one per expert. Shapes are checked against the
        call's x by ``matmul_ogs``, whose errors name ``w.block_scales`` and ``w.global_scale``.
        """
        fmt, swizzled = _checked(values, format, block_scales, global_scale, "w")
        if swizzled:
            return cls(values, SWIZZLED_MXFP4[values.layout], values.k, block_scales, global_scale=global_scale)
        return cls(values, fmt, fmt.logical_k(values.shape[-2]), block_scales,
                   fmt.scale_block_n(block_scales, values.shape[-1]), global_scale)

    @classmethod
    def activations(cls, values: torch.Tensor, format: str | NumericFormat, *,
                    block_scales: torch.Tensor | None = None,
                    global_scale: torch.Tensor | None = None) -> "ScaledOperand":
        """Activations declared by their format, for ``matmul_ogs(x, w, ...)``: x's fp8 values (..., M, K) with the
        scales that go with them, in place of ``precision_config.act_scale`` and ``flex_ctx.lhs_data.scale``.
        ``format``: "mxfp8e4m3" / "mxfp8e5m2" (``block_scales``: uint8 e8m0 (..., M, cdiv(K, 32)), as
        ``ogsgen.numerics.quantize_mx(x, 'e4m3')`` makes them), "fp8e4m3_b128" (float32 (M, cdiv(K, 128))) or
        "fp8e4m3_channel" (float32 (M, 1): one per row), as ``ogsgen.numerics.quantize_fp8(x, (1, 128))`` and
        ``(1, 0)`` make them, or "fp8e4m3" / "fp8e5m2" with a float32 ``global_scale`` of one element.
        ``matmul_ogs`` checks them against the call (its errors name ``x.block_scales`` and ``x.global_scale``)
        and that w's format pairs with this one."""
        fmt, _ = _checked(values, format, block_scales, global_scale, "x")
        return cls(values, fmt, values.shape[-1], block_scales, global_scale=global_scale)

    def dequantize_rows(self) -> torch.Tensor:
        """The float32 activations (..., M, K) of an operand declared with :meth:`activations`."""
        from ..numerics.operands import dequantize_operand  # (numerics imports the spec layer)
        scales = None if self.block_scales is None else self.block_scales.mT
        return dequantize_operand(ScaledOperand(self.values.mT, self.format, self.k, scales, 1,
                                                self.global_scale)).mT

    def dequantize(self) -> torch.Tensor:
        """The float32 weights (..., K, N) the kernels compute with (``matmul_ogs_torch`` takes a ScaledOperand w
        through this)."""
        from ..numerics.operands import dequantize_operand  # (numerics imports the spec layer)
        return dequantize_operand(self)

    @property
    def global_scale_per_batch(self) -> bool:
        """One per-tensor scale per expert or batch entry, not one for the whole tensor."""
        return self.global_scale is not None and self.global_scale.numel() != 1  # (none for no experts)

    def with_block_scales(self, values: torch.Tensor, block_scales: torch.Tensor) -> "ScaledOperand":
        """This operand's description for other values and scales of its format (an activation quantized in the
        call)."""
        return ScaledOperand(values, self.format, self.k, block_scales, self.scale_block_n, self.global_scale)


def _checked(values, format, block_scales, global_scale, operand: str) -> tuple[NumericFormat, bool]:
    """(the format, whether the values are swizzled) of a declared operand, or an error naming what is wrong."""
    from ..numerics.layouts import SwizzledMxValues  # (numerics imports the spec layer)
    fmt = format_named(format) if isinstance(format, str) else format
    if not isinstance(fmt, NumericFormat):
        raise SpecTypeError(f"format must be a format name or a NumericFormat, got {type(format).__name__}")
    if fmt.scaling == "none":
        raise SpecError(f"format {fmt.name!r} has no scales: pass the tensor itself as {operand}; the scaled formats "
                        f"are {sorted(name for name, f in BY_NAME.items() if f.scaling != 'none')}")
    swizzled = isinstance(values, SwizzledMxValues)
    if swizzled and operand == "x":
        raise SpecTypeError("x's values must be a torch.Tensor: only w has swizzled layouts")
    if swizzled != (fmt.layout != "strided") and not (swizzled and fmt == MXFP4):
        raise SpecError(f"values in a swizzled layout are a SwizzledMxValues (ogsgen.swizzle_mx_values) of "
                        f"mxfp4 values; format {fmt.name!r} takes a tensor of {fmt.torch_dtype}")
    if not swizzled:
        if not isinstance(values, torch.Tensor):
            raise SpecTypeError(f"values must be a torch.Tensor or SwizzledMxValues, got {type(values).__name__}")
        if values.dtype != fmt.torch_dtype or values.ndim not in (2, 3):
            shape = "(..., M, K)" if operand == "x" else f"(..., K{' // 2' if fmt.element == 'e2m1' else ''}, N)"
            raise SpecError(f"{fmt.name} values must be {fmt.torch_dtype} of 2 or 3 dimensions {shape}, got "
                            f"{values.dtype} of shape {tuple(values.shape)}")
    for name, tensor, needed in (("block_scales", block_scales, fmt.has_block_scales),
                                 ("global_scale", global_scale, fmt.has_global_scale and fmt.has_block_scales)):
        if tensor is not None and not isinstance(tensor, torch.Tensor):
            raise SpecTypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
        if needed and tensor is None:
            raise SpecError(f"{fmt.name} {'activations' if operand == 'x' else 'weights'} need their {name}: pass "
                            f"{name}=...")
    if block_scales is not None and not fmt.has_block_scales:
        raise SpecError(f"{fmt.name} has no block scales: drop block_scales")
    if global_scale is not None and not fmt.has_global_scale:
        raise SpecError(f"{fmt.name} has no per-tensor scale: drop global_scale")
    return fmt, swizzled
