"""Launch generated kernels with less host work per call than ``kernel[grid](**args)``.

Triton's launch binds and specializes every argument, formats the options into a cache key and
builds launch metadata on every call: tens of microseconds for our 30-argument kernels. Which
compiled binary a call needs depends only on the constexpr values, the tensors' dtypes and 16-byte
alignment, and the integers' specialization classes (1, a multiple of 16, beyond int32). ogsgen
keys its own cache on a finer key (see ``_specialization_key``), lets Triton compile (and launch) on
a miss, and afterwards calls the compiled kernel's launcher directly.

The first call of each key, calls under Triton's interpreter, calls while launch hooks are installed
(profilers) and Triton releases whose launcher convention was not checked take Triton's own path.
"""
from __future__ import annotations

import threading
from contextlib import nullcontext

import torch
import triton
from triton import knobs
from triton.runtime.driver import driver
from triton.runtime.jit import JITFunction
from triton.tools.tensor_descriptor import TensorDescriptor

# CompiledKernel.run(grid x, y, z, stream, function, packed metadata, launch metadata, enter hook, exit hook,
# *arguments): the convention of the releases whose runtime/jit.py was read (3.6, 3.9); others are not assumed.
_CHECKED_RELEASES = ((3, 6), (3, 9))
_FAST_PATH = tuple(int(part) for part in triton.__version__.split(".")[:2]) in _CHECKED_RELEASES

_MAX_ENTRIES = 8192  # distinct integer values make distinct keys; a pathological caller only refills the cache
_lock = threading.Lock()
_compiled: dict[tuple, object] = {}
_param_kinds: dict[object, tuple[int, ...]] = {}
_verified: set[str] = set()  # hashes of the binaries ``verify`` accepted
_CONSTEXPR, _SPECIALIZED, _UNSPECIALIZED = 0, 1, 2


def hooks_installed() -> bool:
    """Whether launch hooks (profilers) are installed, which only Triton's own launch path calls."""
    enter, exit_ = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
    return bool(getattr(enter, "calls", enter) or getattr(exit_, "calls", exit_))  # chains (3.6+), else functions


def _kinds(kernel) -> tuple[int, ...]:
    kinds = _param_kinds.get(kernel)
    if kinds is None:
        kinds = tuple(_CONSTEXPR if p.is_constexpr else _UNSPECIALIZED if p.do_not_specialize else _SPECIALIZED
                      for p in kernel.params)
        _param_kinds[kernel] = kinds
    return kinds


def _specialization_key(kernel, values: tuple, options: dict, device: int) -> tuple:
    """A key that separates every pair of calls Triton would compile differently: constexprs and specialized
    integers by value (finer than Triton's classes, and cheap), tensors by dtype and 16-byte alignment,
    unspecialized integers by their 32/64-bit type only, tensor descriptors by dtype and block shape."""
    key = [kernel, device, *options.values()]
    append = key.append
    for kind, value in zip(_kinds(kernel), values):
        if kind == _SPECIALIZED:
            if value.__class__ is int:
                append(value)
            elif isinstance(value, torch.Tensor):
                append(value.dtype)
                append(value.data_ptr() & 15)
            elif value.__class__ is float:
                append(float)
            elif value.__class__ is TensorDescriptor:  # Triton specializes on its dtype and block shape
                append((value.base.dtype, *value.block_shape, value.padding))
            else:
                append(value)
        elif kind == _CONSTEXPR:
            append(value)
        else:
            append(value.__class__ is int and not -2**31 <= value < 2**31)
    return tuple(key)


def binary_key(kernel, args: dict, options: dict) -> tuple:
    """A key that separates every two calls of ``kernel`` whose binaries differ (``_specialization_key``; under
    Triton's interpreter, which compiles nothing, every argument that is not a tensor)."""
    if not isinstance(kernel, JITFunction):
        return (kernel, *options.values(), *(v for v in args.values() if not isinstance(v, torch.Tensor)))
    return _specialization_key(kernel, tuple(args[name] for name in kernel.arg_names), options,
                               torch.cuda.current_device())


def _verify(kernel, grid, args: dict, options: dict, verify) -> None:
    """Compile without launching and pass the binary to ``verify`` (once per binary), which raises to refuse it."""
    compiled = kernel.warmup(grid=grid, **args, **options)
    if compiled.hash not in _verified:
        verify(compiled)
        _verified.add(compiled.hash)


def launch(kernel, grid: tuple[int, int, int], args: dict, verify=None, compiling=None, **options):
    """``kernel[grid](**args, **options)`` (options: num_warps, num_stages), cached. ``args`` names every
    parameter of the kernel. ``verify``: called with each new compiled binary before its first launch.
    ``compiling``: a context manager factory, entered around every step that may compile (Triton's own launch
    path included); the cached launches skip it. Returns the binary launched when :func:`direct` can launch
    it again, else None."""
    values = tuple(args[name] for name in kernel.arg_names)  # a missing argument fails here, on every path
    # Interpreted kernels (TRITON_INTERPRET=1) are not JITFunctions: they always take Triton's path.
    if not isinstance(kernel, JITFunction):
        kernel[grid](**args, **options)
        return None
    compiling = compiling or nullcontext
    if not _FAST_PATH or hooks_installed():
        with compiling():
            if verify is not None:
                _verify(kernel, grid, args, options, verify)
            kernel[grid](**args, **options)
        return None
    device = torch.cuda.current_device()
    key = _specialization_key(kernel, values, options, device)
    compiled = _compiled.get(key)
    if compiled is None:
        with compiling():
            if verify is not None:
                _verify(kernel, grid, args, options, verify)
            compiled = kernel[grid](**args, **options)
        if all(hasattr(compiled, name) for name in ("run", "function", "packed_metadata")):
            with _lock:
                if len(_compiled) >= _MAX_ENTRIES:
                    _compiled.clear()
                _compiled[key] = compiled
                return compiled
        return None
    run = compiled.run  # the first access loads the binary and sets .function
    run(grid[0], grid[1], grid[2], driver.active.get_current_stream(device), compiled.function,
        compiled.packed_metadata, None, None, None, *values)
    return compiled


def direct(compiled):
    """A function ``(grid, argument values in parameter order)`` that launches ``compiled`` (a binary
    :func:`launch` returned, already loaded) on the current device's current stream, skipping the key
    ``launch`` computes; None when there is no such binary. Launch hooks are not called: check
    :func:`hooks_installed` first."""
    if compiled is None:
        return None
    run, function, metadata = compiled.run, compiled.function, compiled.packed_metadata
    device, current_stream = torch.cuda.current_device(), driver.active.get_current_stream

    def launch_again(grid, values):
        run(grid[0], grid[1], grid[2], current_stream(device), function, metadata, None, None, None, *values)
    return launch_again
