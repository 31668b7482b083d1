"""Scaled operands: a matmul operand's values together with the scales that go with them, described once.

A :class:`ScaledOperand` names everything a kernel needs to read an operand: the tensor of values (packed e2m1
bytes and swizzled words included), its :class:`~ogsgen.spec.formats.NumericFormat` (element, scaling, block along
K, value layout), its logical K, its block scales (the scale element and block come from the format; the columns of
w that share one scale from the scales' layout) and its per-tensor scale (one float32 for the tensor, or one per
expert or batch entry). ``matmul_ogs`` builds one for x and one for w at its entry (``ogsgen.runtime.operands``,
from the tensors and the PrecisionConfig); the kernel parameters (``kernel_abi``) read them, so that nothing in
between learns a format from dtypes or shapes again.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .formats import NumericFormat


@dataclass(frozen=True)
class ScaledOperand:
    values: torch.Tensor
    format: NumericFormat
    k: int                                       # logical K: a packed or swizzled tensor's rows are not
    block_scales: torch.Tensor | None = None     # one per format.block_size values of K (0: all of K)
    scale_block_n: int = 1                       # w: columns that share one block scale (1, or 128 for 128 x 128)
    global_scale: torch.Tensor | None = None     # float32: one for the tensor, or one per expert or batch entry

    @property
    def global_scale_per_batch(self) -> bool:
        """One per-tensor scale per expert or batch entry, not one for the whole tensor."""
        return self.global_scale is not None and self.global_scale.numel() > 1

    def with_block_scales(self, values: torch.Tensor, block_scales: torch.Tensor) -> "ScaledOperand":
        """This operand's description for other values and scales of its format (an activation quantized in the
        call)."""
        return ScaledOperand(values, self.format, self.k, block_scales, self.scale_block_n, self.global_scale)
