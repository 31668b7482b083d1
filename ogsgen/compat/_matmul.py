"""What the three generations' matmuls share: the activation specs of triton_kernels' ``FnSpecs``, the
``PrecisionConfig`` that takes wrapped scales, and the call of ``ogsgen.matmul_ogs`` with wrapped operands."""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from ..ops import matmul_ogs as _matmul_ogs
from ..spec import FnSpecs as _FnSpecs
from ..spec.functions import registered_activations
from ..types import PrecisionConfig as _PrecisionConfig
from ._routing import as_float32
from ._tensor import Tensor, plain_operand, scale_operand, weight_operand


def fn_specs(name, fn, fn_arg_names, fn_arg_do_not_specialize=(), reduction_n=None):
    """triton_kernels' ``FnSpecs``. For an ogsgen activation's function (``swiglu_fn``) it is that activation's
    specs (its torch reference and backward, so that autograd runs through it) under ``name``; ``reduction_n``
    None keeps the function's own."""
    specs = _fn_specs(name, fn, tuple(fn_arg_names), tuple(fn_arg_do_not_specialize))
    return specs if reduction_n is None else with_reduction_n(specs, reduction_n)


# Callers build these per call (vLLM does); hashing a function's source costs milliseconds, so each is built once.
@lru_cache(maxsize=256)
def _fn_specs(name, fn, fn_arg_names, fn_arg_do_not_specialize):
    for spec in registered_activations():
        if spec.fn is fn and spec.fn_arg_names == fn_arg_names:
            if (spec.name, spec.fn_arg_do_not_specialize) == (name, fn_arg_do_not_specialize):
                return spec
            return replace(spec, name=name, fn_arg_do_not_specialize=fn_arg_do_not_specialize)
    return _FnSpecs(name, fn, fn_arg_names, fn_arg_do_not_specialize)


def with_reduction_n(specs, reduction_n):
    """``specs`` folding ``reduction_n`` columns into one. A reduction_n that is not a registered function's is
    refused (``swiglu_fn`` folds 2), as triton_kernels' kernel refuses it (a static assertion on the
    activation's output width)."""
    if isinstance(specs, _FnSpecs) and not specs.is_default and specs.reduction_n != reduction_n:
        return _with_reduction_n(specs, reduction_n)
    return specs


@lru_cache(maxsize=256)
def _with_reduction_n(specs, reduction_n):
    return replace(specs, reduction_n=reduction_n)


@dataclass
class PrecisionConfig(_PrecisionConfig):
    """ogsgen's PrecisionConfig whose ``weight_scale`` may be a wrapped Tensor (``convert_layout``'s), read once,
    where it is made, as the scales ogsgen's kernels take."""

    def __post_init__(self):
        self.weight_scale = scale_operand(self.weight_scale, "precision_config.weight_scale")


def matmul_ogs(x, w, bias, routing_data=None, gather_indx=None, scatter_indx=None, precision_config=None,
               betas=None, gammas=None, out_alpha=None, y=None, fused_comm=None, fused_activation=None,
               epilogue=None, y_acc_in=None, inner_routing_data=None):
    """triton_kernels' ``matmul_ogs``: ``ogsgen.matmul_ogs`` of the wrapped operands, with betas and gammas of any
    float dtype (read as float32), whose result for a 2-D x is 2-D as there (a 3-D ``y`` of batch one is written
    and returned as its 2-D view)."""
    if precision_config is not None and isinstance(precision_config.weight_scale, Tensor):  # set after it was made
        precision_config = replace(precision_config, weight_scale=scale_operand(
            precision_config.weight_scale, "precision_config.weight_scale"))
    x = plain_operand(x, "x")
    out = _matmul_ogs(x, weight_operand(w), bias, routing_data, gather_indx, scatter_indx, precision_config,
                      as_float32(betas), as_float32(gammas), out_alpha, plain_operand(y, "y"), fused_comm=fused_comm,
                      fused_activation=fused_activation, epilogue=epilogue, y_acc_in=y_acc_in,
                      inner_routing_data=inner_routing_data)
    return out[0] if x.ndim == 2 and out.ndim == 3 and inner_routing_data is None else out
