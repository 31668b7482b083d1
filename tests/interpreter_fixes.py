"""Work around known defects of Triton's CPU interpreter (TRITON_INTERPRET=1) in the test harness.

The generated kernels are the same ones that run on the GPU; only the interpreter's emulation of
two operations is corrected here (users_ecosystem.md §4 lists the defects, in every release
3.3-3.9):

* ``tl.dot`` with bf16 operands multiplies the raw uint16 storage: upcast bf16 to fp32 first,
  as the GPU's MMA does;
* fp32 -> bf16 casts truncate: round to nearest even, as the GPU does;
* fp32 -> fp8 casts lose the carry of a round-up: round to nearest even and saturate to the
  largest finite value (NaN stays NaN), as Hopper's ``cvt.rn.satfinite`` does.
"""
import numpy as np
import torch
import triton.language as tl
from triton.runtime import interpreter

_FP8 = {tl.float8e4nv: (torch.float8_e4m3fn, 448.0), tl.float8e5: (torch.float8_e5m2, 57344.0)}


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


def install() -> None:
    builder = interpreter.InterpreterBuilder
    if getattr(builder, "_ogsgen_fixed", False):
        return
    original_dot, original_cast, original_fp_to_fp = builder.create_dot, builder.cast_impl, builder.create_fp_to_fp

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.dtype.scalar == tl.bfloat16 or b.dtype.scalar == tl.bfloat16:
            a = interpreter.TensorHandle(_bf16_bits_to_f32(a.data) if a.dtype.scalar == tl.bfloat16 else a.data,
                                         tl.float32)
            b = interpreter.TensorHandle(_bf16_bits_to_f32(b.data) if b.dtype.scalar == tl.bfloat16 else b.data,
                                         tl.float32)
        return original_dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    def fixed_downcast(src, dst_type):
        if src.dtype.scalar != tl.float32:
            return None
        if dst_type.scalar == tl.bfloat16:
            return interpreter.TensorHandle(_f32_to_bf16_bits(src.data), tl.bfloat16)
        if dst_type.scalar in _FP8:
            return interpreter.TensorHandle(_f32_to_fp8_bits(src.data, dst_type.scalar), dst_type.scalar)
        return None

    def cast_impl(self, src, dst_type):
        fixed = fixed_downcast(src, dst_type)
        return fixed if fixed is not None else original_cast(self, src, dst_type)

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        fixed = fixed_downcast(src, dst_type)
        return fixed if fixed is not None else original_fp_to_fp(self, src, dst_type, rounding_mode)

    builder.create_dot, builder.cast_impl, builder.create_fp_to_fp = create_dot, cast_impl, create_fp_to_fp
    builder._ogsgen_fixed = True
