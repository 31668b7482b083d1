"""Flexpoint: fp8 (or fp16) values with fp32 scales held in device tensors."""
import torch

from ..spec.formats import ELEMENTS

_MAX_FINITE = {e.torch_dtype: e.max_finite for e in ELEMENTS.values() if e.torch_dtype.is_floating_point}


def max_finite(dtype: torch.dtype) -> float:
    return _MAX_FINITE[dtype]


def actual_scale_torch(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """What an output's actual_scale records: max |values| / max_finite(dtype), NaN counting as inf."""
    magnitude = torch.where(torch.isnan(values), float("inf"), values.float().abs())
    return (magnitude.max() if magnitude.numel() else torch.zeros((), device=values.device)) / max_finite(dtype)
