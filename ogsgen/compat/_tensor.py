"""triton_kernels' tensor wrappers (``Tensor``, ``Storage``, its sub-byte dtypes and layouts), shared by the three
generations' packages, and their translation into what ``ogsgen.matmul_ogs`` takes.

A wrapped tensor here holds ogsgen's own storage: ``convert_layout`` to ``HopperMXValueLayout`` stores the values as
``ogsgen.swizzle_mx_values`` does (int32 words for the in-register upcast), and to ``HopperMXScaleLayout`` stores the
e8m0 scales N-contiguous, as ogsgen's kernels read them fastest. What ogsgen's kernels cannot read (Blackwell and AMD
layouts, bytes swizzled by triton_kernels itself, mxfp4 packed along N) raises UnsupportedError or SpecError where it
is made or passed, never a wrong result.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from ..devices import target
from ..errors import SpecError, SpecTypeError, UnsupportedError
from ..numerics.layouts import SwizzledMxValues, swizzle_mx_values, unswizzle_mx_values
from ..numerics.layouts.hopper import HopperLayout
from ..numerics.mx import MX_BLOCK


# ------------------------------------------------------------------ dtypes

@dataclass(frozen=True)
class IntegerType:
    bitwidth: int


@dataclass(frozen=True)
class FloatType:
    bitwidth_exponent: int
    bitwidth_mantissa: int
    is_signed: bool

    @property
    def bitwidth(self) -> int:
        return int(self.is_signed) + self.bitwidth_exponent + self.bitwidth_mantissa


BIT = IntegerType(1)
FP4 = FloatType(2, 1, True)


def bitwidth(dtype) -> int:
    """Bits per element of a torch dtype or of one of the types above."""
    return dtype.itemsize * 8 if isinstance(dtype, torch.dtype) else dtype.bitwidth


# ------------------------------------------------------------------ layouts

class Layout:
    """How a tensor's values are stored. ``swizzle_data`` takes the strided values (as ``wrap_torch_tensor``
    stores them) to this layout's storage, ``unswizzle_data`` back; ``initial_shape`` is the strided data's shape."""
    name: str | None = None

    def __init__(self, shape=None):
        self.initial_shape = None if shape is None else tuple(shape)

    def swizzle_data(self, data: torch.Tensor) -> torch.Tensor:
        return data

    def unswizzle_data(self, data: torch.Tensor) -> torch.Tensor:
        return data

    def swizzle_block_shape(self, block_shape):
        return block_shape

    def __iter__(self):
        # The newest triton_kernels' make_default_* helpers return a layout, older ones (layout, options): a layout
        # from ours unpacks as (itself, {}) for callers of either.
        return iter((self, {}))


class StridedLayout(Layout):
    """Values as torch stores them. ``StridedLayout(major_dim)`` (an int, the newest triton_kernels' form) asks
    ``convert_layout`` for data contiguous along that dimension; a shape or a dimension order is accepted and read
    as no such request."""
    name = "STRIDED"

    def __init__(self, shape=None, major_dim=None):
        if isinstance(shape, int) and not isinstance(shape, bool):
            shape, major_dim = None, shape
        super().__init__(shape)
        self.major_dim = major_dim

    def swizzle_data(self, data):
        if self.major_dim is None or data.stride(self.major_dim) == 1:
            return data
        return data.movedim(self.major_dim, -1).contiguous().movedim(-1, self.major_dim)


def _check_k_axis(mx_axis, ndim: int, layout: str) -> None:
    if not isinstance(mx_axis, int) or isinstance(mx_axis, bool) or not -ndim <= mx_axis < ndim \
            or mx_axis % ndim != ndim - 2:
        raise UnsupportedError(f"{layout}(mx_axis={mx_axis!r}): ogsgen's layouts hold matmul weights (..., K, N) "
                               f"microscaled along K, the axis {ndim - 2} (or -2) of this {ndim}-D tensor; pass "
                               f"mx_axis={ndim - 2}")


class HopperMXValueLayout(Layout):
    """mxfp4 weight values in ogsgen's hopper layout (``ogsgen.swizzle_mx_values``: int32 words the kernels upcast in
    registers for wgmma), from the strided uint8 values (..., K // 2, N) packed along K (``mx_axis`` = the K axis).
    The words are not triton_kernels' bytes: values swizzled by triton_kernels cannot be read here."""
    name = "HOPPER_VALUE"

    def __init__(self, shape=None, mx_axis=None, mma_version=3):
        super().__init__(shape)
        if mma_version not in (2, 3):
            raise SpecError(f"HopperMXValueLayout(mma_version={mma_version!r}): 2 (mma.sync) or 3 (wgmma)")
        self.mx_axis, self.mma_version = mx_axis, mma_version

    def swizzle_data(self, data):
        if data.dtype != torch.uint8 or data.ndim < 2:
            raise SpecError(f"HopperMXValueLayout holds packed mxfp4 values: a uint8 tensor (..., K // 2, N), got "
                            f"{data.dtype} of shape {tuple(data.shape)}; wrap them with wrap_torch_tensor(values, "
                            f"dtype=FP4)")
        _check_k_axis(self.mx_axis, data.ndim, "HopperMXValueLayout")
        return swizzle_mx_values(data).data

    def unswizzle_data(self, data):
        return unswizzle_mx_values(self.as_swizzled(data))

    def as_swizzled(self, data) -> SwizzledMxValues:
        """The words of ``data`` as the ``SwizzledMxValues`` ogsgen's matmul takes."""
        if self.initial_shape is None:
            raise SpecError("this HopperMXValueLayout has no shape (it swizzled no values); make the tensor with "
                            "convert_layout(wrap_torch_tensor(values, dtype=FP4), HopperMXValueLayout, mx_axis=...)")
        *batch, half_k, n = self.initial_shape
        k = 2 * half_k
        words = (*batch, *HopperLayout.stored_shape(k, n))
        if not isinstance(data, torch.Tensor) or data.dtype != torch.int32 or tuple(data.shape) != words:
            got = f"{data.dtype} {tuple(data.shape)}" if isinstance(data, torch.Tensor) else type(data).__name__
            raise UnsupportedError(f"the storage of a HopperMXValueLayout tensor must hold ogsgen's hopper words "
                                   f"(int32 {words} for K={k}, N={n}), got {got}: values swizzled by triton_kernels' "
                                   f"own layout cannot be read by ogsgen. Wrap the strided values "
                                   f"(wrap_torch_tensor(values, dtype=FP4)) and convert_layout them to this "
                                   f"package's HopperMXValueLayout")
        capability = target(data.device).capability if data.is_cuda else (9, 0)
        return SwizzledMxValues(data, k, n, "hopper", capability)


class HopperMXScaleLayout(Layout):
    """e8m0 weight scales (..., K // 32, N) for Hopper: stored N-contiguous, as ogsgen's kernels read them fastest
    (``mx_axis`` = the K-block axis; ``num_warps`` is accepted and unused: ogsgen's storage depends on no warp
    count). K groups past cdiv(K, 32) (vLLM pads them to a multiple of 4 on Hopper) are kept and never read. Not
    triton_kernels' swizzled storage: scales swizzled by triton_kernels cannot be read here."""
    name = "HOPPER_SCALE"

    def __init__(self, shape=None, mx_axis=None, num_warps=8):
        super().__init__(shape)
        self.mx_axis, self.num_warps = mx_axis, num_warps

    def swizzle_data(self, data):
        if data.dtype != torch.uint8 or data.ndim < 2:
            raise SpecError(f"HopperMXScaleLayout holds e8m0 scales: a uint8 tensor (..., K // 32, N), got "
                            f"{data.dtype} of shape {tuple(data.shape)}")
        _check_k_axis(self.mx_axis, data.ndim, "HopperMXScaleLayout")
        return data.contiguous()


class _UnreadableLayout(Layout):
    def __init__(self, *args, **kwargs):
        raise UnsupportedError(f"{type(self).__name__}: ogsgen's kernels read mxfp4 values strided or in "
                               f"HopperMXValueLayout (on GPUs with wgmma), and e8m0 scales strided or in "
                               f"HopperMXScaleLayout; use those (make_default_matmul_mxfp4_w_layout and "
                               f"make_default_matmul_mxfp4_w_scale_layout pick them for the current GPU)")


class BlackwellMXValueLayout(_UnreadableLayout):
    name = "BLACKWELL_VALUE"


class BlackwellMXScaleLayout(_UnreadableLayout):
    name = "BLACKWELL_SCALE"


class CDNA4MXScaleLayout(_UnreadableLayout):
    name = "CDNA4_SCALE"


class GFX950MXScaleLayout(_UnreadableLayout):
    name = "GFX950_SCALE"


def _hopper_layouts_wanted() -> bool:
    """On the current CUDA GPU with wgmma, as ``ogsgen.prepare_expert_weights(value_layout='auto')`` decides."""
    return torch.cuda.is_available() and target().wgmma


def make_default_matmul_mxfp4_w_layout(mx_axis):
    """The mxfp4 value layout ogsgen reads fastest on the current GPU: HopperMXValueLayout where it has wgmma,
    StridedLayout elsewhere. A layout, which also unpacks as (layout, {}) for callers of either upstream form."""
    return HopperMXValueLayout(mx_axis=mx_axis) if _hopper_layouts_wanted() else StridedLayout()


def make_default_matmul_mxfp4_w_scale_layout(mx_axis, num_warps=8):
    """The e8m0 scale layout going with ``make_default_matmul_mxfp4_w_layout``'s."""
    return HopperMXScaleLayout(mx_axis=mx_axis, num_warps=num_warps) if _hopper_layouts_wanted() else StridedLayout()


# ------------------------------------------------------------------ tensors

@dataclass
class Storage:
    data: torch.Tensor
    layout: Layout | None = None

    def __post_init__(self):
        if not isinstance(self.data, torch.Tensor):
            raise SpecTypeError(f"Storage.data must be a torch.Tensor, got {type(self.data).__name__}")
        if self.layout is None:
            self.layout = StridedLayout(self.data.shape)
        elif not isinstance(self.layout, Layout):
            raise SpecTypeError(f"Storage.layout must be a layout of this package (StridedLayout, "
                                f"HopperMXValueLayout, ...), got {type(self.layout).__name__}")

    @property
    def device(self) -> torch.device:
        return self.data.device


@dataclass
class Tensor:
    """A tensor of ``dtype`` (a torch dtype, FP4 or BIT) and logical ``shape``, stored as ``storage``; torch's
    shape-reading methods read the logical shape, the others the storage."""
    storage: Storage | torch.Tensor
    dtype: object = None
    shape: list | None = None
    shape_max: list | None = None

    def __post_init__(self):
        if isinstance(self.storage, torch.Tensor):
            self.storage = Storage(self.storage)
        if not isinstance(self.storage, Storage):
            raise SpecTypeError(f"Tensor.storage must be a Storage or a torch.Tensor, got "
                                f"{type(self.storage).__name__}")
        if self.dtype is None:
            self.dtype = self.storage.data.dtype
        if self.shape is None:
            if bitwidth(self.dtype) < 8:
                raise SpecError(f"a Tensor of a sub-byte dtype ({self.dtype}) needs its logical shape: pass shape=, "
                                f"or make it with wrap_torch_tensor(data, dtype=...)")
            self.shape = list(self.storage.data.shape)
        self.shape = list(self.shape)
        self.shape_max = list(self.shape) if self.shape_max is None else \
            [size if most is None else most for size, most in zip(self.shape, self.shape_max)]
        self._operand = None  # (storage data, what ogsgen's matmul takes for it): built once, at its first call

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def device(self) -> torch.device:
        return self.storage.device

    @property
    def data(self) -> torch.Tensor:
        return self.storage.data

    def stride(self, i=None):
        return self.storage.data.stride() if i is None else self.storage.data.stride(i)

    def data_ptr(self) -> int:
        return self.storage.data.data_ptr()

    def numel(self) -> int:
        return self.storage.data.numel()

    def element_size(self) -> int:
        return bitwidth(self.dtype) // 8

    def dim(self) -> int:
        return self.ndim

    def size(self, i=None):
        return self.shape if i is None else self.shape[i]


@dataclass
class Bitmatrix(Tensor):
    """A boolean matrix stored a bit per element (uint32 words along the columns): top-k routing's (tokens,
    experts) choices. ``scratchpad`` is accepted for triton_kernels <= 3.5's signature and unused."""
    dtype: object = BIT
    scratchpad: torch.Tensor | None = None

    def __post_init__(self):
        if self.dtype != BIT:
            raise SpecError(f"a Bitmatrix holds bits: dtype must be BIT, got {self.dtype!r} (pass shape= and "
                            f"shape_max= by keyword)")
        super().__post_init__()


def wrap_torch_tensor(torch_tensor, dtype=None) -> Tensor:
    """``torch_tensor`` as a Tensor of ``dtype`` (default its own): for a sub-byte dtype (FP4) the dimension of unit
    stride holds several values per element, and the logical shape counts them."""
    if not isinstance(torch_tensor, torch.Tensor):
        raise SpecTypeError(f"wrap_torch_tensor takes a torch.Tensor, got {type(torch_tensor).__name__}")
    dtype = torch_tensor.dtype if dtype is None else dtype
    if bitwidth(torch_tensor.dtype) % bitwidth(dtype):  # (a wider dtype: no whole value per element)
        raise SpecError(f"wrap_torch_tensor(dtype={dtype}): a {torch_tensor.dtype} tensor cannot hold {dtype} values "
                        f"({bitwidth(dtype)} bits each, in elements of {bitwidth(torch_tensor.dtype)}); pass a tensor "
                        f"of that dtype (torch_tensor.view({dtype}) reinterprets its bytes), or dtype=FP4 for mxfp4 "
                        f"values packed two a byte")
    shape = list(torch_tensor.shape)
    per_element = bitwidth(torch_tensor.dtype) // bitwidth(dtype)
    if per_element != 1:
        if 1 not in torch_tensor.stride():
            raise SpecError(f"wrap_torch_tensor(dtype={dtype}): the values are packed along the dimension of unit "
                            f"stride, and this tensor (strides {torch_tensor.stride()}) has none; pass a "
                            f".contiguous() one")
        shape[torch_tensor.stride().index(1)] *= per_element
    return Tensor(Storage(torch_tensor, StridedLayout(torch_tensor.shape)), dtype=dtype, shape=shape)


def convert_layout(tensor, layout, **layout_options) -> Tensor:
    """``tensor`` stored in ``layout``: a Layout class with its options (triton_kernels <= 3.6:
    ``convert_layout(t, HopperMXValueLayout, mx_axis=1)``) or a Layout (the newest:
    ``convert_layout(t, HopperMXValueLayout(mx_axis=-2))``)."""
    if not isinstance(tensor, Tensor):
        raise SpecTypeError(f"convert_layout: tensor must be a Tensor (wrap_torch_tensor(t, dtype=...)), got "
                            f"{type(tensor).__name__}")
    strided = tensor.storage.layout.unswizzle_data(tensor.storage.data)
    if isinstance(layout, type) and issubclass(layout, Layout):
        layout = layout(strided.shape, **layout_options)
    elif isinstance(layout, Layout):
        if layout_options:
            raise SpecError(f"convert_layout: options {sorted(layout_options)} go with a layout class; this layout "
                            f"({type(layout).__name__}) was made with its own")
        layout = copy.copy(layout)  # one layout may convert several tensors: each keeps its own shape
        layout.initial_shape = tuple(strided.shape)
    else:
        raise SpecTypeError(f"convert_layout: layout must be a layout class or layout of this package "
                            f"(StridedLayout, HopperMXValueLayout, ...), got {type(layout).__name__}")
    if isinstance(layout, HopperMXValueLayout):
        _check_packed_along_k(tensor, strided, "convert_layout: tensor")
    return Tensor(Storage(layout.swizzle_data(strided), layout), dtype=tensor.dtype, shape=list(tensor.shape),
                  shape_max=list(tensor.shape_max))


# ------------------------------------------------------------------ what ogsgen's matmul takes

def _foreign(value) -> bool:
    """Another library's tensor wrapper (triton_kernels' own Tensor): it has a storage but is not ours."""
    return hasattr(value, "storage") and hasattr(value, "shape_max") and not isinstance(value, Tensor)


def _refuse_foreign(value, name: str) -> None:
    if _foreign(value):
        raise SpecTypeError(f"{name} is a {type(value).__module__}.{type(value).__name__}, another library's tensor "
                            f"wrapper; make it with this package's wrap_torch_tensor and convert_layout (or pass a "
                            f"torch.Tensor)")


def _check_packed_along_k(tensor: Tensor, strided: torch.Tensor, name: str) -> None:
    """An FP4 tensor's strided values (..., K // 2, N) hold the logical (..., K, N): packed along K, as ogsgen reads
    mxfp4 (wrap_torch_tensor packs along the dimension of unit stride)."""
    if bitwidth(tensor.dtype) == 4 and (tensor.ndim < 2 or [*strided.shape[:-2], 2 * strided.shape[-2],
                                                            strided.shape[-1]] != list(tensor.shape)):
        raise UnsupportedError(f"{name}: ogsgen reads mxfp4 weights (..., K, N) packed two values a byte along K; "
                               f"this one stores {tuple(strided.shape)} for logical {tuple(tensor.shape)} (packed "
                               f"along another dimension): wrap the K-contiguous values, e.g. "
                               f"wrap_torch_tensor(values.mT.contiguous().mT, dtype=FP4) of values (..., K // 2, N)")


def weight_operand(w, name: str = "w"):
    """``w`` as ogsgen's matmul takes it: a torch tensor (mxfp4: uint8 (..., K // 2, N) packed along K) or
    ``SwizzledMxValues``."""
    if not isinstance(w, Tensor):
        _refuse_foreign(w, name)
        return w
    data = w.storage.data
    if w._operand is not None and w._operand[0] is data:
        return w._operand[1]
    layout = w.storage.layout
    if isinstance(layout, HopperMXValueLayout):
        operand = layout.as_swizzled(data)
    elif isinstance(layout, StridedLayout):
        _check_packed_along_k(w, data, name)
        operand = data
    else:
        raise UnsupportedError(f"{name} is stored in {type(layout).__name__}, which ogsgen's kernels cannot read; "
                               f"convert_layout it to StridedLayout or HopperMXValueLayout")
    w._operand = (data, operand)
    return operand


def scale_operand(scale, name: str):
    """Microscaling scales as ogsgen's matmul takes them: a uint8 torch tensor (..., K // 32, N)."""
    if not isinstance(scale, Tensor):
        _refuse_foreign(scale, name)
        return scale
    layout, data = scale.storage.layout, scale.storage.data
    if isinstance(layout, HopperMXScaleLayout):
        if data.dtype != torch.uint8 or list(data.shape) != list(scale.shape) or data.stride(-1) != 1:
            raise UnsupportedError(f"{name}: the storage of a HopperMXScaleLayout tensor must hold ogsgen's "
                                   f"N-contiguous e8m0 scales (uint8 {tuple(scale.shape)}), got {data.dtype} "
                                   f"{tuple(data.shape)}: scales swizzled by triton_kernels' own layout cannot be "
                                   f"read by ogsgen; convert_layout the strided scales to this package's "
                                   f"HopperMXScaleLayout")
        return data
    if isinstance(layout, StridedLayout):
        return data
    raise UnsupportedError(f"{name} is stored in {type(layout).__name__}, which ogsgen's kernels cannot read; "
                           f"convert_layout it to StridedLayout or HopperMXScaleLayout")


def plain_operand(value, name: str):
    """An activation or output: a torch tensor, or a strided Tensor's storage."""
    if not isinstance(value, Tensor):
        _refuse_foreign(value, name)
        return value
    if not isinstance(value.storage.layout, StridedLayout) or bitwidth(value.dtype) < 8:
        raise UnsupportedError(f"{name}: ogsgen takes {name} as a plain torch tensor of 8 bits or more an element; "
                               f"got a {value.dtype} Tensor in {type(value.storage.layout).__name__}")
    return value.storage.data


def check_microblock(size, name: str) -> None:
    """ogsgen's MX formats scale blocks of 32 values (no NVFP4's 16)."""
    if size is not None and size != MX_BLOCK:
        raise UnsupportedError(f"{name}={size!r}: ogsgen's microscaled formats take e8m0 scales of {MX_BLOCK} "
                               f"values (mxfp4, mxfp8); NVFP4's blocks of 16 are not supported")


__all__ = ["BIT", "FP4", "Bitmatrix", "BlackwellMXScaleLayout", "BlackwellMXValueLayout", "CDNA4MXScaleLayout",
           "FloatType", "HopperMXScaleLayout", "HopperMXValueLayout", "IntegerType", "Layout", "Storage",
           "StridedLayout", "Tensor", "bitwidth", "convert_layout", "wrap_torch_tensor"]
