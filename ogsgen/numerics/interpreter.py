"""Corrections of Triton's CPU interpreter (TRITON_INTERPRET=1), so that kernels compute there what they compute
on the GPU.

In every Triton release from 3.3 to 3.9 the interpreter emulates these operations wrongly, without an error:

* ``tl.dot`` with bf16 operands multiplies the raw uint16 storage (results off by ~1e10): bf16 is upcast to fp32
  first, as the GPU's MMA does;
* fp32 -> bf16 casts truncate: they round to nearest even, as the GPU does;
* bf16 -> fp32 casts turn bf16's subnormals (below 2**-126) into other values (1e-39 into 4.4e-39): they give their
  values, exactly, as the GPU does;
* fp32 -> fp8 casts lose the carry of a round-up (1.97 -> 1.0 in e4m3): they round to nearest even and saturate
  to the largest finite value (NaN stays NaN), as Hopper's ``cvt.rn.satfinite`` does; bf16 and fp16 -> fp8 casts
  too, through their exact fp32 values;
* fp8 -> wider casts and fp8 dots read e4m3's NaN (0x7F) as 480 and e5m2's infinities and NaNs as finite values:
  they read them as NaN and infinities, as the GPU does; except e5m2 -> bf16, which on the GPU (Triton 3.6, sm_90)
  reads e5m2's infinities and NaNs as 65536, 81920, 98304 and 114688 (with their sign), and does so here too;
* (Triton 3.6; 3.9 is right) ``tl.minimum``, ``tl.maximum`` and ``tl.clamp`` without ``propagate_nan`` return NaN
  for a NaN operand: they return the other operand, as the GPU's ``min.f32`` / ``max.f32`` do, and ``tl.clamp``
  of a NaN gives its upper bound (min first); with ``propagate_nan=tl.PropagateNan.ALL`` they give NaN, as
  ``min.NaN.f32`` does;
* (Triton 3.6) a loop bound that is a kernel value, such as ``range(pid_k, tl.cdiv(K, BLOCK_K), split_k)``, is
  converted with ``int()`` of a 1-element array, which numpy 2.4 refuses: it is converted from its one element
  (when ogsgen is imported, even with OGSGEN_INTERPRETER_FIXES=0: it changes no result);
* inline PTX does not run at all: ogsgen's own PTX blocks run by their definitions, in numpy (the packed e2m1 ->
  bf16 upcasts, bytes elementwise and hopper-layout words by their bit map; the hopper_fp8 words' e4m3
  conversion by its tables; and the waiting kernels' marker, which
  only instructs ogsgen's compile, as nothing). Other inline assembly still raises NotImplementedError.

Not corrected: libdevice (``extern_elementwise``) functions raise NotImplementedError, and bf16 arithmetic with a
Python scalar fails or gives NaN; a function to be tested on the CPU should compute in fp32.

ogsgen installs the corrections before its first interpreted launch (``OGSGEN_INTERPRETER_FIXES=0`` keeps the
interpreter as it is, with a warning when a kernel of a format it gets wrong runs); ``ogsgen.testing``'s pytest
plugin installs them when a pytest session starts under the interpreter, so that a user's own kernels are
corrected too.

The interpreter is not thread-safe either: a launch keeps its state in module globals (the patched
``triton.language`` functions, the program id), so launches from several threads fail or compute wrong values.
Under TRITON_INTERPRET=1, importing ``ogsgen.numerics`` makes interpreted launches take turns (a user's own kernels'
too, :func:`serialize_launches`): threads calling ogsgen get right answers, one launch at a time.
"""
import operator
import os
import threading

import numpy as np
import torch
import triton.language as tl
from triton.runtime import interpreter

from ..devices import interpreting
from ..errors import warn_at_caller
from ..spec.formats import ELEMENTS, FP8_ELEMENTS
from .jit import E2M1_BYTES_TO_BF16X2, E2M1_WORD_TO_BF16, REQUEST_WGMMA_WAITS, WORD_TO_E4M3
from .layouts.hopper import WORD_BITS
from .mx import decode_e2m1

