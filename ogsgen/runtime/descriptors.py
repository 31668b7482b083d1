"""TMA descriptors of the persistent kernels' operands: ragged row descriptors, the L2 promotion of a
K-contiguous w's, and whether a call's persistent kernel and its descriptors can run at all (at the end).

A ragged descriptor describes a 2-D tensor of rows that the kernel reads and writes in slices (an expert's rows)
whose ends it names per access, so that TMA clips each access at its slice's end: rows past it load as zeros
and are not stored, which is faster than reading them at the GPU's power limit (docs/heuristics.md).

How: with s the row stride, the descriptor's dimensions have strides (2**34 - s, s, s, 1), and the row
dimension (the third) is bounded by ``RAGGED_ROWS_BOUND`` (2**30). At coordinates (2**30, slice_end,
2**30 - slice_end + row, col) the address is 2**64 - 2**30 s + (2**30 + row) s + col, which wraps (TMA's
address arithmetic is modulo 2**64) to row s + col; and the row coordinate is in bounds exactly when
row < slice_end. The kernels compute these coordinates (templates/_matmul_persistent.py.jinja renders the
bound from ogsgen.spec.kernel_abi).
"""
from __future__ import annotations

import ctypes

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from ..devices import target
from ..errors import SpecError
from ..spec.kernel_abi import RAGGED_ROWS_BOUND
from ..spec.variant import KernelVariant

_LEADING_BOUND = 0x7FFF0000  # any bound above RAGGED_ROWS_BOUND + the rows of any tensor


def ragged_rows_descriptor(t: torch.Tensor, block_rows: int, block_cols: int) -> TensorDescriptor:
    """A ragged descriptor of the 2-D tensor ``t`` (rows, columns) with (block_rows, block_cols) boxes."""
    rows, cols = t.shape
    if rows >= RAGGED_ROWS_BOUND:
        raise SpecError(f"a ragged descriptor addresses fewer than {RAGGED_ROWS_BOUND} rows, got {rows}")
    stride = t.stride(0)
    return TensorDescriptor(t, [_LEADING_BOUND, _LEADING_BOUND, RAGGED_ROWS_BOUND, cols],
                            [2**34 - stride, stride, stride, t.stride(1)], [1, 1, block_rows, block_cols])


# L2 promotion (CUtensorMapL2promotion): how many bytes L2 fetches from memory around each row a TMA load reads.
# Triton encodes 128 for every descriptor. A K-contiguous w's tile rows are 128 bytes (64 16-bit values along K)
# and the next K step reads the next 128 bytes of the same rows; fetched 256 bytes at a time they are in L2 when
# that step asks: K-contiguous prefill 2-6% faster at T=2048, 0-2% from N-contiguous W (2026-12-03, 02ec25d;
# docs/performance.md).
_L2_PROMOTION_128B, _L2_PROMOTION_256B = 2, 3
_TENSOR_MAP_OFFSET = 128  # of the CUtensorMap in Triton 3.6's PyCUtensorMap object: PyObject_HEAD, then 128-aligned
_TENSOR_MAP_BYTES = 128


def prefetch_rows(descriptor: TensorDescriptor) -> TensorDescriptor:
    """Mark ``descriptor`` for 256-byte L2 promotion. Honoured where ogsgen encodes the descriptors itself (Triton
    3.6, every launch of a binary after its first: ogsgen.runtime.launcher); elsewhere Triton's 128 bytes."""
    descriptor.l2_promotion = _L2_PROMOTION_256B
    return descriptor


