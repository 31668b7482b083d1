"""Flexpoint: fp8 (or fp16) values with fp32 scales held in device tensors."""
import torch

_MAX_FINITE = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0, torch.float16: 65504.0,
               torch.bfloat16: 3.3895313892515355e38, torch.float32: 3.4028234663852886e38}


def max_finite(dtype: torch.dtype) -> float:
    return _MAX_FINITE[dtype]


def actual_scale_torch(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """What an output's actual_scale records: max |values| / max_finite(dtype), NaN counting as inf."""
    magnitude = torch.where(torch.isnan(values), float("inf"), values.float().abs())
    return (magnitude.max() if magnitude.numel() else torch.zeros((), device=values.device)) / max_finite(dtype)
