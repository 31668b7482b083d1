"""Scaled numeric formats: MX (e8m0 block scales), fp8 with float32 block scales, and flexpoint (fp8 with fp32
tensor scales)."""
from . import interpreter  # noqa: F401 (under TRITON_INTERPRET=1: interpreted launches take turns)
from .flex import actual_scale_torch, max_finite
from .fp8_blocks import FP8_BLOCK, FP8_E4M3_MAX, dequantize_fp8_torch, quantize_fp8, quantize_fp8_torch
from .kernels import dequantize_mx, quantize_mx
from .layouts import SwizzledMxValues, swizzle_mx_values, unswizzle_mx_values
from .mx import MX_BLOCK, dequantize_mx_torch, quantize_mx_torch

__all__ = ["actual_scale_torch", "max_finite", "dequantize_mx", "quantize_mx", "MX_BLOCK", "dequantize_mx_torch",
           "quantize_mx_torch", "SwizzledMxValues", "swizzle_mx_values", "unswizzle_mx_values",
           "FP8_BLOCK", "FP8_E4M3_MAX", "dequantize_fp8_torch", "quantize_fp8", "quantize_fp8_torch"]
