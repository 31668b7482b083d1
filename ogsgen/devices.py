"""Where ogsgen's kernels run: a CUDA device, described once by its :class:`Target`, or the CPU through Triton's
interpreter (TRITON_INTERPRET=1). Every capability decision (TMA, wgmma, fp8, the SM count) reads a Target."""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache

import torch
import triton
from triton.runtime.interpreter import InterpretedFunction

from .errors import SpecError, UnsupportedError


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def _decorated_with_ogsgen():
    # Triton reads TRITON_INTERPRET as it decorates a function: this one's type says whether ogsgen's Triton
    # functions, made as their modules (which import this one) were imported, run in the interpreter.
    pass


def check_interpreter_mode() -> None:
    """Raise SpecError where TRITON_INTERPRET=1 was set after ogsgen's Triton functions were made, which would leave
    them compiled for a GPU, run by the interpreter: an opaque InterpreterError."""
    if interpreting() and not isinstance(_decorated_with_ogsgen, InterpretedFunction):
        raise SpecError("TRITON_INTERPRET=1 was set after ogsgen's Triton functions were made, and Triton reads it as "
                        "it makes them, so they cannot run in its interpreter: set it before Python imports triton "
                        "and ogsgen's kernels (`TRITON_INTERPRET=1 python script.py`; in a notebook, "
                        "os.environ['TRITON_INTERPRET'] = '1' in the first cell, then restart the kernel)")


@dataclass(frozen=True)
class Target:
    """What ogsgen's kernels may use on one NVIDIA GPU."""
    name: str
    capability: tuple[int, int]
    sm_count: int  # the heuristic sizes grids and persistent launches by it

    @property
    def tma(self) -> bool:
        """Tensor-memory-accelerator loads and stores (Hopper and later): the persistent kernels use them."""
        return self.capability >= (9, 0)

    @property
    def wgmma(self) -> bool:
        """sm_90's asynchronous MMA with a register operand, which the ptxas hazard check is about."""
        return self.capability[0] == 9

    @property
    def fp8(self) -> bool:
        """fp8 tensor-core MMAs (Ada, Hopper and later)."""
        return self.capability >= (8, 9)

    @property
    def register_operand_mma(self) -> bool:
        """16-bit MMAs that take an operand from registers (Ampere and later): the mxfp4 hopper layout's."""
        return self.capability >= (8, 0)


def target(device: torch.device | int | None = None) -> Target:
    """The Target of a CUDA device (an index, a torch.device, or None for the current one)."""
    if isinstance(device, torch.device):
        device = device.index
    index = torch.cuda.current_device() if device is None else device
    # torch.compile traces this (routing checks its tensors' device): Dynamo would trace through the cache wrapper
    # and warn of "silent incorrectness" at a user's compile, so a traced call reads the device without it
    return (_describe if torch.compiler.is_compiling() else _target)(index)


def _describe(index: int) -> Target:
    if torch.version.hip is not None:
        # ROCm's torch.cuda reports an MI300 as capability (9, 4), which would read as Hopper
        raise UnsupportedError(f"ogsgen's kernels are written for NVIDIA GPUs (PTX, TMA, wgmma); this torch runs on "
                               f"ROCm {torch.version.hip}: use triton_kernels or another ROCm MoE kernel there")
    properties = torch.cuda.get_device_properties(index)
    return Target(properties.name, (properties.major, properties.minor), properties.multi_processor_count)


_target = lru_cache(maxsize=None)(_describe)


def check_kernel_device(tensor: torch.Tensor, name: str) -> None:
    """Raise SpecError unless ``tensor`` lives where the kernels run (UnsupportedError on a GPU they do not serve)."""
    device = tensor.device
    if device.type == "cuda":
        target(device)
        return
    if device.type == "cpu" and interpreting():
        check_interpreter_mode()
        return
    where = "a CUDA device" + (" (or the CPU, as Triton's interpreter is on)" if interpreting() else
                               " (on the CPU only through Triton's interpreter: TRITON_INTERPRET=1, set before triton "
                               "is imported)")
    raise SpecError(f"{name} is on {device}; ogsgen's kernels run on {where}: move it there")
