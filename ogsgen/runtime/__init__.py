"""The runtime: opt-flags heuristics, the kernel loader and the matmul_ogs entry point (and, re-exported, the
argument types of ogsgen.types)."""
from ..types import (Epilogue, FlexCtx, FusedActivation, FusedComm, GatherIndx, InFlexData, InnerRoutingData,
                     OutFlexData, PrecisionConfig, RoutingData, ScatterIndx)
from .loader import add_search_path, kernel_for, search_path, set_on_demand
from .matmul import matmul_ogs
from .opt_flags import OptFlags, make_opt_flags, opt_flags_constraints
from .reference import fused_comm_reference, matmul_ogs_torch, post_matmul_comm_torch

__all__ = [
    "add_search_path", "kernel_for", "search_path", "set_on_demand", "matmul_ogs", "matmul_ogs_torch",
    "fused_comm_reference", "post_matmul_comm_torch", "OptFlags",
    "make_opt_flags", "opt_flags_constraints", "Epilogue", "FlexCtx", "FusedActivation", "FusedComm", "GatherIndx",
    "InFlexData", "InnerRoutingData", "OutFlexData", "PrecisionConfig", "RoutingData", "ScatterIndx",
]
