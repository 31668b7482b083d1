"""TMA descriptors of the persistent kernels' operands.

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

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from ..errors import SpecError
from ..spec.kernel_abi import RAGGED_ROWS_BOUND

_LEADING_BOUND = 0x7FFF0000  # any bound above RAGGED_ROWS_BOUND + the rows of any tensor


def ragged_rows_descriptor(t: torch.Tensor, block_rows: int, block_cols: int) -> TensorDescriptor:
    """A ragged descriptor of the 2-D tensor ``t`` (rows, columns) with (block_rows, block_cols) boxes."""
    rows, cols = t.shape
    if rows >= RAGGED_ROWS_BOUND:
        raise SpecError(f"a ragged descriptor addresses fewer than {RAGGED_ROWS_BOUND} rows, got {rows}")
    stride = t.stride(0)
    return TensorDescriptor(t, [_LEADING_BOUND, _LEADING_BOUND, RAGGED_ROWS_BOUND, cols],
                            [2**34 - stride, stride, stride, t.stride(1)], [1, 1, block_rows, block_cols])
