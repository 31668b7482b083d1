"""``triton_kernels.reduce``: ``reduce``, the sum over one dimension of a 3-D tensor that finishes this generation's
MoE layer (``reduce(y.view(-1, k, N), dim=1)``: the top-k combine) and its split-K. ogsgen fuses both into its
matmul (``matmul(..., n_expts_act=k)`` here, or ``ogsgen.matmul_ogs`` with a ScatterIndx); this one sums with torch,
in float32."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...errors import SpecError, UnsupportedError
from ...spec import FnSpecs

__all__ = ["PostprocessFn", "reduce"]


@dataclass(frozen=True)
class PostprocessFn:
    specs: FnSpecs = field(default_factory=FnSpecs.default)
    fn_args: tuple = ()


def reduce(x, dim, mask=None, scale=None, x_mxscale=None, x_flex=None, y_dtype=None, y_flex=None,
           y_flex_saturate_inf=False, y_has_mx=None, y=None, postprocess_fn1=None, postprocess_fn2=None):
    """(the sum of ``x * scale`` over ``dim`` of the 3-D ``x``, leaving out entries where ``mask`` is 0, in float32
    then ``y_dtype`` (default x's) or written into ``y``; None): ``mask`` and ``scale`` broadcast to x. The
    microscaled, flexpoint and post-processed forms raise UnsupportedError."""
    if not isinstance(x, torch.Tensor) or x.ndim != 3:
        raise SpecError(f"reduce: x must be a 3-D tensor, got "
                        f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    if not isinstance(dim, int) or not -3 <= dim < 3:
        raise SpecError(f"reduce: dim must be 0, 1 or 2 (or -3 to -1), got {dim!r}")
    unsupported = {"x_mxscale": x_mxscale is not None, "y_has_mx": bool(y_has_mx),
                   "x_flex": x_flex is not None and (x_flex.dtype, x_flex.scale) != (None, None),
                   "y_flex": y_flex is not None and any(scale is not None for scale in (
                       y_flex.expected_scale, y_flex.actual_scale, y_flex.checksum_scale)),
                   "y_flex_saturate_inf": y_flex_saturate_inf,
                   "postprocess_fn1": postprocess_fn1 is not None and not postprocess_fn1.specs.is_default,
                   "postprocess_fn2": postprocess_fn2 is not None and not postprocess_fn2.specs.is_default}
    for name, used in unsupported.items():
        if used:
            raise UnsupportedError(f"reduce: {name} (microscaled, flexpoint or post-processed sums) has no ogsgen "
                                   f"counterpart here; leave it at its default, or fuse the sum into the matmul "
                                   f"(n_expts_act=k), whose output takes ogsgen's formats and epilogues")
    terms = x.float() if scale is None else x.float() * scale
    if mask is not None:
        terms = torch.where(mask != 0, terms, 0.0)
    out = terms.sum(dim)
    if y is None:
        return out.to(y_dtype or x.dtype), None
    if tuple(y.shape) != tuple(out.shape):
        raise SpecError(f"reduce: y must have the shape of the sum, {tuple(out.shape)}, got {tuple(y.shape)}")
    return y.copy_(out), None
