"""A scaling's codec: how torch quantizes floats to its formats, what float32 values they mean, and the in-kernel
reader that upcasts them.

The format's scaling names the module that defines its ``CODEC`` (``ogsgen.spec.formats.SCALINGS``), so that
preparing weights (``ogsgen.moe.weights``), dequantizing operands (``ogsgen.numerics.operands``) and the references
find a scaling's code through its format, not through branches on format names."""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from ..errors import SpecError
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


def codec_of(fmt: NumericFormat) -> Codec:
    module = fmt.scheme.codec
    if module is None:
        raise SpecError(f"format {fmt.name!r} is not scaled: it has no codec")
    return importlib.import_module(f"{__package__}.{module}").CODEC
