"""Drop-in packages for code written against other MoE kernel libraries: triton_kernels' three API generations,
``ogsgen.compat.triton_kernels`` (<= 3.5, ``matmul_ogs`` with the ``routing`` module), ``triton_kernels_v36`` (3.6:
``topk`` -> ``SparseMatrix``) and ``triton_kernels_v3`` (upstream main: ``matmul`` with ragged metadata and
``reduce``). docs/compat.md compares them. ``install(generation)`` makes ``import triton_kernels`` resolve to one of
them, for clients that are not to be edited."""
import importlib
import pkgutil
import sys

from ..errors import OgsgenError, SpecError

# generation -> (its package, what it is); named as vLLM's get_triton_kernels_version names them ("3.5.1" as 3.5)
GENERATIONS = {"3.5": ("triton_kernels", "triton_kernels <= 3.5, matmul_ogs and routing"),
               "3.6": ("triton_kernels_v36", "triton_kernels 3.6, matmul_ogs and topk -> SparseMatrix"),
               "3.8": ("triton_kernels_v3", "upstream main, matmul and reduce")}


def install(generation: str) -> None:
    """Make ``import triton_kernels`` and ``import triton_kernels.<module>`` resolve to ogsgen's package of
    ``generation`` ("3.5", "3.6" or "3.8") and its modules, so that a client written for triton_kernels (vLLM) runs on
    ogsgen unchanged. Call it before anything imports triton_kernels. The client sees the generation by what the
    package holds, as it would triton_kernels' (vLLM's get_triton_kernels_version: "3.5.1", "3.6", "3.8"). Calling it
    again with the same generation does nothing; a process serves one generation."""
    if generation not in GENERATIONS:
        *first, last = (f"{name!r} ({what})" for name, (_, what) in GENERATIONS.items())
        raise SpecError(f"ogsgen.compat.install({generation!r}): no such generation; choose {', '.join(first)} or "
                        f"{last}")
    package = importlib.import_module(f"{__name__}.{GENERATIONS[generation][0]}")
    present = sys.modules.get("triton_kernels")
    if present is package:
        return
    if present is not None:
        installed = [name for name, (module, _) in GENERATIONS.items()
                     if getattr(present, "__name__", None) == f"{__name__}.{module}"]
        if installed:
            raise OgsgenError(f"ogsgen.compat.install({generation!r}): triton_kernels is already ogsgen's "
                              f"{installed[0]} package; a process serves one generation: install the one the client "
                              f"needs, once")
        raise OgsgenError(f"ogsgen.compat.install({generation!r}): triton_kernels is already imported, from "
                          f"{getattr(present, '__file__', None)}: call ogsgen.compat.install before anything imports "
                          f"triton_kernels (before importing the client)")
    # Every module under its triton_kernels name: the modules keep their own names, so their relative imports (of
    # ogsgen) resolve, and a module the generation has not (triton_kernels.routing in 3.6) is not found.
    modules = [package] + [importlib.import_module(info.name)
                           for info in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]
    for module in modules:
        sys.modules["triton_kernels" + module.__name__.removeprefix(package.__name__)] = module
