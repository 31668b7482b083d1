"""``triton_kernels.matmul_ogs``: the operator, its reference and its argument types."""
from dataclasses import replace
from functools import lru_cache

from ...ops import matmul_ogs as _matmul_ogs
from ...runtime import matmul_ogs_torch, post_matmul_comm_torch
from ...spec import FnSpecs as _FnSpecs
from ...spec.functions import registered_activations
from ...types import (Epilogue, FlexCtx, FusedComm, GatherIndx, InFlexData, InnerRoutingData, OutFlexData,
                      PrecisionConfig, RoutingData, ScatterIndx)
from ...types import FusedActivation as _FusedActivation

__all__ = ["Epilogue", "FlexCtx", "FnSpecs", "FusedActivation", "FusedComm", "GatherIndx", "InFlexData",
           "InnerRoutingData", "OutFlexData", "PrecisionConfig", "RoutingData", "ScatterIndx", "matmul_ogs",
           "matmul_ogs_torch", "post_matmul_comm_torch"]


def FnSpecs(name, fn, fn_arg_names, fn_arg_do_not_specialize=()):  # noqa: N802 (a class in triton_kernels)
    """triton_kernels' ``FnSpecs(name, fn, fn_arg_names, fn_arg_do_not_specialize)``; the activation's
    ``reduction_n`` comes with ``FusedActivation``, as there. For an ogsgen activation's function (``swiglu_fn``) it
    is that activation's specs: its reduction_n, torch reference and backward (so that autograd runs through it)."""
    return _fn_specs(name, fn, tuple(fn_arg_names), tuple(fn_arg_do_not_specialize))


# Callers build these per call (vLLM does); hashing a function's source costs milliseconds, so each is built once.
@lru_cache(maxsize=256)
def _fn_specs(name, fn, fn_arg_names, fn_arg_do_not_specialize):
    for spec in registered_activations():
        if spec.fn is fn and spec.fn_arg_names == fn_arg_names:
            if (spec.name, spec.fn_arg_do_not_specialize) == (name, fn_arg_do_not_specialize):
                return spec
            return replace(spec, name=name, fn_arg_do_not_specialize=fn_arg_do_not_specialize)
    return _FnSpecs(name, fn, fn_arg_names, fn_arg_do_not_specialize)


@lru_cache(maxsize=256)
def _with_reduction_n(specs, reduction_n):
    return replace(specs, reduction_n=reduction_n)


FnSpecs.default = _FnSpecs.default


def FusedActivation(specs=None, fn_args=(), reduction_n=1):  # noqa: N802 (a class in triton_kernels)
    """triton_kernels' ``FusedActivation(specs, fn_args, reduction_n)``: ``reduction_n`` columns fold into one. A
    reduction_n that is not the function's (``swiglu_fn`` with the default 1) is refused, as triton_kernels' kernel
    refuses it (a static assertion on the activation's output width)."""
    specs = _FnSpecs.default() if specs is None else specs
    if isinstance(specs, _FnSpecs) and not specs.is_default and specs.reduction_n != reduction_n:
        specs = _with_reduction_n(specs, reduction_n)
    return _FusedActivation(specs, tuple(fn_args))


def matmul_ogs(x, w, bias, routing_data=None, gather_indx=None, scatter_indx=None, precision_config=None,
               betas=None, gammas=None, out_alpha=None, y=None, fused_comm=None, fused_activation=None,
               epilogue=None, y_acc_in=None, inner_routing_data=None):
    """triton_kernels' ``matmul_ogs``: ``ogsgen.matmul_ogs``, whose result for a 2-D x is 2-D as there (a 3-D ``y``
    of batch one is written and returned as its 2-D view)."""
    out = _matmul_ogs(x, w, bias, routing_data, gather_indx, scatter_indx, precision_config, betas, gammas,
                      out_alpha, y, fused_comm=fused_comm, fused_activation=fused_activation, epilogue=epilogue,
                      y_acc_in=y_acc_in, inner_routing_data=inner_routing_data)
    return out[0] if x.ndim == 2 and out.ndim == 3 and inner_routing_data is None else out
