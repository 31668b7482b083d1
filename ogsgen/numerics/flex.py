"""Flexpoint: fp8 (or fp16) values with fp32 scales held in device tensors."""
import torch

from ..spec.formats import ELEMENTS
from .codecs import Codec

_MAX_FINITE = {e.torch_dtype: e.max_finite for e in ELEMENTS.values() if e.torch_dtype.is_floating_point}


def max_finite(dtype: torch.dtype) -> float:
    return _MAX_FINITE[dtype]


def actual_scale_torch(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """What an output's actual_scale records: max |values| / max_finite(dtype), NaN counting as inf."""
    magnitude = torch.where(torch.isnan(values), float("inf"), values.float().abs())
    return (magnitude.max() if magnitude.numel() else torch.zeros((), device=values.device)) / max_finite(dtype)


def _quantize_per_expert(rows: torch.Tensor, fmt):
    """fp8 values of (E, N, K) floats with one scale per expert: its absmax over the largest finite value."""
    rows = rows.float().contiguous()
    largest = ELEMENTS[fmt.element].max_finite
    per_expert = rows.flatten(1)
    absmax = per_expert.abs().amax(dim=1) if per_expert.shape[1] else per_expert.new_zeros(len(per_expert))
    scale = (absmax / largest).clamp_min(torch.finfo(torch.float32).tiny)
    return (rows / scale[:, None, None]).to(fmt.torch_dtype), None, scale


CODEC = Codec(_quantize_per_expert, lambda values, block_scales, fmt: values.float())
