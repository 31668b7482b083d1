"""The packed e2m1 -> bf16 upcast's inline PTX (ogsgen.numerics.jit.E2M1_BYTES_TO_BF16X2), executed instruction
by instruction on the CPU: every byte value times every e8m0 scale against the torch reference.

Triton's interpreter cannot run inline PTX (the test harness runs the asm's definition instead), so without this
the PTX itself is only checked on a GPU (test_formats.py's every-code test). This emulates the few instructions
it uses, with their PTX semantics on 32-bit registers, so that a change to a shift, a mask or a byte selector
fails here first.
"""
import re

import numpy as np
import torch

from ogsgen.numerics.jit import E2M1_BYTES_TO_BF16X2
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

    for statement in ptx.replace("{", "").replace("}", "").split(";"):
        statement = statement.strip()
        if not statement or statement.startswith(".reg"):
            continue
        opcode, operands = statement.split(None, 1)
        destination, *sources = [o.strip() for o in operands.split(",")]
        args = [value(s) for s in sources]
        if opcode == "mov.b32":
            result = args[0]
        elif opcode == "prmt.b32":
            result = _prmt(args[0], args[1], int(sources[2], 16))
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
    """ogsgen.numerics.jit.bf16_of_scale: 2 ** (code - 127) as bf16 bits (code 0: the subnormal 2 ** -127)."""
    return np.maximum(np.minimum(codes, 254) << np.uint64(7), np.uint64(0x40))


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

    def expected(byte, nibble_shift, code):
        value = decode_e2m1(torch.from_numpy(((byte >> np.uint64(nibble_shift)) & np.uint64(15)).astype(np.int64)))
        scale = torch.from_numpy(np.ldexp(1.0, code.astype(np.int64) - 127))
        return (value.double() * scale).to(torch.bfloat16)

    for register, nibble_shift, (byte_low, byte_high), code in (("$0", 0, (0, 1), code_a), ("$1", 0, (2, 3), code_b),
                                                               ("$2", 4, (0, 1), code_a), ("$3", 4, (2, 3), code_b)):
        got = [(out[register] >> np.uint64(16 * lane)) & np.uint64(0xFFFF) for lane in (0, 1)]
        for lane, byte in enumerate((byte_low, byte_high)):
            want = expected(data[byte], nibble_shift, code).view(torch.int16).numpy().astype(np.uint16)
            mismatch = np.nonzero(got[lane].astype(np.uint16) != want)[0]
            assert mismatch.size == 0, (f"{register} lane {lane}: byte {int(data[byte][mismatch[0]]):#04x} at scale "
                                        f"code {int(code[mismatch[0]])} gives {int(got[lane][mismatch[0]]):#06x}, "
                                        f"want {int(want[mismatch[0]]):#06x}")
