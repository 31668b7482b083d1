"""The e2m1 codes of one matrix of strided mxfp4 values, one per int, and back: what every swizzled layout
rearranges."""
from __future__ import annotations

import torch

HOPPER_GROUP = 64          # K rows per group of words (every swizzled layout's)
HOPPER_SLAB = 16           # N columns per slab of words


def padded_codes(values: torch.Tensor) -> torch.Tensor:
    """Strided values (K // 2, N) uint8 -> their codes (N, K) int32, N padded to whole slabs and K to whole groups
    with code 0."""
    k, n = 2 * values.shape[-2], values.shape[-1]
    columns = values.mT                                                                      # (N, K // 2)
    codes = torch.stack([columns & 15, columns >> 4], dim=-1).flatten(-2).to(torch.int32)   # (N, K)
    return torch.nn.functional.pad(codes, (0, -k % HOPPER_GROUP, 0, -n % HOPPER_SLAB))


def strided_values(codes: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`padded_codes`, cut to (N, K): strided values (K // 2, N) uint8."""
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8).mT
