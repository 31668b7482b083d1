"""Where ogsgen's kernels run: a CUDA device, or the CPU through Triton's interpreter (TRITON_INTERPRET=1)."""
from __future__ import annotations

import os

import torch

from .errors import SpecError


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def check_kernel_device(tensor: torch.Tensor, name: str) -> None:
    """Raise SpecError unless ``tensor`` lives where the kernels run."""
    device = tensor.device
    if device.type == "cuda" or (device.type == "cpu" and interpreting()):
        return
    where = "a CUDA device" + (" (or the CPU, as Triton's interpreter is on)" if interpreting() else
                               " (on the CPU only through Triton's interpreter, TRITON_INTERPRET=1)")
    raise SpecError(f"{name} is on {device}; ogsgen's kernels run on {where}: move it there")