# Triton's fp8 types -> (torch dtype, largest finite value)
_FP8 = {getattr(tl, e.tl_dtype.removeprefix("tl.")): (e.torch_dtype, e.max_finite)
        for e in (ELEMENTS[name] for name in FP8_ELEMENTS)}


def _bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _f32_to_bf16_bits(values: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(values), np.uint16(0x7FC0), rounded)


def _f32_to_fp8_bits(values: np.ndarray, dst) -> np.ndarray:
    dtype, largest = _FP8[dst]
    finite = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).clamp(-largest, largest)
    return finite.to(dtype).view(torch.uint8).numpy()


def _fp8_bits_to_f32(bits: np.ndarray, src) -> np.ndarray:
    return torch.from_numpy(np.ascontiguousarray(bits, dtype=np.uint8)).view(_FP8[src][0]).float().numpy()


def _e5m2_bits_to_bf16_bits(bits: np.ndarray) -> np.ndarray:
    """Triton's e5m2 -> bf16 cast on sm_90 (3.6): the code's exponent rebiased with integer arithmetic, so the
    infinities and NaNs (exponent 31) read as the finite 2**16 * (1 + m/4); zeros, subnormals and normals are exact."""
    codes = np.ascontiguousarray(bits, dtype=np.uint8).astype(np.uint16)
    exact = _f32_to_bf16_bits(_fp8_bits_to_f32(bits, tl.float8e5))
    rebiased = (codes & 0x80) << 8 | (((codes & 0x7F) << 5) + (112 << 7))
    return np.where((codes & 0x7C) == 0x7C, rebiased, exact).astype(np.uint16)


def _exact_f32(handle) -> np.ndarray:
    """A bf16, fp8 or wider float operand's values in float32 (exact)."""
    if handle.dtype.scalar == tl.bfloat16:
        return _bf16_bits_to_f32(handle.data)
    if handle.dtype.scalar in _FP8:
        return _fp8_bits_to_f32(handle.data, handle.dtype.scalar)
    return handle.data.astype(np.float32)


def _e2m1_bytes_to_bf16(values, factors):
    """E2M1_BYTES_TO_BF16X2 by definition: each byte's two nibbles times its bf16 factor, rounded once."""
    codes = torch.from_numpy(values.data.astype(np.int64))
    factor = _bf16_bits_to_f32(factors.data)
    halves = [decode_e2m1(codes & 15).numpy(), decode_e2m1(codes >> 4).numpy()]
    with np.errstate(over="ignore"):  # products past bf16 range are inf, as on the GPU
        return _AsmResults([interpreter.TensorHandle(_f32_to_bf16_bits(half * factor), tl.bfloat16) for half in halves])


def _e2m1_word_to_bf16(words, factors):
    """E2M1_WORD_TO_BF16 by definition: the word's 8 nibbles (their bits where ogsgen.numerics.layouts.hopper.WORD_BITS
    puts them), register by register and low lane first, times their row's bf16 factor (row r's in the low half
    of ``factors``, row r + 8's in the high half), rounded once."""
    bits = words.data.astype(np.int64) & 0xFFFFFFFF
    pair = factors.data.astype(np.int64) & 0xFFFFFFFF
    outputs = []
    for register, lanes in enumerate(WORD_BITS):
        factor = _bf16_bits_to_f32((pair >> (16 * (register % 2))) & 0xFFFF)
        for positions in lanes:
            codes = sum(((bits >> position) & 1) << bit for bit, position in enumerate(positions))
            with np.errstate(over="ignore"):  # products past bf16 range are inf, as on the GPU
                value = decode_e2m1(torch.from_numpy(codes)).numpy() * factor
            outputs.append(interpreter.TensorHandle(_f32_to_bf16_bits(value), tl.bfloat16))
    return _AsmResults(outputs)


