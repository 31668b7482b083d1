"""What ogsgen knows of e8m0 scale tensors' largest code, for the hopper layout's one-multiply upcast.

The hopper mxfp4 kernels upcast with one packed multiply per register when every weight scale is at most 2
(code <= 128), and with two otherwise (ogsgen.numerics.jit.E2M1_WORD_TO_BF16_SMALL_SCALES). Reading the scales'
largest code at each call would synchronize with the device, so the code is measured once
(:func:`bound_mx_scales`; ``prepare_expert_weights`` does it) and recorded on the tensor that owns the storage,
with that storage's version counter: an in-place change of the scales, or of any view of them, voids the record
and the calls go back to two multiplies. The record is a hint for speed, not a promise the result depends on: a
write it cannot see (through ``.data``, which has a version counter of its own) leaves it standing, and the kernel
then finds the larger code itself and computes that tile again with two multiplies. Tensors without a version
counter (made under ``torch.inference_mode``) cannot be recorded; their calls take two multiplies.
"""
import torch

from ..errors import SpecTypeError

LARGEST_SMALL_CODE = 128                     # scale 2 ** (128 - 127)
_RECORD = "_ogsgen_largest_scale_code"       # (version, largest code) on the storage's owning tensor


def _owner(scales: torch.Tensor) -> torch.Tensor:
    return scales._base if scales._base is not None else scales


def _version(scales: torch.Tensor):
    if scales.is_inference():
        return None
    return scales._version


def bound_mx_scales(scales: torch.Tensor) -> int:
    """The largest e8m0 code in ``scales`` and every tensor sharing its storage (the owning tensor is measured: a
    reduction and one host-device synchronization), recorded for ``matmul_ogs``. Returns it; at most 128 (all
    scales <= 2) lets the hopper mxfp4 kernels upcast with one multiply."""
    if not isinstance(scales, torch.Tensor) or scales.dtype != torch.uint8:
        raise SpecTypeError(f"scales must be a uint8 tensor of e8m0 codes, got {type(scales).__name__}"
                        f"{'' if not isinstance(scales, torch.Tensor) else ' of ' + str(scales.dtype)}")
    owner = _owner(scales)
    largest = int(owner.max()) if owner.numel() else 0
    version = _version(owner)
    if version is not None:
        setattr(owner, _RECORD, (version, largest))
    return largest


def scales_at_most_2(scales: torch.Tensor) -> bool:
    """Whether ``scales`` is known (by :func:`bound_mx_scales`, since its last in-place change) to hold only
    codes <= 128. No device work."""
    record = getattr(_owner(scales), _RECORD, None)
    return record is not None and record[1] <= LARGEST_SMALL_CODE and record[0] == _version(scales)
