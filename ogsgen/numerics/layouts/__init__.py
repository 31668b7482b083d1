"""Memory layouts of mxfp4 weight values, and the host-side converters between them.

``strided`` is what ``quantize_mx`` returns, a plain tensor: ``w`` of shape (..., K // 2, N), byte i of a column
holding K rows 2i (low nibble) and 2i + 1 (high nibble).

A swizzled layout is a class in a file of its own (``hopper.py``: words for the in-register upcast to bf16 on Hopper;
``hopper_fp8.py``: words that become e4m3 wgmma operands, for e4m3 x),
which owns its stored shape, the GPUs it serves and the conversion of one matrix of strided values into it and
back; its in-kernel reader is a ``@triton.jit`` helper of ``ogsgen.numerics.jit``. ``SwizzledMxValues`` carries
stored values with their logical shape through ``matmul_ogs``; ``swizzle_mx_values`` and ``unswizzle_mx_values``
convert whole tensors (one matrix, that is one expert, at a time).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ...devices import target
from ...errors import SpecError, SpecTypeError
from .hopper import HopperLayout
from .hopper_fp8 import HopperFp8Layout

SWIZZLED_LAYOUTS = {layout.name: layout for layout in (HopperLayout, HopperFp8Layout)}
VALUE_LAYOUTS = ("strided", *SWIZZLED_LAYOUTS)


@dataclass(frozen=True)
class SwizzledMxValues:
    """mxfp4 weight values in a swizzled layout: pass it as ``matmul_ogs``'s ``w``.

    ``data``: the layout's stored values (hopper: int32 words (..., ceil(N / 16), K_padded * 2); hopper_fp8: their
    bytes, uint8 (..., ceil(N / 16), K_padded * 8)); ``k``, ``n``: the
    logical K and N; ``capability``: the compute capability of the GPU the layout was produced for (``matmul_ogs``
    refuses another). Made by :func:`swizzle_mx_values`; :func:`unswizzle_mx_values` gives the strided values back.
    """
    data: torch.Tensor
    k: int
    n: int
    layout: str
    capability: tuple[int, int]

    @property
    def shape(self) -> tuple[int, ...]:
        """The strided tensor's shape: (..., K // 2, N)."""
        return (*self.data.shape[:-2], self.k // 2, self.n)

    @property
    def ndim(self) -> int:
        return self.data.ndim

    @property
    def device(self) -> torch.device:
        return self.data.device

    def stored_mismatch(self) -> str | None:
        """None when ``data`` holds K x N values in its layout, else what it should be."""
        layout = SWIZZLED_LAYOUTS.get(self.layout)
        if layout is None:
            return f"layout {self.layout!r} is none of the swizzled layouts {tuple(SWIZZLED_LAYOUTS)}"
        stored = layout.stored_shape(self.k, self.n)
        data = self.data
        if not isinstance(data, torch.Tensor) or data.dtype != layout.stored_dtype or data.ndim < 2 \
                or tuple(data.shape[-2:]) != stored:
            return f"{str(layout.stored_dtype).removeprefix('torch.')}, (..., {stored[0]}, {stored[1]})"
        return None


def _default_capability(device: torch.device) -> tuple[int, int]:
    return target(device).capability if device.type == "cuda" else (9, 0)


def swizzle_mx_values(values: torch.Tensor, layout: str = "hopper", capability=None) -> SwizzledMxValues:
    """Strided mxfp4 values (..., K // 2, N) uint8 -> the same values in ``layout``.

    ``capability``: the GPU the layout is for (default: the values' CUDA device; (9, 0) on the CPU).
    The scales (``precision_config.weight_scale``) stay as they are; pass them N-contiguous
    (``scales.mT.contiguous()`` for ``quantize_mx``'s) for the fastest tiles on Hopper.
    """
    if layout not in SWIZZLED_LAYOUTS:
        raise SpecError(f"layout must be {' or '.join(map(repr, SWIZZLED_LAYOUTS))} (a swizzled mxfp4 layout), got "
                        f"{layout!r}")
    kind = SWIZZLED_LAYOUTS[layout]
    if not isinstance(values, torch.Tensor) or values.dtype != torch.uint8 or values.ndim < 2:
        raise SpecError("values must be packed mxfp4: a uint8 tensor (..., K // 2, N), two values per byte along K")
    if capability is None:
        capability = _default_capability(values.device)
    elif not (isinstance(capability, (tuple, list)) and len(capability) == 2
              and all(isinstance(c, int) and not isinstance(c, bool) for c in capability)):
        raise SpecTypeError(f"capability must be a (major, minor) pair of ints such as (9, 0), or None for the "
                            f"values' device, got {capability!r}")
    capability = tuple(capability)
    if capability < kind.min_capability:
        raise SpecError(f"the {layout} layout serves {kind.serves} (compute capability "
                        f"{kind.min_capability[0]}.{kind.min_capability[1]} and newer); capability {capability} has "
                        f"none: keep the strided values")
    k, n = 2 * values.shape[-2], values.shape[-1]
    batch = values.shape[:-2]
    flat = values.reshape(math.prod(batch), *values.shape[-2:])  # (a -1 would be ambiguous for empty values)
    data = torch.empty(flat.shape[0], *kind.stored_shape(k, n), dtype=kind.stored_dtype, device=values.device)
    for index, matrix in enumerate(flat):  # one matrix (expert) at a time bounds the temporaries
        data[index] = kind.swizzle(matrix)
    return SwizzledMxValues(data.reshape(*batch, *data.shape[1:]), k, n, layout, capability)


def unswizzle_mx_values(w: SwizzledMxValues) -> torch.Tensor:
    """The exact inverse of :func:`swizzle_mx_values`: strided (..., K // 2, N) uint8 values."""
    if not isinstance(w, SwizzledMxValues):
        raise SpecError(f"w must be a SwizzledMxValues (from swizzle_mx_values), got {type(w).__name__}")
    if (mismatch := w.stored_mismatch()) is not None:
        raise SpecError(f"w.data does not hold K={w.k} x N={w.n} values in the {w.layout} layout ({mismatch})")
    kind = SWIZZLED_LAYOUTS[w.layout]
    batch = w.data.shape[:-2]
    flat = w.data.reshape(math.prod(batch), *w.data.shape[-2:])
    # K-contiguous, as quantize_mx's values of w.mT are
    values = torch.empty(flat.shape[0], w.n, w.k // 2, dtype=torch.uint8, device=w.data.device).mT
    for index, matrix in enumerate(flat):  # one matrix (expert) at a time bounds the temporaries
        values[index] = kind.unswizzle(matrix, w.k, w.n)
    return values.reshape(*batch, w.k // 2, w.n)
