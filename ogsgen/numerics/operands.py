"""The float32 weights a ScaledOperand (``ogsgen.spec.operands``) means: what a kernel computes with."""
from __future__ import annotations

import torch

from ..spec.operands import ScaledOperand
from .fp8_blocks import FP8_BLOCK, dequantize_fp8_torch
from .layouts import SwizzledMxValues, unswizzle_mx_values
from .mx import dequantize_mx_torch
from .nvfp4 import dequantize_nvfp4


def dequantize_operand(op: ScaledOperand) -> torch.Tensor:
    """float32 (..., K, N): each value times its block scale and its per-tensor (or per-expert) scale, by the
    format's own dequantization (exact for MX, NVFP4 before its global scale, and fp8 block scales)."""
    fmt, values, scales = op.format, op.values, op.block_scales
    if isinstance(values, SwizzledMxValues):
        values = unswizzle_mx_values(values)
    if fmt.scaling == "block_e4m3":
        return dequantize_nvfp4(values.mT, scales.mT, op.global_scale).mT
    if fmt.scaling == "block_e8m0":
        return dequantize_mx_torch(values.mT, scales.mT, fmt.element).mT
    if fmt.scaling == "block_f32":
        return dequantize_fp8_torch(values, scales, (FP8_BLOCK if fmt.block_size else 0, op.scale_block_n))
    dense = values.float()
    if op.global_scale is not None:
        g = op.global_scale.float()
        dense = dense * (g.reshape(-1, 1, 1) if op.global_scale_per_batch else g.reshape(()))
    return dense
