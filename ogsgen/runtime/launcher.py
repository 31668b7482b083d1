"""Launch generated kernels with less host work per call than ``kernel[grid](**args)``.

Triton's launch binds and specializes every argument, formats the options into a cache key and
builds launch metadata on every call: tens of microseconds for our 30-argument kernels. Which
compiled binary a call needs depends only on the constexpr values, the tensors' dtypes and 16-byte
alignment, and the integers' specialization classes (1, a multiple of 16, beyond int32). ogsgen
keys its own cache on exactly that, lets Triton compile (and launch) on a miss, and afterwards calls
the compiled kernel's launcher directly.

The first call of each key, calls under Triton's interpreter, calls while launch hooks are installed
(profilers) and Triton versions without this launcher interface take Triton's own path.
"""
from __future__ import annotations

import os
import threading

import torch
from triton import knobs
from triton.runtime.driver import driver

_INT32 = range(-2**31, 2**31)
_lock = threading.Lock()
_compiled: dict[tuple, object] = {}
_constexpr_flags: dict[object, tuple[bool, ...]] = {}


def _hooks_installed() -> bool:
    hooks = (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook)
    return any(getattr(hook, "calls", hook) for hook in hooks)


def _specialization_key(kernel, values: tuple, options: dict, device: int) -> tuple:
    flags = _constexpr_flags.get(kernel)
    if flags is None:
        flags = _constexpr_flags.setdefault(kernel, tuple(p.is_constexpr for p in kernel.params))
    key = [kernel, device, *options.values()]
    for is_constexpr, value in zip(flags, values):
        if is_constexpr or value is None or isinstance(value, (bool, str)):
            key.append(value)
        elif isinstance(value, torch.Tensor):
            key.append(value.dtype)
            key.append(value.data_ptr() % 16 == 0)
        elif isinstance(value, int):
            key.append(1 if value == 1 else 16 if value % 16 == 0 else 0)
            key.append(value in _INT32)
        elif isinstance(value, float):
            key.append(float)
        else:  # anything else (a callable constexpr passed positionally) by identity
            key.append(value)
    return tuple(key)


def launch(kernel, grid: tuple[int, int, int], args: dict, **options) -> None:
    """``kernel[grid](**args, **options)`` (options: num_warps, num_stages), cached. ``args`` names every
    parameter of the kernel."""
    values = tuple(args[name] for name in kernel.arg_names)  # a missing argument fails here, on every path
    if os.environ.get("TRITON_INTERPRET", "0") == "1" or _hooks_installed():
        kernel[grid](**args, **options)
        return
    device = torch.cuda.current_device()
    key = _specialization_key(kernel, values, options, device)
    compiled = _compiled.get(key)
    if compiled is None:
        compiled = kernel[grid](**args, **options)
        if all(hasattr(compiled, name) for name in ("run", "function", "packed_metadata")):
            with _lock:
                _compiled[key] = compiled
        return
    run = compiled.run  # the first access loads the binary and sets .function
    run(grid[0], grid[1], grid[2], driver.active.get_current_stream(device), compiled.function,
        compiled.packed_metadata, None, None, None, *values)
