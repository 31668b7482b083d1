"""Memory layouts of mxfp4 weight values, and the host-side converters between them.

``strided`` is what ``quantize_mx`` returns: ``w`` of shape (..., K // 2, N), byte i of a column holding
K rows 2i (low nibble) and 2i + 1 (high nibble).

``hopper`` serves the kernels' in-register upcast on GPUs whose 16-bit MMAs take the first operand from
registers (Hopper's wgmma; Ampere's mma.sync shares the fragment). Of every 16 K rows such an operand
fragment gives a thread the rows 2t, 2t+1, 2t+8, 2t+9 (t = lane % 4). The layout stores K contiguously,
pads K to a multiple of 64, and rearranges each column's 64-row groups (32 bytes) so that

* a thread's rows of a group are 8 adjacent bytes: one 8-byte load, no byte gathers;
* the packed upcast (4 bytes -> 4 bf16x2 registers, low nibbles then high nibbles) emits registers
  already in fragment order, with no permutes.

Byte ``8t + 4p + 2h + e`` of a group holds K row ``32p + 8h + 2t + e`` in its low nibble and that row
plus 16 in its high nibble. Each 4-byte quarter lies in one 32-row scale block, so scales keep their
strided layout. The layout does not depend on the kernel's warp count or tile shape (beyond K tiles
being whole groups).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import SpecError

HOPPER_GROUP = 64          # K rows per rearranged group
VALUE_LAYOUTS = ("strided", "hopper")
# K row within a group = 32p + 16n + 8h + 2t + e; the stored byte order is (t, p, h, e), nibble n.
_LOGICAL_AXES = ("p", "n", "h", "t", "e")
_STORED_AXES = ("t", "p", "h", "e", "n")
_TO_STORED = tuple(_LOGICAL_AXES.index(a) for a in _STORED_AXES)
_TO_LOGICAL = tuple(_STORED_AXES.index(a) for a in _LOGICAL_AXES)


@dataclass(frozen=True)
class SwizzledMxValues:
    """mxfp4 weight values in a swizzled layout: pass it as ``matmul_ogs``'s ``w``.

    ``data``: uint8 (..., K_padded // 2, N), K contiguous; ``k``: the logical K; ``capability``: the
    compute capability of the GPU the layout was produced for (``matmul_ogs`` refuses another).
    Made by :func:`swizzle_mx_values`; :func:`unswizzle_mx_values` gives the strided values back.
    """
    data: torch.Tensor
    k: int
    layout: str
    capability: tuple[int, int]

    @property
    def shape(self) -> tuple[int, ...]:
        """The strided tensor's shape: (..., K // 2, N)."""
        return (*self.data.shape[:-2], self.k // 2, self.data.shape[-1])

    @property
    def ndim(self) -> int:
        return self.data.ndim

    @property
    def device(self) -> torch.device:
        return self.data.device


def _default_capability(device: torch.device) -> tuple[int, int]:
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device)
    return (9, 0)


def swizzle_mx_values(values: torch.Tensor, layout: str = "hopper", capability=None) -> SwizzledMxValues:
    """Strided mxfp4 values (..., K // 2, N) uint8 -> the same values in ``layout``.

    ``capability``: the GPU the layout is for (default: the values' CUDA device; (9, 0) on the CPU).
    The scales (``precision_config.weight_scale``) stay as they are.
    """
    if layout != "hopper":
        raise SpecError(f"layout must be 'hopper' (the only swizzled mxfp4 layout), got {layout!r}")
    if not isinstance(values, torch.Tensor) or values.dtype != torch.uint8 or values.ndim < 2:
        raise SpecError("values must be packed mxfp4: a uint8 tensor (..., K // 2, N), two values per byte along K")
    capability = tuple(capability) if capability is not None else _default_capability(values.device)
    if capability[0] < 8:
        raise SpecError(f"the hopper layout serves 16-bit MMAs with a register operand (compute capability 8.0 "
                        f"and newer); capability {capability} has none: keep the strided values")
    k = 2 * values.shape[-2]
    k_padded = -(-k // HOPPER_GROUP) * HOPPER_GROUP
    columns = values.mT                                            # (..., N, K // 2)
    columns = torch.nn.functional.pad(columns, (0, (k_padded - k) // 2))
    codes = torch.stack([columns & 15, columns >> 4], dim=-1)       # (..., N, K_padded // 2, 2): K order
    groups = codes.reshape(*columns.shape[:-1], k_padded // HOPPER_GROUP, 2, 2, 2, 4, 2)
    batch = groups.ndim - 5
    stored = groups.permute(*range(batch), *(batch + a for a in _TO_STORED))
    stored = stored.reshape(*columns.shape[:-1], k_padded // 2, 2)
    data = (stored[..., 0] | (stored[..., 1] << 4)).contiguous().mT
    return SwizzledMxValues(data, k, layout, capability)


def unswizzle_mx_values(w: SwizzledMxValues) -> torch.Tensor:
    """The exact inverse of :func:`swizzle_mx_values`: strided (..., K // 2, N) uint8 values."""
    if not isinstance(w, SwizzledMxValues):
        raise SpecError(f"w must be a SwizzledMxValues (from swizzle_mx_values), got {type(w).__name__}")
    columns = w.data.mT                                            # (..., N, K_padded // 2)
    k_padded = 2 * columns.shape[-1]
    codes = torch.stack([columns & 15, columns >> 4], dim=-1)
    groups = codes.reshape(*columns.shape[:-1], k_padded // HOPPER_GROUP, 4, 2, 2, 2, 2)
    batch = groups.ndim - 5
    logical = groups.permute(*range(batch), *(batch + a for a in _TO_LOGICAL))
    logical = logical.reshape(*columns.shape[:-1], k_padded // 2, 2)[..., : w.k // 2, :]
    return (logical[..., 0] | (logical[..., 1] << 4)).mT
