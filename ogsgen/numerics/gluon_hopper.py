"""What the warp-specialized kernels (Gluon, sm_90) import: Gluon's Hopper operations under one name across the
Triton releases ogsgen supports (3.6 names the copies ``async_copy_global_to_shared`` and the partition barrier
``thread_barrier``; 3.9 ``async_load`` and ``barrier``), and ``as_gluon``, through which a Gluon kernel calls a
registered ``@triton.jit`` function (an activation)."""
from __future__ import annotations

import threading

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
cp_async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
partition_barrier = getattr(gl, "barrier", None) or gl.thread_barrier  # (a barrier of one partition's warps)
hopper_descriptor = TensorDescriptor.from_tensor  # (tensor, block shape, shared-memory layout of a block)

__all__ = ["as_gluon", "async_copy", "cp_async_load", "fence_async_shared", "gl", "gluon", "hopper_descriptor",
           "mbarrier", "partition_barrier", "tma_load", "warpgroup_mma", "warpgroup_mma_wait"]

_twins: dict = {}
_lock = threading.Lock()


def as_gluon(fn):
    """``fn`` (a ``@triton.jit`` function) as a Gluon function over the same Python source, made once per function:
    a Gluon kernel calls only Gluon functions. The functions it calls in turn stay as they are."""
    twin = _twins.get(fn)
    if twin is None:
        with _lock:
            twin = _twins.setdefault(fn, gluon.jit(getattr(fn, "fn", fn)))
    return twin
