"""Numeric formats of x, w and y.

A format is an element type plus how it is scaled:

* ``none``: plain values (bf16, fp16, fp32);
* ``flexpoint``: fp8 values times one fp32 scale per tensor (or per expert for w);
* ``block_e8m0``: values (fp8, or fp4 e2m1 packed two per byte) times a power-of-two e8m0
  scale shared by ``block_size`` consecutive elements along K;
* ``block_f32``: fp8 values times float32 scales, one per ``block_size`` values along K (0: all of K) and per
  row of x, per column or 128 columns of w (DeepSeek-style 128 x 128 blocks; per-channel weights with
  per-row activations);
* ``block_e4m3``: e2m1 values packed two per byte times an e4m3 scale per ``block_size`` (16) values along K and
  one float32 scale per tensor or per expert (NVFP4: NVIDIA ModelOpt's FP4 checkpoints).

Where a kernel applies a format's scales (``NumericFormat.scales_apply``) follows from the scaling: to the values
before the dot (MX: the weights are upcast), to each K group's partial product (``block_f32`` with a block), or
once in the epilogue (flexpoint, ``block_f32`` over all of K); NVFP4 has both: block scales on the values, its
per-tensor scale in the epilogue.

``layout`` names how the values are arranged in memory: ``strided`` is an ordinary torch tensor;
``hopper`` is mxfp4 weights rearranged for the in-register upcast (``ogsgen.numerics.layouts``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import SpecError

SCALINGS = ("none", "flexpoint", "block_e8m0", "block_f32", "block_e4m3")
# The element of a scaling's scales: e8m0 bytes (powers of two) or float32 values
SCALE_ELEMENTS = {"none": None, "flexpoint": "fp32", "block_e8m0": "e8m0", "block_f32": "fp32", "block_e4m3": "e4m3"}
# Scalings whose scales apply to the values, in registers, before the dot (their elements are upcast there)
UPCAST_SCALINGS = ("block_e8m0", "block_e4m3")
# Scalings with one float32 scale per tensor (or per expert or batch entry), applied in the epilogue
GLOBAL_SCALINGS = ("flexpoint", "block_e4m3")
LAYOUTS = ("strided", "hopper")

MX_BLOCK = 32  # values along K that share one e8m0 scale (the OCP MX block)
FP8_BLOCK = 128  # values along K (and columns of w) that share one float32 scale in DeepSeek-style fp8
NVFP4_BLOCK = 16  # values along K that share one e4m3 scale in NVFP4


@dataclass(frozen=True)
class Element:
    """One element type: every numeric fact of it that ogsgen uses, in one place."""
    name: str
    torch_dtype: torch.dtype  # the dtype of the tensor that stores the values (uint8 for packed fp4)
    bits: int
    tl_dtype: str             # the Triton type a kernel names
    max_finite: float
    mx_emax: int | None = None         # MX elements: the binary exponent of the largest value
    mx_max_mantissa: int | None = None  # ... and its mantissa bits as a float32 mantissa field

    @property
    def is_fp8(self) -> bool:
        return self.bits == 8


ELEMENTS = {e.name: e for e in (
    Element("bf16", torch.bfloat16, 16, "tl.bfloat16", 3.3895313892515355e38),
    Element("fp16", torch.float16, 16, "tl.float16", 65504.0),
    Element("fp32", torch.float32, 32, "tl.float32", 3.4028234663852886e38),
    Element("e4m3", torch.float8_e4m3fn, 8, "tl.float8e4nv", 448.0, 8, 0x600000),
    Element("e5m2", torch.float8_e5m2, 8, "tl.float8e5", 57344.0, 15, 0x600000),
    Element("e2m1", torch.uint8, 4, "tl.uint8", 6.0, 2, 0x400000),
)}
MX_ELEMENTS = tuple(sorted(name for name, e in ELEMENTS.items() if e.mx_emax is not None))
FP8_ELEMENTS = tuple(name for name, e in ELEMENTS.items() if e.is_fp8)


@dataclass(frozen=True)
class NumericFormat:
    element: str
    scaling: str = "none"
    block_size: int = 0
    layout: str = "strided"

    def __post_init__(self):
        if self.element not in ELEMENTS:
            raise SpecError(f"format element must be one of {sorted(ELEMENTS)}, got {self.element!r}")
        if self.scaling not in SCALINGS:
            raise SpecError(f"format scaling must be one of {SCALINGS}, got {self.scaling!r}")
        if self.layout not in LAYOUTS:
            raise SpecError(f"format layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.scaling == "block_e8m0" and self.block_size <= 0:
            raise SpecError(f"format {self.element}: 'block_e8m0' scaling needs a block_size (values along K per "
                            f"scale)")
        if self.scaling == "block_f32" and self.block_size not in (0, FP8_BLOCK):
            raise SpecError(f"format {self.element}: 'block_f32' scales take block_size {FP8_BLOCK} (a scale per "
                            f"{FP8_BLOCK} values of K) or 0 (one for all of K), got {self.block_size}")
        if self.scaling == "block_e4m3" and (self.element, self.block_size) != ("e2m1", NVFP4_BLOCK):
            raise SpecError(f"'block_e4m3' scaling is NVFP4: e2m1 values with block_size {NVFP4_BLOCK}, got "
                            f"{self.element} with block_size {self.block_size}")
        if self.scaling not in ("block_e8m0", "block_f32", "block_e4m3") and self.block_size:
            raise SpecError(f"format {self.element}: block_size applies to 'block_e8m0' and 'block_f32' scaling, not "
                            f"{self.scaling!r} (and to NVFP4's 'block_e4m3')")
        if self.element == "e2m1" and self.scaling not in UPCAST_SCALINGS:
            raise SpecError("e2m1 (fp4) values need block_e8m0 scales (use MXFP4) or block_e4m3 scales (NVFP4)")
        if self.layout == "hopper" and (self.element, self.scaling) != ("e2m1", "block_e8m0"):
            raise SpecError(f"the hopper layout holds mxfp4 values, not {self.element} ({self.scaling})")
        if self.scaling in ("flexpoint", "block_f32") and self.bits != 8:
            raise SpecError(f"{self.scaling} scaling applies to fp8 elements, not {self.element}")

    @property
    def bits(self) -> int:
        return ELEMENTS[self.element].bits

    @property
    def scales_apply(self) -> str:
        """Where a kernel applies the scales: ``"none"``; ``"operand"`` (to the values, before the dot);
        ``"k_group"`` (to each group of ``block_size`` K values' partial product); ``"epilogue"`` (once, to the
        accumulated products)."""
        if self.scaling == "none":
            return "none"
        if self.scaling in UPCAST_SCALINGS:
            return "operand"
        return "k_group" if self.scaling == "block_f32" and self.block_size else "epilogue"

    @property
    def scale_element(self) -> str | None:
        """The element of the block scales: 'e8m0' (uint8 powers of two), 'e4m3', 'fp32', or None for plain
        values."""
        return SCALE_ELEMENTS[self.scaling]

    @property
    def has_global_scale(self) -> bool:
        """One float32 scale for the whole tensor (or one per expert or batch entry)."""
        return self.scaling in GLOBAL_SCALINGS

    @property
    def has_block_scales(self) -> bool:
        """Scales that vary along K or across rows and columns (MX, fp8 block and channel scales), not one
        per tensor."""
        return self.scaling in ("block_e8m0", "block_f32", "block_e4m3")

    def logical_k(self, stored_rows: int) -> int:
        """K of values stored in ``stored_rows`` rows along K (packed e2m1: two values a byte)."""
        return stored_rows * (2 if self.element == "e2m1" else 1)

    def scale_block_n(self, block_scales: torch.Tensor, n: int) -> int:
        """Columns of w that share one block scale: 128 for fp8's 128 x 128 blocks (scales with fewer columns
        than w), else 1 (per column: MX, NVFP4, channel scales, and b128 scales of interleaved gate/up columns)."""
        return FP8_BLOCK if self.scaling == "block_f32" and block_scales.shape[-1] != n else 1

    @property
    def torch_dtype(self) -> torch.dtype:
        """The dtype of the tensor that stores the values (uint8 for packed fp4)."""
        return ELEMENTS[self.element].torch_dtype

    @property
    def name(self) -> str:
        """Short name used inside canonical kernel names."""
        if self.scaling == "block_e8m0":
            base = "mxfp4" if self.element == "e2m1" else f"mxfp8{self.element}"
        elif self.scaling == "block_e4m3":
            base = "nvfp4"
        elif self.scaling == "flexpoint":
            base = f"fp8{self.element}"
        elif self.scaling == "block_f32":
            base = f"fp8{self.element}_b{self.block_size}" if self.block_size else f"fp8{self.element}_channel"
        else:
            base = self.element
        return base if self.layout == "strided" else f"{base}{self.layout.replace('_', '')}"

    def describe(self) -> dict:
        return {"element": self.element, "scaling": self.scaling, "block_size": self.block_size,
                "layout": self.layout}


BF16 = NumericFormat("bf16")
FP16 = NumericFormat("fp16")
FP32 = NumericFormat("fp32")
FP8_E4M3 = NumericFormat("e4m3", "flexpoint")
FP8_E5M2 = NumericFormat("e5m2", "flexpoint")
MXFP4 = NumericFormat("e2m1", "block_e8m0", MX_BLOCK)
MXFP4_HOPPER = NumericFormat("e2m1", "block_e8m0", MX_BLOCK, layout="hopper")
MXFP8_E4M3 = NumericFormat("e4m3", "block_e8m0", MX_BLOCK)
MXFP8_E5M2 = NumericFormat("e5m2", "block_e8m0", MX_BLOCK)
FP8_E4M3_B128 = NumericFormat("e4m3", "block_f32", FP8_BLOCK)   # w: 128 x 128 blocks; x: per row, 128 of K
FP8_E4M3_CHANNEL = NumericFormat("e4m3", "block_f32", 0)        # w: per column; x: per row (or per tensor)
NVFP4 = NumericFormat("e2m1", "block_e4m3", NVFP4_BLOCK)         # w: e4m3 scales per 16 of K, a global scale

BY_NAME = {f.name: f for f in (BF16, FP16, FP32, FP8_E4M3, FP8_E5M2, MXFP4, MXFP4_HOPPER, MXFP8_E4M3, MXFP8_E5M2,
                                FP8_E4M3_B128, FP8_E4M3_CHANNEL, NVFP4)}

_PLAIN_BY_DTYPE = {f.torch_dtype: f for f in (BF16, FP16, FP32)}
FLEX_BY_DTYPE = {f.torch_dtype: f for f in (FP8_E4M3, FP8_E5M2)}      # an fp8 tensor with a flexpoint scale
MX_FP8_BY_DTYPE = {f.torch_dtype: f for f in (MXFP8_E4M3, MXFP8_E5M2)}  # an fp8 tensor with e8m0 block scales


_CONSTANT_NAMES = {fmt: name for name, fmt in globals().items() if isinstance(fmt, NumericFormat) and name.isupper()}


def constant_name(fmt: NumericFormat) -> str:
    """The ``ogsgen.spec`` constant of a format (``BF16``), or its constructor where it has none."""
    return _CONSTANT_NAMES.get(fmt, repr(fmt))


def format_named(name: str) -> NumericFormat:
    try:
        return BY_NAME[name]
    except KeyError:
        raise SpecError(f"unknown format {name!r}; known formats: {sorted(BY_NAME)}") from None


def plain_format_of(dtype: torch.dtype, argument: str) -> NumericFormat:
    """The unscaled format of a torch dtype, or an error naming the argument."""
    try:
        return _PLAIN_BY_DTYPE[dtype]
    except KeyError:
        raise SpecError(f"{argument} has dtype {dtype}; supported dtypes here are bfloat16, float16 and "
                        f"float32 (fp8 and mx formats need a PrecisionConfig with scales)") from None
