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
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonTensorDescriptor
from triton.tools.tensor_descriptor import TensorDescriptor

from .descriptors import apply_l2_promotion

# CompiledKernel.run(grid x, y, z, stream, function, packed metadata, launch metadata, enter hook, exit hook,
# *arguments): the convention of the releases whose runtime/jit.py was read (3.6, 3.9); others are not assumed.
_CHECKED_RELEASES = ((3, 6), (3, 9))
_RELEASE = tuple(int(part) for part in triton.__version__.split(".")[:2])
_FAST_PATH = _RELEASE in _CHECKED_RELEASES

_MAX_ENTRIES = 8192  # distinct integer values make distinct keys; a pathological caller only refills the cache
_lock = threading.Lock()
_compiled: dict[tuple, object] = {}  # the binaries by key, for inspection (tests, bench/probes)
_launch_again: dict[tuple, object] = {}  # the same keys: ``direct(compiled)``, what a cached call runs
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
            elif value.__class__ is GluonTensorDescriptor:  # and a Gluon kernel's on its shared-memory layout
                append((value.base.dtype, *value.block_shape, value.padding, value.layout))
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
    path included); the cached launches skip it. Returns :func:`direct`'s function for the binary launched, which
    launches it again without this key, or None where there is none."""
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
    launch_again = _launch_again.get(key)
    if launch_again is None:
        with compiling():
            if verify is not None:
                _verify(kernel, grid, args, options, verify)
            compiled = kernel[grid](**args, **options)  # compiled and loaded: it has .function now
        if all(hasattr(compiled, name) for name in ("run", "function", "packed_metadata")):
            with _lock:
                if len(_compiled) >= _MAX_ENTRIES:
                    _compiled.clear()
                    _launch_again.clear()
                _compiled[key] = compiled
                _launch_again[key] = launch_again = direct(compiled)
                return launch_again
        return None
    launch_again(grid, values)
    return launch_again


def direct(compiled):
    """A function ``(grid, argument values in parameter order)`` that launches ``compiled`` (a binary Triton
    compiled and loaded) on the current device's current stream, skipping the key :func:`launch` computes; None
    when there is no such binary. Launch hooks are not called: check :func:`hooks_installed` first."""
    if compiled is None:
        return None
    run, function, metadata = compiled.run, compiled.function, compiled.packed_metadata
    device, current_stream = torch.cuda.current_device(), driver.active.get_current_stream
    encoded = _EncodedDescriptors.of(run)
    if encoded is None:
        def launch_again(grid, values):
            run(grid[0], grid[1], grid[2], current_stream(device), function, metadata, None, None, None, *values)
        return launch_again
    c_launch, expand = encoded.c_launch, encoded.expand
    cooperative, pdl = run.launch_cooperative_grid, run.launch_pdl

    def launch_again_encoded(grid, values):
        c_launch(grid[0], grid[1], grid[2], current_stream(device), function, cooperative, pdl, None, None,
                 metadata, None, None, None, *expand(values))
    return launch_again_encoded


class _EncodedDescriptors:
    """The TMA descriptors of one binary's launches, encoded once per address, shape and strides.

    Triton 3.6's launcher encodes every host-side descriptor (``cuTensorMapEncodeTiled``) in a Python loop over
    all arguments on every launch. The encoding depends only on the descriptor's address, shape, strides and
    padding and on the binary's block shape and swizzle, so it is kept per binary and reused; the arguments then
    go straight to the launcher's C function. Other releases, and binaries that need scratch memory per
    launch, take Triton's launcher."""

    _MAX_PER_DESCRIPTOR = 64  # distinct addresses one argument keeps encoded; more only re-encode

    def __init__(self, c_launch, positions: tuple[int, ...], metas: tuple):
        from triton.backends.nvidia.driver import make_tensordesc_arg  # 3.6's (descriptor, layout) encoder
        self.c_launch, self.positions, self.metas, self.encode = c_launch, positions, metas, make_tensordesc_arg
        self.cache: tuple[dict, ...] = tuple({} for _ in positions)

    @classmethod
    def of(cls, run) -> _EncodedDescriptors | None:
        """For a loaded binary's launcher (``compiled.run``): the C launcher under Triton 3.6's
        descriptor-encoding wrapper (``wrap_handle_tensordesc``), with the positions and layouts of the
        descriptors it encodes; None where that is not what ``run`` holds."""
        if _RELEASE != (3, 6):
            return None
        wrapper = getattr(run, "launch", None)
        names = getattr(getattr(wrapper, "__code__", None), "co_freevars", ())
        if getattr(wrapper, "__name__", "") != "inner" or set(names) != {"launcher", "tensordesc_indices",
                                                                       "tensordesc_meta"}:
            return None  # no descriptors (the C launcher itself), or a wrapper this code has not read
        if run.global_scratch_size or run.profile_scratch_size:
            return None
        cells = dict(zip(names, (cell.cell_contents for cell in wrapper.__closure__)))
        metas = tuple(cells["tensordesc_meta"])
        if any(meta is None for meta in metas):
            return None  # descriptors lowered to pointers, shapes and strides: nothing to encode
        return cls(cells["launcher"], tuple(sorted(cells["tensordesc_indices"])), metas)

    def expand(self, values) -> list:
        """The C launcher's arguments: ``values`` with each descriptor replaced by its encoding, shape and
        strides."""
        args, start = [], 0
        for position, meta, cache in zip(self.positions, self.metas, self.cache):
            descriptor = values[position]
            key = (descriptor.base.data_ptr(), *descriptor.shape, *descriptor.strides, descriptor.padding)
            encoding = cache.get(key)
            if encoding is None:
                if len(cache) >= self._MAX_PER_DESCRIPTOR:
                    cache.clear()
                encoding = cache[key] = self.encode(descriptor, meta)
                apply_l2_promotion(encoding, descriptor, meta)  # where descriptors.prefetch_rows asked for it
            args.extend(values[start:position])
            args.extend(encoding)
            start = position + 1
        args.extend(values[start:])
        return args