class _TensorMapEncoder:
    """libcuda's cuTensorMapEncodeTiled with the arguments Triton 3.6's fill_tma_descriptor passes it
    (backends/nvidia/driver.c), and another L2 promotion. Each re-encoding is checked first: the same arguments
    with Triton's promotion must give the bytes Triton encoded, else the map stays as Triton encoded it."""

    def __init__(self):
        self._encode_tiled = None

    def _function(self):
        """cuTensorMapEncodeTiled of the driver library Triton's launcher loaded; None where that library is not
        reachable by its name (Triton's maps then stand)."""
        if self._encode_tiled is None:
            try:
                function = ctypes.CDLL("libcuda.so.1").cuTensorMapEncodeTiled
            except (OSError, AttributeError):
                self._encode_tiled = False
            else:
                function.restype = ctypes.c_int
                function.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p,
                                     ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64),
                                     ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32), ctypes.c_int,
                                     ctypes.c_int, ctypes.c_int, ctypes.c_int]
                self._encode_tiled = function
        return self._encode_tiled or None

    def _encode(self, address, host_type, global_address, meta, shape, strides, padding, promotion) -> bool:
        rank, elem_size = len(shape), meta["elem_size"]
        dims = (ctypes.c_uint64 * rank)(*reversed(shape))
        byte_strides = [elem_size * stride for stride in reversed(strides[:-1])]
        byte_strides.append(shape[0] * (byte_strides[-1] if byte_strides else elem_size))  # as Triton; unread
        box = (ctypes.c_uint32 * rank)(*reversed(meta["block_size"]))
        result = self._function()(address, host_type, rank, global_address, dims,
                                  (ctypes.c_uint64 * rank)(*byte_strides), box, (ctypes.c_uint32 * rank)(*[1] * rank),
                                  0, meta["swizzle"], promotion, 1 if padding else 0)
        return result == 0

    def promote(self, tensor_map, global_address: int, host_type: int, meta: dict, shape, strides,
                padding: bool, promotion: int) -> bool:
        """Re-encode Triton's ``tensor_map`` (a PyCUtensorMap) in place with ``promotion``; whether it was."""
        if self._function() is None:
            return False
        encoded = ctypes.string_at(id(tensor_map) + _TENSOR_MAP_OFFSET, _TENSOR_MAP_BYTES)
        scratch = ctypes.create_string_buffer(_TENSOR_MAP_BYTES + 64)  # once per address: its own buffer per call
        scratch_address = -(-ctypes.addressof(scratch) // 64) * 64  # a CUtensorMap is 64-byte aligned
        if not self._encode(scratch_address, host_type, global_address, meta, shape, strides, padding,
                            _L2_PROMOTION_128B):
            return False
        if ctypes.string_at(scratch_address, _TENSOR_MAP_BYTES) != encoded:
            return False  # not the encoding this code was written for: Triton's map stands
        if not self._encode(scratch_address, host_type, global_address, meta, shape, strides, padding,
                            promotion):
            return False
        ctypes.memmove(id(tensor_map) + _TENSOR_MAP_OFFSET, scratch_address, _TENSOR_MAP_BYTES)
        return True


_encoder = _TensorMapEncoder()


def apply_l2_promotion(encoding: list, descriptor: TensorDescriptor, meta: dict) -> bool:
    """Re-encode the map of Triton 3.6's ``make_tensordesc_arg`` ``encoding`` ([map, *shape, *strides]) of
    ``descriptor`` with the promotion :func:`prefetch_rows` asked for; whether it did (False: Triton's map)."""
    promotion = getattr(descriptor, "l2_promotion", None)
    if promotion is None:
        return False
    from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST  # Triton 3.6's, as its encoder uses it
    rank = len(descriptor.shape)
    shape, strides = encoding[1:1 + rank], encoding[1 + rank:1 + 2 * rank]
    return _encoder.promote(encoding[0], descriptor.base.data_ptr(), TMA_DTYPE_DEVICE_TO_HOST[meta["elem_type"]],
                            meta, shape, strides, descriptor.padding == "nan", promotion)


_NO_PERSISTENT_KERNEL = ("this call's kernel variant has no persistent kernel: that needs plain bf16 or fp16 x and w "
                         "of one format")


def persistent_blocker(variant: KernelVariant, x: torch.Tensor) -> str | None:
    """None when the variant's persistent TMA kernel can run on x's device, else why it cannot. (Whether x and w
    suit TMA is checked only for calls that pick the kernel: ``tma_blocker``.)"""
    if not variant.has_persistent_kernel:
        return _NO_PERSISTENT_KERNEL
    if x.is_cuda and not target(x.device).tma:
        return "the persistent kernel loads tiles by TMA, which needs a GPU of compute capability 9.0 or later"
    return None


def tma_blocker(x: torch.Tensor, w: torch.Tensor, x_gathered: bool, y: torch.Tensor | None) -> str | None:
    """None when TMA descriptors can describe x, w and y, else what to change. (``x_gathered``: the kernel reads
    x's rows by pointers, no descriptor. ``y``: the output the kernel stores by TMA, None where it stores by
    pointers.)"""
    if x_gathered:
        x = None
    if y is not None and y.shape[-1] * y.element_size() % 16:
        return (f"TMA needs rows of a multiple of 16 bytes: the output's rows ({y.shape[-1]} columns of "
                f"{y.element_size()} bytes) are not; N // reduction_n must be a multiple of {16 // y.element_size()}")
    # a K-major w (last stride not 1) is read through a descriptor of w.mT
    for name, tensor in (("x", x), ("w", w if w.stride(-1) == 1 else w.mT), ("y", y)):
        if tensor is None:
            continue
        if tensor.numel() == 0:
            return f"{name} is empty (shape {tuple(tensor.shape)}): a TMA descriptor needs every dimension >= 1"
        if tensor.is_contiguous() and not (tensor.shape[-1] * tensor.element_size() % 16 or tensor.data_ptr() % 16):
            continue  # the common case, checked cheaply: every stride is a multiple of the row's 16-byte size
        strides = tensor.stride()
        if strides[-1] != 1 or tensor.data_ptr() % 16 or any(stride * tensor.element_size() % 16
                                                             for stride in strides[:-1]):
            along = "N or K" if name == "w" else "its last dimension"
            return (f"TMA needs {name} 16-byte aligned, contiguous along {along} and with its other "
                    f"strides multiples of 16 bytes (got strides {tuple(strides)}); pass {name}.contiguous() "
                    f"(and K, N multiples of 8)")
    return None


def ws_blocker(variant: KernelVariant, x: torch.Tensor, w: torch.Tensor, n: int, k: int) -> str | None:
    """None when the variant's warp-specialized kernel (Gluon, sm_90) can take this call, else why not: it needs
    Hopper's wgmma, 128-aligned N and K, w K-contiguous (as (experts, N, K) rows) and x's rows 16-byte aligned."""
    if not variant.has_warp_specialized_kernel:
        return ("the variant has no warp-specialized kernel: that takes fp8e4m3_b128 x and w, expert-sorted rows and "
                "an epilogue of bias, activation and gammas")
    if not x.is_cuda:
        return "the warp-specialized kernel is written in Gluon, which Triton's interpreter does not run"
    if not target(x.device).wgmma:
        return "the warp-specialized kernel uses Hopper's wgmma: it needs a GPU of compute capability 9.x"
    if n % 128 or k % 128:
        return f"the warp-specialized kernel needs N and K multiples of 128, got N={n}, K={k}"
    if not w.mT.is_contiguous() or w.data_ptr() % 16:
        return ("the warp-specialized kernel reads w as (experts, N, K) rows by TMA: pass w K-contiguous, as "
                "ogsgen.prepare_expert_weights(..., format='fp8e4m3_b128') stores it")
    if x.stride(-1) != 1 or x.stride(-2) % 16 or x.data_ptr() % 16:
        return (f"the warp-specialized kernel copies x's rows 16 bytes at a time: pass x.contiguous() (strides "
                f"{x.stride()})")
    return None
