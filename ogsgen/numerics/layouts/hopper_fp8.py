"""The ``hopper_fp8`` value layout of mxfp4 weights: words that become fp8 wgmma operands with byte permutes.

It serves e4m3 activations with mxfp4 weights on Hopper, whose kernels convert W^T tiles (N along rows) to e4m3 in
registers and multiply them with fp8 wgmmas. Of each 16 x 32 block of an fp8 operand, a thread holds rows r and r + 8
(r = lane // 4) at K columns 4t..4t+3 and 4t+16..4t+19 (t = lane % 4), one register of four e4m3 values each. A
word of this layout holds one 16-deep half of that: row r's four codes (K = 4t + i, nibble i, the low 16 bits) and
row r + 8's (the high 16 bits), so that each of the two e4m3 registers is one byte permute (``prmt``) of an 8-byte
table of the e2m1 magnitudes already multiplied by the block's scale, and the signs a second permute and a mask
(``ogsgen.numerics.jit.WORD_TO_E4M3``, read by ``dot_mxfp4_words``): no bf16 step, no shared-memory pass.

Values are uint8 ``(..., ceil(N / 16), K_padded * 8)``: per 16-column slab of N, K padded to whole 64-row groups, and
per group 128 words (512 bytes) in the order (r, t, j), j the group's 16-row block: a thread's words of a group are
16 adjacent bytes, one vector load, as in the ``hopper`` layout (whose words hold the same values for the bf16
operand's fragment). Scales are not swizzled; the kernels read them fastest N-contiguous.
"""
from __future__ import annotations

import torch

from .codes import HOPPER_GROUP, HOPPER_SLAB, padded_codes, strided_values


class HopperFp8Layout:
    """The hopper_fp8 layout's facts and host-side conversions (one matrix of values at a time)."""
    name = "hopper_fp8"
    min_capability = (9, 0)
    serves = "fp8 wgmmas with a register operand"
    stored_dtype = torch.uint8

    @staticmethod
    def stored_shape(k: int, n: int) -> tuple[int, int]:
        """The last two dimensions of the bytes that hold K x N values."""
        return -(-n // HOPPER_SLAB), -(-k // HOPPER_GROUP) * HOPPER_GROUP * 8

    @staticmethod
    def swizzle(values: torch.Tensor) -> torch.Tensor:
        """One matrix of strided values (K // 2, N) uint8 -> its bytes (stored_shape(K, N)) uint8."""
        codes = padded_codes(values)
        slabs, groups = codes.shape[0] // HOPPER_SLAB, codes.shape[1] // HOPPER_GROUP
        # A value at (N, K) = (16 s + 8 q + r, 64 g + 16 j + 4 t + 2 b + h) is nibble h of byte 2 q + b of word
        # (r, t, j): (s, q, r, g, j, t, b, h) in value order, (s, g, r, t, j, q, b, h) in stored order.
        nibbles = codes.reshape(slabs, 2, 8, groups, 4, 4, 2, 2).permute(0, 3, 2, 5, 4, 1, 6, 7)
        return (nibbles[..., 0] | (nibbles[..., 1] << 4)).reshape(slabs, groups * 512).to(torch.uint8)

    @staticmethod
    def unswizzle(stored: torch.Tensor, k: int, n: int) -> torch.Tensor:
        """The inverse of :meth:`swizzle`: one matrix's bytes -> its strided values (K // 2, N) uint8."""
        slabs, groups = stored.shape[0], stored.shape[1] // 512
        nibbles = torch.stack([stored & 15, stored >> 4], dim=-1).reshape(slabs, groups, 8, 4, 4, 2, 2, 2)
        codes = nibbles.permute(0, 5, 2, 1, 4, 3, 6, 7).reshape(slabs * HOPPER_SLAB, groups * HOPPER_GROUP)
        return strided_values(codes[:n, :k])
