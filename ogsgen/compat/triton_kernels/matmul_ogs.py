"""``triton_kernels.matmul_ogs``: the operator, its reference and its argument types."""
from ...runtime import matmul_ogs_torch, post_matmul_comm_torch
from ...spec import FnSpecs as _FnSpecs
from ...types import (Epilogue, FlexCtx, FusedComm, GatherIndx, InFlexData, InnerRoutingData, OutFlexData,
                      RoutingData, ScatterIndx)
from ...types import FusedActivation as _FusedActivation
from .._matmul import PrecisionConfig, fn_specs, matmul_ogs, with_reduction_n

__all__ = ["Epilogue", "FlexCtx", "FnSpecs", "FusedActivation", "FusedComm", "GatherIndx", "InFlexData",
           "InnerRoutingData", "OutFlexData", "PrecisionConfig", "RoutingData", "ScatterIndx", "matmul_ogs",
           "matmul_ogs_torch", "post_matmul_comm_torch"]


def FnSpecs(name, fn, fn_arg_names, fn_arg_do_not_specialize=()):  # noqa: N802 (a class in triton_kernels)
    """triton_kernels' ``FnSpecs(name, fn, fn_arg_names, fn_arg_do_not_specialize)``; the activation's
    ``reduction_n`` comes with ``FusedActivation``, as there. For an ogsgen activation's function (``swiglu_fn``) it
    is that activation's specs: its reduction_n, torch reference and backward (so that autograd runs through it)."""
    return fn_specs(name, fn, fn_arg_names, fn_arg_do_not_specialize)


FnSpecs.default = _FnSpecs.default


def FusedActivation(specs=None, fn_args=(), reduction_n=1):  # noqa: N802 (a class in triton_kernels)
    """triton_kernels' ``FusedActivation(specs, fn_args, reduction_n)``: ``reduction_n`` columns fold into one. A
    reduction_n that is not the function's (``swiglu_fn`` with the default 1) is refused, as triton_kernels' kernel
    refuses it (a static assertion on the activation's output width)."""
    specs = _FnSpecs.default() if specs is None else specs
    return _FusedActivation(with_reduction_n(specs, reduction_n), tuple(fn_args))
