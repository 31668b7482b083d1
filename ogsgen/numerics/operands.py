"""The float32 weights a ScaledOperand (``ogsgen.spec.operands``) means: what a kernel computes with."""
from __future__ import annotations

import torch

from ..spec.operands import ScaledOperand
from .codecs import codec_of
from .layouts import SwizzledMxValues, unswizzle_mx_values


def dequantize_operand(op: ScaledOperand) -> torch.Tensor:
    """float32 (..., K, N): each value times its block scale (its format's codec: exact for MX, NVFP4 and fp8
    block scales), then times its per-tensor (or per-expert) scale, one rounding."""
    values = unswizzle_mx_values(op.values) if isinstance(op.values, SwizzledMxValues) else op.values
    dense = codec_of(op.format).dequantize(values, op.block_scales, op.format)
    if op.global_scale is not None:
        g = op.global_scale.float()
        dense = dense * (g.reshape(-1, 1, 1) if op.global_scale_per_batch else g.reshape(()))
    return dense
