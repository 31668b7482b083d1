"""ogsgen: a code-generating kernel specialization compiler for MoE matmul (matmul_ogs)."""
from ._version import __version__
from .errors import (BuildFolderError, CatalogError, InapplicableConstraint, InapplicableConstraintError, OgsgenError,
                     SpecError, SpecTypeError, StaleKernelError, UnsupportedError, VariantNotBuiltError)
from .spec import FnSpecs, KernelVariant, canonical_name, register_activation, register_epilogue, unregister
from .builtins import swiglu, swiglu_torch  # importing registers the built-in functions
from .moe import prepare_expert_weights, routing, routing_from_topk
from .numerics import SwizzledMxValues, bound_mx_scales, swizzle_mx_values, unswizzle_mx_values
from .runtime import (Epilogue, FlexCtx, FusedActivation, GatherIndx, InFlexData, OptFlags, OutFlexData,
                      PrecisionConfig, RoutingData, ScatterIndx, add_search_path, matmul_ogs, matmul_ogs_torch,
                      opt_flags_constraints, set_on_demand)

__all__ = [
    "__version__", "BuildFolderError", "CatalogError", "InapplicableConstraint", "InapplicableConstraintError",
    "OgsgenError", "SpecError", "SpecTypeError", "StaleKernelError", "UnsupportedError", "VariantNotBuiltError", "FnSpecs", "KernelVariant", "canonical_name",
    "register_activation", "register_epilogue", "unregister", "swiglu", "swiglu_torch", "Epilogue", "FlexCtx",
    "FusedActivation", "GatherIndx", "InFlexData", "OptFlags", "OutFlexData", "PrecisionConfig", "RoutingData",
    "ScatterIndx", "add_search_path", "matmul_ogs", "matmul_ogs_torch", "opt_flags_constraints", "set_on_demand",
    "routing", "routing_from_topk", "prepare_expert_weights", "SwizzledMxValues", "bound_mx_scales", "swizzle_mx_values",
    "unswizzle_mx_values",
]
