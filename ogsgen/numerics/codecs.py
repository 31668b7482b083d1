"""A scaling's codec: how torch quantizes floats to its formats, what float32 values they mean, the in-kernel
reader that upcasts them and the in-kernel writer that quantizes an output tile to them.

The format's scaling names the module that defines its ``CODEC`` (``ogsgen.spec.formats.SCALINGS``), so that
preparing weights (``ogsgen.moe.weights``), dequantizing operands (``ogsgen.numerics.operands``) and the references
find a scaling's code through its format, not through branches on format names."""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

import torch

from ..errors import SpecError, SpecTypeError
from ..spec.formats import NumericFormat


@dataclass(frozen=True)
class Codec:
    # (rows (..., N, K) floats, K contiguous or not; format; **options) -> (values (..., N, stored K),
    # block scales (..., N or N blocks, K blocks) or None, per-tensor scale (E,) or None)
    quantize: Callable
    # (values (..., stored K, N); block scales (..., K blocks, N or N blocks) or None; format) -> float32
    # (..., K, N): each value times its block scale, before any per-tensor scale
    dequantize: Callable
    options: tuple[str, ...] = ()   # quantize's keyword options (prepare_expert_weights passes them through)
    runs_kernels: bool = False      # quantize launches Triton kernels: the floats must be where kernels run
    # The @triton.jit function a kernel upcasts a tile of strided values with, for scales applied to the values:
    # reader(values (R, stored S), block scales (R, S // block), ELEMENT, OUT_DTYPE) -> (R, S) of OUT_DTYPE
    reader: object = None
    # The @triton.jit function a kernel quantizes an output tile with, for formats an output may take (block scales
    # along N): writer(tile (R, C) float32, columns past the output 0, *writer_args) -> (values (R, C) float32
    # clamped to the element's range, ready for the cast; block scales (R, C // format.block_size)); writer_args(
    # format): its further (constexpr) arguments as source text for the generated kernel
    writer: object = None
    writer_args: Callable = lambda fmt: ()


def codec_of(fmt: NumericFormat) -> Codec:
    module = fmt.scheme.codec
    if module is None:
        raise SpecError(f"format {fmt.name!r} is not scaled: it has no codec")
    return importlib.import_module(f"{__package__}.{module}").CODEC


def check_global_scale(global_scale, lead: tuple, name: str = "global_scale") -> torch.Tensor:
    """A per-tensor scale as a tensor that broadcasts over blocks of shape (*lead, n_blocks, block): a scalar, or
    one value per expert along dim 0 of a tensor with at least two dims (E, ..., K)."""
    if not isinstance(global_scale, torch.Tensor):
        raise SpecTypeError(f"{name} must be a torch.Tensor, got {type(global_scale).__name__}; pass "
                            f"torch.tensor(...)")
    if global_scale.dtype != torch.float32:
        raise SpecError(f"{name} must be torch.float32, got {global_scale.dtype}; a checkpoint's per-tensor scale "
                        f"(ModelOpt's weight_scale_2) is float32: pass it .float(), or torch.tensor(scale, "
                        f"dtype=torch.float32)")
    if global_scale.numel() == 1 and global_scale.ndim <= 1:
        per_expert = global_scale.reshape(())
    elif global_scale.ndim == 1 and len(lead) >= 1 and global_scale.shape[0] == lead[0]:
        per_expert = global_scale.reshape(-1, *[1] * (len(lead) + 1))
    else:
        experts = f"({lead[0]},)" if lead else "none: a tensor of one row has no experts"
        raise SpecError(f"{name} must be a scalar (one per tensor) or hold one value per expert along dim 0 "
                        f"(shape {experts}), got shape {tuple(global_scale.shape)}")
    if not bool(torch.isfinite(global_scale).all()):
        raise SpecError(f"{name} holds NaN or infinity ({global_scale.tolist()}): a global scale must be finite; "
                        f"check the checkpoint's per-tensor scale or the amax it was computed from")
    return per_expert
