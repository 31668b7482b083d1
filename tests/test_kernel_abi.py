"""The kernel signatures declared in ogsgen.spec.kernel_abi: every generated kernel's parameters are the declared
ones, in order, and each is used by the kernel's body (a parameter the kernel ignores is a launch argument the
runtime computes for nothing, or one the template forgot)."""
import ast
from pathlib import Path

import pytest

from ogsgen.codegen import render_variant
from ogsgen.spec import default_catalog, load_catalog_file
from ogsgen.spec.kernel_abi import kernel_of, parameters, per_call_names

CUSTOM_CATALOG = Path(__file__).parent / "catalogs" / "custom_catalog.py"


def _variants():
    variants = {}
    for catalog in (default_catalog(), load_catalog_file(CUSTOM_CATALOG)):
        variants.update(catalog.by_name())
    return sorted(variants.items())


def _kernels(variant, name):
    tree = ast.parse(render_variant(variant, "c").source)
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    kernels = {kernel_of(variant): functions.pop(name)}
    if variant.has_persistent_kernel:
        kernels["persistent"] = functions.pop(f"{name}_persistent")
    if variant.has_warp_specialized_kernel:
        kernels["warp_specialized"] = functions.pop(f"{name}_warp_specialized")
        declared = [p.name for p in parameters(variant, "warp_specialized")]
        for partition in ("load", "compute"):  # the kernel's parameters, then its shared memory and warpgroup
            fn = functions.pop(f"{name}_ws_{partition}")
            assert [a.arg for a in fn.args.args] == declared + ["x_bufs", "w_bufs", "ready", "empty", "WG"]
        for helper in ("tile", "promote"):
            functions.pop(f"{name}_ws_{helper}")
    assert not functions, f"{name}: functions the ABI does not declare: {sorted(functions)}"
    return kernels


def _do_not_specialize(fn: ast.FunctionDef) -> list:
    for decorator in fn.decorator_list:
        if isinstance(decorator, ast.Call):
            return sorted(ast.literal_eval(k.value) for k in decorator.keywords if k.arg == "do_not_specialize")[0]
    return []


# (every 8th variant in the quick subset, all of them in the whole suite)
@pytest.mark.parametrize("name,variant", [pytest.param(name, variant, id=name, marks=pytest.mark.slow if i % 8 else ())
                                          for i, (name, variant) in enumerate(_variants())])
def test_generated_signatures_are_the_declared_ones(name, variant):
    for kernel, fn in _kernels(variant, name).items():
        declared = parameters(variant, kernel)
        assert [a.arg for a in fn.args.args] == [p.name for p in declared], f"{name} ({kernel})"
        constexpr = [a.arg for a in fn.args.args if a.annotation is not None]
        assert constexpr == [p.name for p in declared if p.constexpr], f"{name} ({kernel})"
        assert _do_not_specialize(fn) == per_call_names(variant, kernel)
        used = {node.id for node in ast.walk(ast.Module(body=fn.body, type_ignores=[]))
                if isinstance(node, ast.Name)}
        unused = [p.name for p in declared if p.name not in used]
        assert not unused, f"{name} ({kernel}) declares parameters its body never reads: {unused}"
