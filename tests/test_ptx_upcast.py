"""The packed e2m1 -> bf16 upcasts' inline PTX (ogsgen.numerics.jit.E2M1_BYTES_TO_BF16X2 for strided bytes,
E2M1_WORD_TO_BF16 for hopper-layout words), executed instruction by instruction on the CPU: every value times every
e8m0 scale against the torch reference.

Triton's interpreter cannot run inline PTX (the test harness runs the asm's definition instead), so without this
the PTX itself is only checked on a GPU (test_formats.py's every-code test). This emulates the few instructions
it uses, with their PTX semantics on 32-bit registers, so that a change to a shift, a mask or a byte selector
fails here first.
"""
import re

import numpy as np
import pytest
import torch

from ogsgen.numerics.jit import (E2M1_BYTES_TO_BF16X2, E2M1_WORD_TO_BF16,
                                 E8M0_PAIR_TO_BF16X2)
from ogsgen.numerics.layouts.hopper import WORD_BITS
from ogsgen.numerics.mx import decode_e2m1

_MASK = np.uint64(0xFFFFFFFF)


def _bf16x2_to_f64(bits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lanes = [((bits >> np.uint64(16 * i)) & np.uint64(0xFFFF)).astype(np.uint32) << np.uint32(16) for i in (0, 1)]
    return tuple(lane.view(np.float32).astype(np.float64) for lane in lanes)


def _f64_to_bf16_bits(values: np.ndarray) -> np.ndarray:
    # Every product here is exact in bf16 or overflows (e2m1 values have 2 significant bits, scales are powers
    # of two), so one conversion through torch rounds nothing that matters.
    return torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().astype(np.uint16).astype(np.uint64)


def _prmt(a: np.ndarray, b: np.ndarray, selector: int) -> np.ndarray:
    source = [(a >> np.uint64(8 * i)) & np.uint64(0xFF) for i in range(4)] + \
             [(b >> np.uint64(8 * i)) & np.uint64(0xFF) for i in range(4)]
    out = np.zeros_like(a)
    for i in range(4):
        nibble = (selector >> (4 * i)) & 0xF
        assert nibble < 8, "sign-replicating selectors are not emulated"
        out |= source[nibble] << np.uint64(8 * i)
    return out


def run_ptx(ptx: str, registers: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run straight-line PTX on arrays of 32-bit register values (one lane of work per array element)."""
    regs = dict(registers)

    def value(operand: str) -> np.ndarray:
        operand = operand.strip()
        if operand in regs:
            return regs[operand]
        number = int(operand, 16) if operand.lower().startswith("0x") else int(operand)
        return np.full_like(next(iter(registers.values())), number & 0xFFFFFFFF)

    body = ptx.strip()
    assert body.startswith("{") and body.endswith("}")
    for statement in body[1:-1].split(";"):
        statement = statement.strip()
        if not statement or statement.startswith(".reg"):
            continue
        opcode, operands = statement.split(None, 1)
        unpack = re.fullmatch(r"\{(\S+),\s*(\S+)\}\s*,\s*(\S+)", operands)
        if opcode == "mov.b32" and unpack:  # a 32-bit register into two 16-bit ones, low half first
            low, high, source = unpack.groups()
            regs[low], regs[high] = value(source) & np.uint64(0xFFFF), value(source) >> np.uint64(16)
            continue
        pack = re.fullmatch(r"(\S+)\s*,\s*\{(\S+),\s*(\S+)\}", operands)
        if opcode == "mov.b32" and pack:  # two 16-bit registers into a 32-bit one, the first in the low half
            destination, low, high = pack.groups()
            regs[destination] = value(low) | (value(high) << np.uint64(16))
            continue
        destination, *sources = [o.strip() for o in operands.split(",")]
        args = [value(s) for s in sources]
        if opcode == "mov.b32":
            result = args[0]
        elif opcode == "shf.l.wrap.b32":  # funnel shift of (b:a) left, upper word; a == b rotates
            count = args[2] & np.uint64(31)
            result = (((args[1] << np.uint64(32)) | args[0]) << count >> np.uint64(32)) & _MASK
        elif opcode == "prmt.b32":
            result = _prmt(args[0], args[1], int(sources[2], 16))
        elif opcode == "mul.lo.u32":
            result = (args[0] * args[1]) & _MASK
        elif opcode in ("min.u16x2", "max.u16x2"):
            pick = np.minimum if opcode == "min.u16x2" else np.maximum
            halves = [pick((args[0] >> np.uint64(s)) & np.uint64(0xFFFF), (args[1] >> np.uint64(s)) & np.uint64(0xFFFF))
                      for s in (0, 16)]
            result = halves[0] | (halves[1] << np.uint64(16))
        elif opcode == "add.u32":
            result = (args[0] + args[1]) & _MASK
        elif opcode == "shl.b32":
            result = (args[0] << args[1]) & _MASK
        elif opcode == "shr.b32":  # .b32: a logical shift
            result = args[0] >> args[1]
        elif opcode == "and.b32":
            result = args[0] & args[1]
        elif opcode == "or.b32":
            result = args[0] | args[1]
        elif opcode == "fma.rn.bf16x2":
            lanes = [x * y + z for x, y, z in zip(*(_bf16x2_to_f64(a) for a in args))]
            result = _f64_to_bf16_bits(lanes[0]) | (_f64_to_bf16_bits(lanes[1]) << np.uint64(16))
        else:
            raise NotImplementedError(f"PTX opcode {opcode} is not emulated")
        regs[destination] = result
    return regs


def _bf16_factor_bits(codes: np.ndarray) -> np.ndarray:
    """2 ** (code - 127) as bf16 bits (code 0: the subnormal 2 ** -127; 255, e8m0's NaN: bf16's NaN 0x7FC0), as
    ogsgen.numerics.jit.bf16_bits_of_scale gives them."""
    return np.where(codes == 255, np.uint64(0x7FC0), np.maximum(codes << np.uint64(7), np.uint64(0x40)))


def _decoded_times_scale(codes: np.ndarray, scale_codes: np.ndarray) -> np.ndarray:
    """The reference: e2m1 codes times 2 ** (scale code - 127), rounded once to bf16 (as bits)."""
    value = decode_e2m1(torch.from_numpy(codes.astype(np.int64)))
    scale = torch.from_numpy(np.ldexp(1.0, scale_codes.astype(np.int64) - 127))
    return (value.double() * scale).to(torch.bfloat16).view(torch.int16).numpy().astype(np.uint16)


def test_the_upcast_ptx_gives_every_byte_times_every_scale_exactly():
    # Lane i of the work: bytes (i, i+1, i+2, i+3) mod 256 in one register, the bytes (0, 1) and (2, 3) scaled by
    # two codes; over all lanes every byte value meets every scale code in every position.
    byte_values = np.arange(256, dtype=np.uint64)
    codes = np.arange(255, dtype=np.uint64)
    first, code_a = (a.ravel() for a in np.meshgrid(byte_values, codes, indexing="ij"))
    code_b = (code_a + np.uint64(101)) % np.uint64(255)
    data = [(first + np.uint64(j)) % np.uint64(256) for j in range(4)]
    word = data[0] | (data[1] << np.uint64(8)) | (data[2] << np.uint64(16)) | (data[3] << np.uint64(24))
    factors = [_bf16_factor_bits(c) | (_bf16_factor_bits(c) << np.uint64(16)) for c in (code_a, code_b)]
    body = E2M1_BYTES_TO_BF16X2.value
    assert set(re.findall(r"\$(\d)", body)) == {str(i) for i in range(7)}  # 4 outputs, the word, 2 factors
    out = run_ptx(body, {"$4": word, "$5": factors[0], "$6": factors[1]})

    for register, nibble_shift, (byte_low, byte_high), code in (("$0", 0, (0, 1), code_a), ("$1", 0, (2, 3), code_b),
                                                               ("$2", 4, (0, 1), code_a), ("$3", 4, (2, 3), code_b)):
        got = [(out[register] >> np.uint64(16 * lane)) & np.uint64(0xFFFF) for lane in (0, 1)]
        for lane, byte in enumerate((byte_low, byte_high)):
            want = _decoded_times_scale((data[byte] >> np.uint64(nibble_shift)) & np.uint64(15), code)
            mismatch = np.nonzero(got[lane].astype(np.uint16) != want)[0]
            assert mismatch.size == 0, (f"{register} lane {lane}: byte {int(data[byte][mismatch[0]]):#04x} at scale "
                                        f"code {int(code[mismatch[0]])} gives {int(got[lane][mismatch[0]]):#06x}, "
                                        f"want {int(want[mismatch[0]]):#06x}")


def test_the_word_upcast_ptx_gives_each_value_of_the_layout_times_its_row_scale():
    # Every nibble value in each of the word's 8 places (the others random), each word against two scale codes
    # (row r's and row r + 8's, in the halves of one register) that together cover every code in both: all 255
    # finite codes with the factors 2 ** (code - 127).
    rng = np.random.default_rng(0)
    n_codes = 255
    words = rng.integers(0, 2 ** 32, size=(8, 16, 255), dtype=np.uint64)
    for place in range(8):
        positions = WORD_BITS[place // 2][place % 2]
        for code in range(16):
            for bit, position in enumerate(positions):
                words[place, code] &= ~np.uint64(1 << position) & _MASK
                words[place, code] |= np.uint64(((code >> bit) & 1) << position)
    words = words.ravel()
    code_row = np.arange(words.size, dtype=np.uint64) % np.uint64(n_codes)
    code_row8 = (code_row * np.uint64(7) + np.uint64(3)) % np.uint64(n_codes)
    factors = _bf16_factor_bits(code_row) | (_bf16_factor_bits(code_row8) << np.uint64(16))
    ptx = E2M1_WORD_TO_BF16.value
    assert ptx.count("fma.rn.bf16x2") == 8
    out = run_ptx(ptx, {"$8": words, "$9": factors})
    for register, lanes in enumerate(WORD_BITS):
        scale_codes = code_row8 if register % 2 else code_row
        for lane, positions in enumerate(lanes):
            codes = sum(((words >> np.uint64(p)) & np.uint64(1)) << np.uint64(bit) for bit, p in enumerate(positions))
            got = out[f"${2 * register + lane}"].astype(np.uint16)
            want = _decoded_times_scale(codes, scale_codes)
            mismatch = np.nonzero(got != want)[0]
            assert mismatch.size == 0, (f"register {register} lane {lane}: code {int(codes[mismatch[0]])} at scale "
                                        f"code {int(scale_codes[mismatch[0]])} gives {int(got[mismatch[0]]):#06x}, "
                                        f"want {int(want[mismatch[0]]):#06x}")


def test_the_scale_ptx_gives_each_code_of_a_pair_as_bf16():
    codes = np.arange(256, dtype=np.uint64)
    others = (codes * np.uint64(37) + np.uint64(11)) % np.uint64(256)       # every code in the high half too
    out = run_ptx(E8M0_PAIR_TO_BF16X2.value, {"$1": codes | (others << np.uint64(16))})["$0"]
    assert np.array_equal(out, _bf16_factor_bits(codes) | (_bf16_factor_bits(others) << np.uint64(16)))
    lanes = torch.from_numpy((out & np.uint64(0xFFFF)).astype(np.int16)).view(torch.bfloat16).double()
    assert torch.equal(lanes[1:255], torch.from_numpy(np.ldexp(1.0, np.arange(1, 255) - 127)))
    assert lanes[0] == 2.0 ** -127 and lanes[255].isnan()  # the subnormal, and e8m0's NaN
