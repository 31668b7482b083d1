"""``triton_kernels.matmul_ogs`` (3.6): the operator and its argument types, the routing types included (the
``routing`` module is gone in 3.6)."""
from ...runtime import matmul_ogs_torch, post_matmul_comm_torch
from ...spec import FnSpecs as _FnSpecs
from ...types import (Epilogue, FlexCtx, FusedActivation, FusedComm, GatherIndx, InFlexData, InnerRoutingData,
                      OutFlexData, ScatterIndx)
from .._matmul import PrecisionConfig, fn_specs, matmul_ogs
from .._routing import RoutingData

__all__ = ["Epilogue", "FlexCtx", "FnSpecs", "FusedActivation", "FusedComm", "GatherIndx", "InFlexData",
           "InnerRoutingData", "OutFlexData", "PrecisionConfig", "RoutingData", "ScatterIndx", "matmul_ogs",
           "matmul_ogs_torch", "post_matmul_comm_torch"]


def FnSpecs(name, fn, fn_arg_names, fn_arg_do_not_specialize=(), reduction_n=1):  # noqa: N802 (a class there)
    """triton_kernels >= 3.6's ``FnSpecs(name, fn, fn_arg_names, fn_arg_do_not_specialize, reduction_n)``: the
    activation folds ``reduction_n`` columns into one (``swiglu_fn``: 2; another value is refused, as
    triton_kernels' kernel refuses it). For an ogsgen activation's function it is that activation's specs, with its
    torch reference and backward."""
    return fn_specs(name, fn, fn_arg_names, fn_arg_do_not_specialize, reduction_n)


FnSpecs.default = _FnSpecs.default
