"""The ``hopper`` value layout of mxfp4 weights: words for the kernels' in-register upcast.

It serves GPUs whose 16-bit MMAs take the first operand from
registers (Hopper's wgmma; Ampere's mma.sync shares the fragment). The kernels multiply W^T tiles, N along
rows. Of each 16 x 16 block of such an operand, a thread holds rows r and r + 8 (r = lane // 4) at K columns
2t, 2t + 1, 2t + 8, 2t + 9 (t = lane % 4), in four bf16x2 registers:
(r, 2t..2t+1), (r + 8, 2t..2t+1), (r, 2t+8..2t+9), (r + 8, 2t+8..2t+9). The layout stores those 8 values as one
32-bit word whose bits are arranged so that each register is a shift, a mask and two bf16x2 multiplies away
(``ogsgen.numerics.jit.E2M1_WORD_TO_BF16``, read by ``upcast_mxfp4_hopper_words``), with no byte permutes.

Words are int32 ``(..., ceil(N / 16), K_padded * 2)``: per 16-column slab of N, K padded to whole 64-row groups,
and per group 128 words in the order (r, t, j), j the group's 16-row block: a thread's words of a group are 16
adjacent bytes, one vector load. Scales are not swizzled (a word never crosses a 32-row scale block); the kernels
read them fastest N-contiguous, as ``prepare_expert_weights`` stores them.
The layout does not depend on the kernel's warp count or tile shape, beyond tiles of whole slabs and groups.
"""
from __future__ import annotations

import torch

from .codes import HOPPER_GROUP, HOPPER_SLAB, padded_codes, strided_values

# Where each e2m1 bit of a word's 8 values lies: WORD_BITS[register][lane][bit], bit 3 the sign, 2..1 the
# exponent, 0 the mantissa. The upcast puts a nibble's bits at 15, 8, 7, 6 of its bf16 lane (sign, then the
# exponent's low bits and the top mantissa bit) with these extractions, register by register:
#   0: (word << 6) & 0x81C081C0      1: rotate_left(word, 12) & 0x81C081C0      2: (word << 2) & 0x81C081C0
#   3: (word & 0x81808180) | ((word >> 8) & 0x00400040)
# (four plain shift-and-mask extractions cannot tile a 32-bit word, hence the rotate and the split last one).
_BF16_POSITION = (6, 7, 8, 15)   # of nibble bits 0..3 within a bf16


def _source_bit(register: int, destination: int) -> int:
    if register == 0:
        return destination - 6
    if register == 1:
        return (destination - 12) % 32
    if register == 2:
        return destination - 2
    return destination + 8 if destination % 16 == 6 else destination


WORD_BITS = tuple(tuple(tuple(_source_bit(register, 16 * lane + position) for position in _BF16_POSITION)
                        for lane in (0, 1)) for register in range(4))


# A value at (N, K) = (16 s + 8 q + r, 64 g + 16 j + 8 h + 2 t + lane) lies in word (r, t, j) of slab s, group g,
# in register q + 2 h of the fragment: (s, q, r, g, j, h, t, lane) in value order, (s, g, r, t, j, h, q, lane) in
# stored order.
_TO_STORED = (0, 3, 2, 6, 4, 5, 1, 7)
_TO_VALUES = (0, 6, 2, 1, 4, 5, 3, 7)


def _words_of_codes(codes: torch.Tensor) -> torch.Tensor:
    """(N_padded, K_padded) e2m1 codes (int32) -> their words (slabs, groups * 128) int32."""
    n_padded, k_padded = codes.shape
    split = codes.reshape(n_padded // HOPPER_SLAB, 2, 8, k_padded // HOPPER_GROUP, 4, 2, 4, 2)
    by_word = split.permute(*_TO_STORED).reshape(n_padded // HOPPER_SLAB, k_padded // HOPPER_GROUP, 8, 4, 4, 4, 2)
    words = torch.zeros(by_word.shape[:-2], dtype=torch.int32, device=codes.device)
    for register in range(4):
        for lane in range(2):
            for bit, position in enumerate(WORD_BITS[register][lane]):
                words |= ((by_word[..., register, lane] >> bit) & 1) << position   # bit 31 wraps to the sign
    return words.flatten(1)


def _codes_of_words(words: torch.Tensor) -> torch.Tensor:
    """The inverse of ``_words_of_codes``: (slabs, groups * 128) int32 -> (N_padded, K_padded) e2m1 codes."""
    slabs, groups = words.shape[0], words.shape[1] // 128
    words = words.reshape(slabs, groups, 8, 4, 4)                                   # (s, g, r, t, j)
    by_word = torch.empty(*words.shape, 4, 2, dtype=torch.int32, device=words.device)
    for register in range(4):
        for lane in range(2):
            code = torch.zeros(words.shape, dtype=torch.int32, device=words.device)
            for bit, position in enumerate(WORD_BITS[register][lane]):
                code |= ((words >> position) & 1) << bit
            by_word[..., register, lane] = code
    codes = by_word.reshape(*words.shape, 2, 2, 2).permute(*_TO_VALUES)
    return codes.reshape(slabs * HOPPER_SLAB, groups * HOPPER_GROUP)


class HopperLayout:
    """The hopper layout's facts and host-side conversions (one matrix of values at a time)."""
    name = "hopper"
    min_capability = (8, 0)
    serves = "16-bit MMAs with a register operand"
    stored_dtype = torch.int32

    @staticmethod
    def stored_shape(k: int, n: int) -> tuple[int, int]:
        """The last two dimensions of the words that hold K x N values."""
        return -(-n // HOPPER_SLAB), -(-k // HOPPER_GROUP) * HOPPER_GROUP * 2

    @staticmethod
    def swizzle(values: torch.Tensor) -> torch.Tensor:
        """One matrix of strided values (K // 2, N) uint8 -> its words (stored_shape(K, N)) int32."""
        return _words_of_codes(padded_codes(values))

    @staticmethod
    def unswizzle(words: torch.Tensor, k: int, n: int) -> torch.Tensor:
        """The inverse of :meth:`swizzle`: one matrix's words -> its strided values (K // 2, N) uint8."""
        return strided_values(_codes_of_words(words)[:n, :k])
