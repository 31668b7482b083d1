"""Find, verify, import and cache generated kernels.

Search order for ``<canonical_name>.py``: directories added with :func:`add_search_path`, then
the entries of the ``OGSGEN_PATH`` variable (``os.pathsep``-separated), then the package's own
``generated/``. A file found there is checked against today's template and function sources and
refused with :class:`StaleKernelError` when they differ.

On-demand generation (off by default; ``OGSGEN_ON_DEMAND=1`` or :func:`set_on_demand`) renders a
missing or stale variant into a per-user cache folder (``OGSGEN_CACHE_DIR``, default
``~/.cache/ogsgen/<version>``) and logs it. Files are published by atomic rename, so two
processes racing on one variant both end up with a complete, identical file.
"""
from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import sys
import threading
from pathlib import Path

from .._resources import data_dir
from .._version import __version__
from ..codegen.build import write_atomic
from ..codegen.render import expected_provenance, render_variant
from ..errors import StaleKernelError, VariantNotBuiltError
from ..spec.variant import KernelVariant, canonical_name
from . import plans

log = logging.getLogger("ogsgen")

_lock = threading.RLock()
_extra_dirs: list[Path] = []
_kernels: dict[tuple[KernelVariant, bool], object] = {}
_modules_by_sha: dict[str, object] = {}
_on_demand: bool | None = None


def add_search_path(path: str | os.PathLike) -> None:
    """Look for generated kernels in ``path`` (a folder written by ``ogsgen build --out``) first."""
    path = Path(path).resolve()
    if not path.is_dir():
        raise FileNotFoundError(f"add_search_path: {path} is not a folder; build one with `ogsgen build --out {path}`")
    with _lock:
        if path not in _extra_dirs:
            _extra_dirs.insert(0, path)
        _kernels.clear()
        plans.clear()  # they hold kernels of the old search path


def set_on_demand(enabled: bool) -> None:
    """Render kernels that are not built (or are stale) into the user cache instead of raising."""
    global _on_demand
    with _lock:
        _on_demand = bool(enabled)
        _kernels.clear()
        plans.clear()  # they hold kernels of the old search path


def on_demand_enabled() -> bool:
    return _on_demand if _on_demand is not None else os.environ.get("OGSGEN_ON_DEMAND", "") not in ("", "0")


def cache_dir() -> Path:
    root = os.environ.get("OGSGEN_CACHE_DIR") or Path.home() / ".cache" / "ogsgen"
    return Path(root) / __version__


def search_path() -> list[Path]:
    env = [Path(p).resolve() for p in os.environ.get("OGSGEN_PATH", "").split(os.pathsep) if p]
    return [*_extra_dirs, *env, data_dir("generated")]


def _import(path: Path):
    source = path.read_bytes()
    sha = hashlib.sha256(source).hexdigest()
    module = _modules_by_sha.get(sha)
    if module is None:
        # The module name carries the content hash, so a rebuilt file never aliases an old one.
        module_name = f"ogsgen_kernels.{path.stem}_{sha[:12]}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
        _modules_by_sha[sha] = module
    return module


def _staleness(module, variant: KernelVariant) -> list[str]:
    recorded = getattr(module, "PROVENANCE", {})
    expected = expected_provenance(variant)
    problems = []
    if recorded.get("template_sha256") != expected["template_sha256"]:
        problems.append(f"template {expected['template']} changed")
    for kind, sha in expected["functions"].items():
        if recorded.get("functions", {}).get(kind) != sha:
            problems.append(f"{kind} {getattr(variant, kind).name!r} has a different source")
    for name, sha in expected["helpers"].items():
        if recorded.get("helpers", {}).get(name) != sha:
            problems.append(f"helper {name} changed")
    return problems


def _generate(variant: KernelVariant, reason: str):
    path = cache_dir() / f"{canonical_name(variant)}.py"
    log.info("ogsgen: generating %s into %s (%s)", canonical_name(variant), path.parent, reason)
    write_atomic(path, render_variant(variant, "ogsgen:on-demand").source)
    return _import(path)


def _load(variant: KernelVariant):
    name = canonical_name(variant)
    dirs = search_path()
    on_demand = on_demand_enabled()
    if on_demand:
        dirs = [*dirs, cache_dir()]
    for directory in dirs:
        path = directory / f"{name}.py"
        if not path.is_file():
            continue
        module = _import(path)
        problems = _staleness(module, variant)
        if not problems:
            return module
        if on_demand:
            return _generate(variant, f"{path} is stale: {'; '.join(problems)}")
        raise StaleKernelError(
            f"{path} is stale ({'; '.join(problems)}); rebuild it with `ogsgen build --out {directory}` "
            f"(add --spec FILE for a user catalog), or set OGSGEN_ON_DEMAND=1 to generate it on demand")
    if on_demand:
        return _generate(variant, "not built")
    raise VariantNotBuiltError(
        f"kernel variant {name} is not built in any of {[str(d) for d in dirs]}. Add it to a catalog and run "
        f"`ogsgen build --spec CATALOG.py --out DIR`, then add DIR to OGSGEN_PATH (or call "
        f"ogsgen.add_search_path(DIR)); or set OGSGEN_ON_DEMAND=1 to generate it on demand")


def kernel_for(variant: KernelVariant, persistent: bool = False):
    """The ``@triton.jit`` kernel of a variant (or its persistent kernel), imported once per process."""
    key = (variant, persistent)
    kernel = _kernels.get(key)
    if kernel is None:
        with _lock:
            kernel = _kernels.get(key)
            if kernel is None:
                kernel = getattr(_load(variant), canonical_name(variant) + ("_persistent" if persistent else ""))
                _kernels[key] = kernel
    return kernel
