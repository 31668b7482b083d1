"""Work around known defects of Triton's CPU interpreter (TRITON_INTERPRET=1) in the test harness.

The generated kernels are the same ones that run on the GPU; only the interpreter's emulation of
two operations is corrected here (users_ecosystem.md §4 lists the defects, in every release
3.3-3.9):

* ``tl.dot`` with bf16 operands multiplies the raw uint16 storage: upcast bf16 to fp32 first,
  as the GPU's MMA does;
* fp32 -> bf16 casts truncate: round to nearest even, as the GPU does.
"""
import numpy as np
import triton.language as tl
from triton.runtime import interpreter


def _bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _f32_to_bf16_bits(values: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(values), np.uint16(0x7FC0), rounded)


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

    def is_f32_to_bf16(src, dst_type):
        return src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16

    def cast_impl(self, src, dst_type):
        if is_f32_to_bf16(src, dst_type):
            return interpreter.TensorHandle(_f32_to_bf16_bits(src.data), tl.bfloat16)
        return original_cast(self, src, dst_type)

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        if is_f32_to_bf16(src, dst_type):
            return cast_impl(self, src, dst_type)
        return original_fp_to_fp(self, src, dst_type, rounding_mode)

    builder.create_dot, builder.cast_impl, builder.create_fp_to_fp = create_dot, cast_impl, create_fp_to_fp
    builder._ogsgen_fixed = True
