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
``hopper`` is mxfp4 weights rearranged for the in-register upcast to bf16, ``hopper_fp8`` for the in-register
conversion to e4m3 that e4m3 x multiplies on Hopper (``ogsgen.numerics.layouts``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import SpecError

LAYOUTS = ("strided", "hopper", "hopper_fp8")

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
class Scaling:
    """One way of scaling values: every fact of it that ogsgen uses, in one place (a new scaling is one entry in
    ``SCALINGS`` plus its ``codec`` module)."""
    name: str
    elements: tuple[str, ...]          # the value elements it scales
    scale_element: str | None = None   # the element of its block scales (or of its per-tensor scale)
    block_sizes: tuple[int, ...] = (0,)  # values along K per block scale it takes (0: one scale for all of K)
    block_scales_apply: str | None = None  # "operand" (upcast in registers before the dot) or "k_group"; None:
    global_scale: bool = False         # one float32 scale per tensor (or expert), applied in the epilogue
    codec: str | None = None           # the ogsgen.numerics module with its codec (quantize, dequantize in torch)
    prefix: str = ""                   # its formats' names: prefix + the element's short name (+ a block suffix)

    @property
    def has_block_scales(self) -> bool:
        return self.block_scales_apply is not None


def _short_name(element: str) -> str:
    return "fp4" if element == "e2m1" else f"fp8{element}" if ELEMENTS[element].is_fp8 else element


SCALINGS = {s.name: s for s in (
    Scaling("none", tuple(e for e in ELEMENTS if e != "e2m1")),
    Scaling("flexpoint", FP8_ELEMENTS, "fp32", global_scale=True, codec="flex"),
    Scaling("block_e8m0", MX_ELEMENTS, "e8m0", (MX_BLOCK,), "operand", codec="kernels", prefix="mx"),
    Scaling("block_f32", FP8_ELEMENTS, "fp32", (FP8_BLOCK, 0), "k_group", codec="fp8_blocks"),
    Scaling("block_e4m3", ("e2m1",), "e4m3", (NVFP4_BLOCK,), "operand", global_scale=True, codec="nvfp4",
            prefix="nv"),
)}


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
            raise SpecError(f"format scaling must be one of {tuple(SCALINGS)}, got {self.scaling!r}")
        if self.layout not in LAYOUTS:
            raise SpecError(f"format layout must be one of {LAYOUTS}, got {self.layout!r}")
        scaling = self.scheme
        if self.element not in scaling.elements:
            if self.element in SCALINGS["none"].elements:
                raise SpecError(f"{self.scaling} scaling applies to {_elements_phrase(scaling.elements)}, not "
                                f"{self.element}")
            takers = [s for s in SCALINGS.values() if self.element in s.elements]
            raise SpecError(f"{_elements_phrase((self.element,))} values need "
                            + " or ".join(f"{s.name} scales (use {_example_of(s, self.element)})" for s in takers))
        if self.block_size not in scaling.block_sizes:
            if not scaling.has_block_scales:
                blocked = [repr(s.name) for s in SCALINGS.values() if s.has_block_scales]
                raise SpecError(f"format {self.element}: block_size applies to {', '.join(blocked[:-1])} and "
                                f"{blocked[-1]} scaling, not {self.scaling!r}")
            sizes = " or ".join(f"{b} (a scale per {b} values of K)" if b else "0 (one for all of K)"
                                for b in scaling.block_sizes)
            raise SpecError(f"format {self.element}: {self.scaling!r} scales take block_size {sizes}, got "
                            f"{self.block_size}")
        if self.layout != "strided" and (self.element, self.scaling) != ("e2m1", "block_e8m0"):
            raise SpecError(f"the {self.layout} layout holds mxfp4 values, not {self.element} ({self.scaling})")

    @property
    def scheme(self) -> Scaling:
        """The declaration of this format's scaling."""
        return SCALINGS[self.scaling]

    @property
    def bits(self) -> int:
        return ELEMENTS[self.element].bits

    @property
    def scales_apply(self) -> str:
        """Where a kernel applies the scales: ``"none"``; ``"operand"`` (to the values, before the dot);
        ``"k_group"`` (to each group of ``block_size`` K values' partial product); ``"epilogue"`` (once, to the
        accumulated products)."""
        scaling = self.scheme
        if scaling.block_scales_apply == "operand":
            return "operand"
        if scaling.has_block_scales and self.block_size:
            return scaling.block_scales_apply
        return "epilogue" if scaling.scale_element else "none"

    @property
    def scale_element(self) -> str | None:
        """The element of the block scales: 'e8m0' (uint8 powers of two), 'e4m3', 'fp32', or None for plain
        values."""
        return self.scheme.scale_element

    @property
    def scale_dtype(self) -> torch.dtype | None:
        """The dtype of the tensor that stores the block scales (uint8 for e8m0 codes)."""
        element = self.scale_element if self.has_block_scales else None
        return None if element is None else torch.uint8 if element == "e8m0" else ELEMENTS[element].torch_dtype

    @property
    def has_global_scale(self) -> bool:
        """One float32 scale for the whole tensor (or one per expert or batch entry)."""
        return self.scheme.global_scale

    @property
    def has_block_scales(self) -> bool:
        """Scales that vary along K or across rows and columns (MX, fp8 block and channel scales), not one
        per tensor."""
        return self.scheme.has_block_scales

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
        base = self.scheme.prefix + _short_name(self.element)
        if self.scaling == "block_f32":
            base += f"_b{self.block_size}" if self.block_size else "_channel"
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
MXFP4_HOPPER_FP8 = NumericFormat("e2m1", "block_e8m0", MX_BLOCK, layout="hopper_fp8")
MXFP8_E4M3 = NumericFormat("e4m3", "block_e8m0", MX_BLOCK)
MXFP8_E5M2 = NumericFormat("e5m2", "block_e8m0", MX_BLOCK)
FP8_E4M3_B128 = NumericFormat("e4m3", "block_f32", FP8_BLOCK)   # w: 128 x 128 blocks; x: per row, 128 of K
FP8_E4M3_CHANNEL = NumericFormat("e4m3", "block_f32", 0)        # w: per column; x: per row (or per tensor)
NVFP4 = NumericFormat("e2m1", "block_e4m3", NVFP4_BLOCK)         # w: e4m3 scales per 16 of K, a global scale

BY_NAME = {f.name: f for f in (BF16, FP16, FP32, FP8_E4M3, FP8_E5M2, MXFP4, MXFP4_HOPPER, MXFP4_HOPPER_FP8, MXFP8_E4M3,
                                MXFP8_E5M2, FP8_E4M3_B128, FP8_E4M3_CHANNEL, NVFP4)}
SWIZZLED_MXFP4 = {f.layout: f for f in (MXFP4_HOPPER, MXFP4_HOPPER_FP8)}  # mxfp4 formats by swizzled value layout

_PLAIN_BY_DTYPE = {f.torch_dtype: f for f in (BF16, FP16, FP32)}
FLEX_BY_DTYPE = {f.torch_dtype: f for f in (FP8_E4M3, FP8_E5M2)}      # an fp8 tensor with a flexpoint scale
MX_FP8_BY_DTYPE = {f.torch_dtype: f for f in (MXFP8_E4M3, MXFP8_E5M2)}  # an fp8 tensor with e8m0 block scales


def _elements_phrase(elements) -> str:
    if tuple(elements) == FP8_ELEMENTS:
        return "fp8 elements"
    return ", ".join("e2m1 (fp4)" if e == "e2m1" else e for e in elements)


def _example_of(scaling: Scaling, element: str) -> str:
    return next(constant_name(f) for f in BY_NAME.values() if (f.scaling, f.element) == (scaling.name, element))


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
