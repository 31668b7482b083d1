"""triton_kernels' ``numerics_details.mxfp`` (shared by the three generations' packages): MX quantization and
dequantization by ogsgen's kernels (``ogsgen.numerics.quantize_mx`` and ``dequantize_mx``)."""
from enum import Enum

import torch

from ..errors import SpecError, UnsupportedError
from ..numerics import dequantize_mx, quantize_mx


class DequantScaleRoundingMode(Enum):
    ROUND_UP = 0
    ROUND_DOWN = 1


_ELEMENT = {torch.uint8: "e2m1", torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}


def _element(dtype, name: str) -> str:
    if dtype not in _ELEMENT:
        raise SpecError(f"{name} must be torch.uint8 (mxfp4, two values a byte), torch.float8_e4m3fn or "
                        f"torch.float8_e5m2, got {dtype}")
    return _ELEMENT[dtype]


def downcast_to_mxfp(src_tensor, out_quant_type, axis,
                     DEQUANT_SCALE_ROUNDING_MODE=DequantScaleRoundingMode.ROUND_UP):  # noqa: N803 (triton_kernels')
    """(values, scales) of ``src_tensor`` quantized along ``axis``: ``ogsgen.numerics.quantize_mx`` with
    ``rounding="up"`` (each block's scale the smallest power of two for which none of its values saturates); the
    quantized axis is contiguous in both results, as there."""
    if DEQUANT_SCALE_ROUNDING_MODE != DequantScaleRoundingMode.ROUND_UP:
        raise UnsupportedError(f"downcast_to_mxfp: DEQUANT_SCALE_ROUNDING_MODE={DEQUANT_SCALE_ROUNDING_MODE} has no "
                               f"ogsgen counterpart; leave it ROUND_UP, or call ogsgen.numerics.quantize_mx(x, "
                               f"element, axis, rounding='down') for the OCP rule")
    return quantize_mx(src_tensor, _element(out_quant_type, "out_quant_type"), axis=axis, rounding="up")


def upcast_from_mxfp(tensor, scale, target_dtype, axis):
    """The values of MX ``tensor`` with its ``scale``, quantized along ``axis``, as ``target_dtype``."""
    if not isinstance(tensor, torch.Tensor):
        raise SpecError(f"upcast_from_mxfp: tensor must be a torch.Tensor, got {type(tensor).__name__}")
    return dequantize_mx(tensor, scale, _element(tensor.dtype, "tensor.dtype"), axis=axis, dtype=target_dtype)