def _word_to_e4m3(word_bytes, table_r, table_r_high, table_r8, table_r8_high):
    """WORD_TO_E4M3 by definition, on the 4 bytes of each word along the last axis (4 packed per call, as the
    kernels lay them out): nibble i of the word's low (high) 16 bits is e4m3 byte i of row r (r + 8): its row's table
    byte for its magnitude bits (bytes 0-3 the first table register, 4-7 the second; each call reads its first
    element's tables), with its sign bit."""
    data = word_bytes.data.astype(np.int64)
    outputs = []
    for half, tables in ((0, (table_r, table_r_high)), (1, (table_r8, table_r8_high))):
        codes = np.stack([(data[..., 2 * half + i // 2] >> 4 * (i % 2)) & 15 for i in range(4)], -1)
        low, high = (t.data[..., :1].astype(np.int64) & 0xFFFFFFFF for t in tables)
        magnitude = codes & 7
        table = np.where(magnitude < 4, low, high)
        byte = ((table >> (8 * (magnitude % 4))) & 0xFF) | ((codes & 8) << 4)
        outputs.append(interpreter.TensorHandle(byte.astype(np.uint8), tl.float8e4nv))
    return _AsmResults(outputs)


class _AsmResults(list):
    """What ``tl.inline_asm_elementwise`` reads the outputs of an inline-asm op from."""

    def get_result(self, index):
        return self[index]


def _request_wgmma_waits():
    """REQUEST_WGMMA_WAITS by definition: nothing (its one output is unused)."""
    return _AsmResults([interpreter.TensorHandle(np.zeros(1, np.int32), tl.int32)])


_PTX_DEFINITIONS = {E2M1_BYTES_TO_BF16X2.value: _e2m1_bytes_to_bf16, E2M1_WORD_TO_BF16.value: _e2m1_word_to_bf16,
                    WORD_TO_E4M3.value: _word_to_e4m3, REQUEST_WGMMA_WAITS.value: _request_wgmma_waits}


def convert_loop_bounds() -> None:
    """Let Triton 3.6's interpreter take a kernel value as a loop bound under any numpy (idempotent). Installed on
    import under the interpreter, even with OGSGEN_INTERPRETER_FIXES=0: without it most of ogsgen's kernels stop,
    with it none computes differently."""
    original = getattr(interpreter, "_patch_lang_tensor", None)  # (later releases convert the bound themselves)
    if original is None or getattr(original, "_ogsgen_fixed", False):
        return

    def patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: operator.index(self.handle.data.item()))

    patch_lang_tensor._ogsgen_fixed = True
    interpreter._patch_lang_tensor = patch_lang_tensor


def installed() -> bool:
    return getattr(interpreter.InterpreterBuilder, "_ogsgen_fixed", False)


def install() -> None:
    """Correct Triton's interpreter in this process (idempotent; it stays corrected)."""
    if installed():
        return
    builder = interpreter.InterpreterBuilder
    original_dot, original_cast, original_fp_to_fp = builder.create_dot, builder.cast_impl, builder.create_fp_to_fp

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if any(h.dtype.scalar == tl.bfloat16 or h.dtype.scalar in _FP8 for h in (a, b)):
            a, b = (interpreter.TensorHandle(_exact_f32(h), tl.float32) for h in (a, b))
        return original_dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    def fixed_cast(src, dst_type):
        if src.dtype.scalar in _FP8 and dst_type.scalar in (tl.float32, tl.float16, tl.bfloat16):  # an upcast
            values = _fp8_bits_to_f32(src.data, src.dtype.scalar)
            if dst_type.scalar == tl.bfloat16 and src.dtype.scalar == tl.float8e5:
                return interpreter.TensorHandle(_e5m2_bits_to_bf16_bits(src.data), tl.bfloat16)
            if dst_type.scalar == tl.bfloat16:
                return interpreter.TensorHandle(_f32_to_bf16_bits(values), tl.bfloat16)
            return interpreter.TensorHandle(values.astype(np.float16 if dst_type.scalar == tl.float16 else np.float32),
                                            dst_type.scalar)
        if src.dtype.scalar == tl.bfloat16 and dst_type.scalar == tl.float32:
            return interpreter.TensorHandle(_bf16_bits_to_f32(src.data), tl.float32)
        if src.dtype.scalar in (tl.bfloat16, tl.float16) and dst_type.scalar in _FP8:  # exact in fp32, then rounded
            return interpreter.TensorHandle(_f32_to_fp8_bits(_exact_f32(src), dst_type.scalar), dst_type.scalar)
        if src.dtype.scalar != tl.float32:
            return None
        if dst_type.scalar == tl.bfloat16:
            return interpreter.TensorHandle(_f32_to_bf16_bits(src.data), tl.bfloat16)
        if dst_type.scalar in _FP8:
            return interpreter.TensorHandle(_f32_to_fp8_bits(src.data, dst_type.scalar), dst_type.scalar)
        return None

    def cast_impl(self, src, dst_type):
        fixed = fixed_cast(src, dst_type)
        return fixed if fixed is not None else original_cast(self, src, dst_type)

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        fixed = fixed_cast(src, dst_type)
        return fixed if fixed is not None else original_fp_to_fp(self, src, dst_type, rounding_mode)

    def create_inline_asm(self, inline_asm, constraints, values, types, is_pure, pack):
        definition = _PTX_DEFINITIONS.get(inline_asm)
        if definition is None:
            raise NotImplementedError("inline_asm not supported in interpreter mode")
        return definition(*values)

    # A min/max that does not propagate NaN returns the other operand (a NaN only from two NaNs): np.fmin/np.fmax.
    # tl.clamp without propagate_nan is min(x, hi) first, then the max with lo: a NaN x gives hi.
    def create_clampf(self, arg, lo, hi, propagate_nans):
        if propagate_nans == tl.PropagateNan.NONE:
            return self.binary_op(self.binary_op(arg, hi, np.fmin), lo, np.fmax)
        return self.ternary_op(arg, lo, hi, np.clip)

    convert_loop_bounds()
    builder.create_minnumf = lambda self, lhs, rhs: self.binary_op(lhs, rhs, np.fmin)
    builder.create_maxnumf = lambda self, lhs, rhs: self.binary_op(lhs, rhs, np.fmax)
    builder.create_clampf = create_clampf
    builder.create_dot, builder.cast_impl, builder.create_fp_to_fp = create_dot, cast_impl, create_fp_to_fp
    builder.create_inline_asm = create_inline_asm
    builder._ogsgen_fixed = True


# Elements whose kernels the uncorrected interpreter computes wrongly (bf16 dots and casts, fp8 casts, e2m1 PTX).
_MISREAD_ELEMENTS = frozenset({"bf16", "e2m1", *FP8_ELEMENTS})
_warned = False


def prepare(elements) -> None:
    """Before ogsgen launches kernels of these elements under the interpreter: install the corrections, unless
    OGSGEN_INTERPRETER_FIXES=0, in which case warn once when the elements are ones the interpreter gets wrong."""
    global _warned
    if os.environ.get("OGSGEN_INTERPRETER_FIXES", "1") != "0":
        install()
    elif not installed() and not _warned and _MISREAD_ELEMENTS.intersection(elements):
        _warned = True
        warn_at_caller("ogsgen: Triton's interpreter computes bf16 dots, fp32->bf16/fp8 casts and inline PTX wrongly, "
                       "and OGSGEN_INTERPRETER_FIXES=0 keeps it uncorrected: results of bf16, fp8 and mxfp4 kernels on "
                       "the CPU will be wrong. Unset it, or call ogsgen.testing.install_interpreter_fixes().",
                       RuntimeWarning)


_launch_lock = threading.RLock()


def serialize_launches() -> None:
    """Let one interpreted launch run at a time in this process, whichever thread makes it (idempotent)."""
    run = interpreter.InterpretedFunction.run
    if getattr(run, "_ogsgen_serialized", False):
        return

    def serialized(self, *args, **kwargs):
        with _launch_lock:
            return run(self, *args, **kwargs)

    serialized._ogsgen_serialized = True
    interpreter.InterpretedFunction.run = serialized


if interpreting():  # before any of ogsgen's kernels can launch (every module that defines one imports this package)
    serialize_launches()
    convert_loop_bounds()
