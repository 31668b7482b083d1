"""ogsgen: a code-generating kernel specialization compiler for MoE matmul (matmul_ogs).

The public names below load their modules (torch, Triton) on first use, so that ``import ogsgen`` itself, the
command line's ``--help`` and ``--version`` and the pytest plugin cost no torch import. ogsgen's custom ops
(``torch.ops.ogsgen.*``) are registered as soon as torch is imported, before or after ogsgen: a program saved by
``torch.export`` then loads in any process that imports ogsgen.
"""
import importlib
import importlib.abc
import importlib.util
import sys

from ._version import __version__
from .errors import (BuildFolderError, CatalogError, InapplicableConstraint, InapplicableConstraintError, OgsgenError,
                     PerformanceWarning, SpecError, SpecTypeError, StaleKernelError, UnsupportedError,
                     VariantNotBuiltError)

_LAZY = {
    ".spec": ("FnSpecs", "KernelVariant", "canonical_name", "register_activation", "register_epilogue", "unregister"),
    ".spec.builtins": ("silu_and_mul", "silu_and_mul_torch", "swiglu", "swiglu_torch"),
    ".spec.operands": ("ScaledOperand",),
    ".moe": ("expert_parallel_routing", "prepare_expert_weights", "routing", "routing_from_topk"),
    ".numerics": ("SwizzledMxValues", "swizzle_mx_values", "unswizzle_mx_values"),
    ".ops": ("matmul_ogs",),
    ".runtime": ("Epilogue", "FlexCtx", "FusedActivation", "FusedComm", "GatherIndx", "InFlexData",
                 "InnerRoutingData", "OptFlags", "OutFlexData", "PrecisionConfig", "RoutingData", "ScatterIndx",
                 "add_search_path", "fused_comm_reference", "matmul_ogs_torch", "opt_flags_constraints",
                 "post_matmul_comm_torch", "set_on_demand"),
}
_MODULE_OF = {name: module for module, names in _LAZY.items() for name in names}
# Names taken out of the API, with what to do instead.
_REMOVED = {
    "bound_mx_scales": "ogsgen.bound_mx_scales was removed on 2026-12-04: the one-multiply mxfp4 upcast it enabled "
                       "could not see writes through .data (a weight loader's param.data.copy_) and then returned the "
                       "old scales' product; every call now takes the exact upcast. Remove the call.",
}

__all__ = [
    "__version__", "BuildFolderError", "CatalogError", "InapplicableConstraint", "InapplicableConstraintError",
    "OgsgenError", "PerformanceWarning", "SpecError", "SpecTypeError", "StaleKernelError", "UnsupportedError", "VariantNotBuiltError",
    *_MODULE_OF,
]


def __getattr__(name: str):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(_REMOVED.get(name, f"module 'ogsgen' has no attribute {name!r}"))
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_MODULE_OF))


def _register_custom_ops() -> None:
    importlib.import_module(".ops.custom_ops", __name__)  # (it imports torch only)


class _RegisterWithTorch(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """An import hook that registers ogsgen's custom ops right after torch's import, once."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)  # (before the search below, which would find this hook again)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            self.torch_loader, spec.loader = spec.loader, self
        return spec

    def create_module(self, spec):
        return self.torch_loader.create_module(spec)

    def exec_module(self, module):
        module.__spec__.loader = module.__loader__ = self.torch_loader  # torch's module keeps its own loader
        self.torch_loader.exec_module(module)
        _register_custom_ops()


if "torch" in sys.modules:
    _register_custom_ops()
else:
    sys.meta_path.insert(0, _RegisterWithTorch())
