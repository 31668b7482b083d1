"""Find, verify, import and cache generated kernels.

Search order for ``<canonical_name>.py``: directories added with :func:`add_search_path`, then
the entries of the ``OGSGEN_PATH`` variable (``os.pathsep``-separated), then the package's own
``generated/``. A file found there is read once and its sha256 compared with the one its folder's
manifest.json records before anything of it runs; only those verified bytes are executed. The module
is then checked against today's template and function sources. Either failing raises
:class:`StaleKernelError` with the command that rebuilds the file. A file that a build of its folder
is replacing (or that a build killed midway left) is recorded by that build's manifest, which
counts too; where neither records it, the load waits for the build under way and verifies again.
A folder, or a file in it, that anyone but you or root could write is refused (``UntrustedFolderError``):
whoever writes a kernel can write its manifest too.

A variant no search-path folder holds is rendered on first use: the loader runs the render itself and keeps a copy
in a per-user cache folder (``OGSGEN_CACHE_DIR``, default ``~/.cache/ogsgen/<version>``), rewritten (and logged)
whenever it differs from the render, so a file there is never trusted. Files are published by atomic rename, so two
processes racing on one variant both end up with a complete, identical file. Where the cache folder cannot be
written (read-only, not a folder), the render runs from memory and one warning per folder says why.
``OGSGEN_ON_DEMAND`` (or :func:`set_on_demand`, which takes precedence) chooses what is rendered: unset or empty,
variants not built; ``1``, stale or damaged built files too, instead of refusing them; ``0`` (strict mode, for
deployments that run only reviewed, prebuilt kernels), nothing: a missing variant raises
:class:`VariantNotBuiltError`.
"""
from __future__ import annotations

import fcntl
import hashlib
import linecache
import logging
import os
import shlex
import stat
import sys
import threading
import time
import types
from contextlib import contextmanager
from pathlib import Path

from .._resources import data_dir
from .._version import __version__
from ..codegen.build import (LOCK, MANIFEST, PENDING, UnreadableFileError, parse_manifest, read_regular,
                             write_atomic)
from ..codegen.render import expected_provenance, render_variant
from ..errors import BuildFolderError, SpecError, SpecTypeError, StaleKernelError, VariantNotBuiltError
from ..spec.variant import KernelVariant, canonical_name
from . import plans

log = logging.getLogger("ogsgen")

_lock = threading.RLock()
_extra_dirs: list[Path] = []
_kernels: dict[tuple[KernelVariant, bool], object] = {}
_modules_by_sha: dict[str, object] = {}
_manifests: dict[Path, tuple[tuple[int, ...], dict]] = {}  # manifest.json -> (its stat, its content)
_on_demand: bool | None = None  # set_on_demand's choice; None: OGSGEN_ON_DEMAND's
_ON_DEMAND_VALUES = {"": None, "1": True, "0": False}  # OGSGEN_ON_DEMAND's, as _on_demand_setting reads them
_unwritable_caches_warned: set[Path] = set()  # cache folders a warning has named in this process
# How long a load whose file its manifest does not record waits for a build of the folder to end (a full build of
# the default catalog takes seconds) before it refuses the file anyway.
_BUILD_WAIT_S = 120.0


class MissingBuildFolderError(BuildFolderError, FileNotFoundError):
    """add_search_path's folder does not exist (a FileNotFoundError too, as it was before it was a
    BuildFolderError)."""


class UntrustedFolderError(BuildFolderError):
    """A search-path folder, or its manifest or a kernel file in it, could be written by someone other than you or
    root, who could plant a kernel and record its sha256 in the manifest."""


def add_search_path(path: str | os.PathLike) -> None:
    """Look for generated kernels in ``path`` (a folder written by ``ogsgen build --out``) first."""
    if not isinstance(path, (str, os.PathLike)):
        raise SpecTypeError(f"add_search_path: path must be a str or os.PathLike naming a folder, got "
                            f"{type(path).__name__}")
    path = Path(path).resolve()
    if not path.is_dir():
        raise MissingBuildFolderError(f"add_search_path: {path} is not a folder; build one with "
                                      f"`ogsgen build --out {path}`")
    with _lock:
        if path not in _extra_dirs:
            _extra_dirs.insert(0, path)
        _kernels.clear()
        plans.clear()  # they hold kernels of the old search path


def set_on_demand(enabled: bool) -> None:
    """True: render kernels that are not built, or are stale, into the user cache instead of raising. False: strict
    mode, only built kernels run. Either overrides ``OGSGEN_ON_DEMAND``."""
    global _on_demand
    if not isinstance(enabled, bool):
        raise SpecTypeError(f"set_on_demand: enabled must be True or False, got {enabled!r}")
    with _lock:
        _on_demand = enabled
        _kernels.clear()
        plans.clear()  # they hold kernels of the old search path


def _on_demand_setting() -> bool | None:
    """True: stale and missing variants are rendered on first use; None (the default): missing ones; False (strict
    mode): none."""
    if _on_demand is not None:
        return _on_demand
    value = os.environ.get("OGSGEN_ON_DEMAND", "")
    if value not in _ON_DEMAND_VALUES:
        raise SpecError(f"OGSGEN_ON_DEMAND={value!r} is not a value it takes: unset it or set it to '' (render "
                        f"kernels that are not built on first use, the default), '1' (stale or damaged built ones "
                        f"too) or '0' (strict mode: run only built kernels)")
    return _ON_DEMAND_VALUES[value]


def _strict_mode_origin() -> tuple[str, str]:
    """How strict mode was set, and how to leave it."""
    if _on_demand is False:
        return "ogsgen.set_on_demand(False)", "call ogsgen.set_on_demand(True)"
    return "OGSGEN_ON_DEMAND=0 in the environment", "unset OGSGEN_ON_DEMAND"


def cache_dir() -> Path:
    root = os.environ.get("OGSGEN_CACHE_DIR") or Path.home() / ".cache" / "ogsgen"
    return Path(root) / __version__


def search_path() -> list[Path]:
    env = [Path(p).resolve() for p in os.environ.get("OGSGEN_PATH", "").split(os.pathsep) if p]
    return [*_extra_dirs, *env, data_dir("generated")]


def rebuild_command(directory: Path, name: str, catalog: str | None) -> str:
    """How to rebuild variant ``name`` of ``catalog`` (a catalog file's name, "ogsgen:...", None when unknown) in
    ``directory``, as an error message says it."""
    if directory == data_dir("generated"):
        return "`ogsgen build`"
    spec = ["--spec", catalog] if catalog and not catalog.startswith("ogsgen:") else []
    command = f"`{shlex.join(['ogsgen', 'build', '--out', str(directory), '--only', name, *spec])}`"
    return command if catalog else f"{command} (adding --spec CATALOG.py if it came from a user catalog)"


def _refuse(path: Path, why: str, command: str) -> StaleKernelError:
    return StaleKernelError(f"{path} {why}; rebuild it with {command}, or set OGSGEN_ON_DEMAND=1 to generate it "
                            f"on demand")


def _check_trust(path: Path, st: os.stat_result, shipped: bool) -> None:
    """Refuse, as ssh refuses such keys, a folder or file others can write or that belongs to a user other than you
    and root. The package's own folder only when everyone can write it: an install shared by a group, or owned by
    its administrator, is a normal one, and whoever writes that folder can rewrite ogsgen itself."""
    writers = st.st_mode & (stat.S_IWOTH if shipped else stat.S_IWGRP | stat.S_IWOTH)
    if writers:
        who = {stat.S_IWGRP: "its group", stat.S_IWOTH: "everyone"}.get(writers, "its group and everyone")
        raise UntrustedFolderError(f"{path} is writable by {who}, who could plant a kernel that ogsgen would run; "
                                   f"remove their write access with `chmod go-w {path}`")
    if not shipped and st.st_uid not in (0, os.getuid()):
        raise UntrustedFolderError(f"{path} belongs to user id {st.st_uid}, neither you nor root, who could plant a "
                                   f"kernel that ogsgen would run; load kernels from a folder you built (`ogsgen "
                                   f"build --out DIR`) or that root installed")


def _stat_key(st: os.stat_result) -> tuple[int, ...]:
    return st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size  # ctime: a chmod changes what _check_trust said


def _manifest(directory: Path, filename: str = MANIFEST) -> dict | None:
    """The folder's validated manifest (or ``filename``, another one there), parsed again only when the file
    changes; None when there is none."""
    path = directory / filename
    try:
        version = _stat_key(path.stat())
        cached = _manifests.get(path)
        if cached is None or cached[0] != version:
            data, read = read_regular(path)
            _check_trust(path, read, directory == data_dir("generated"))
            cached = _manifests[path] = (_stat_key(read), parse_manifest(path, data))
    except FileNotFoundError:  # (a build renames its manifest over the folder's between the stat and the read)
        return None
    return cached[1]


def _vouching_manifest(directory: Path, name: str, filename: str) -> dict | None:
    """``_manifest(directory, filename)``; a damaged one is refused as what cannot verify kernel ``name``."""
    try:
        return _manifest(directory, filename)
    except UntrustedFolderError:
        raise
    except BuildFolderError as exc:
        raise _refuse(directory / f"{name}.py", f"cannot be verified: {exc}",
                      rebuild_command(directory, name, None)) from None


def _recorded_source(directory: Path, name: str) -> tuple[bytes, str]:
    """The bytes of ``directory/<name>.py``, read once and checked against the sha256 the folder's manifest (or the
    manifest of a build under way there) records before anything of them runs, and the catalog they were built
    from."""
    path, manifest_path = directory / f"{name}.py", directory / MANIFEST
    shipped = directory == data_dir("generated")
    _check_trust(directory, directory.stat(), shipped)
    try:
        source, read = read_regular(path)
    except UnreadableFileError as exc:
        raise _refuse(path, exc.problem, rebuild_command(directory, name, None)) from None
    _check_trust(path, read, shipped)
    sha = hashlib.sha256(source).hexdigest()
    manifest = _vouching_manifest(directory, name, MANIFEST)
    entry = manifest["variants"].get(name) if manifest else None
    if entry is None or entry["sha256"] != sha:  # a build may have written the file and not yet its manifest
        pending = _vouching_manifest(directory, name, PENDING)
        written = pending["variants"].get(name) if pending else None
        if written is not None and written["sha256"] == sha:
            return source, written["catalog"]
    if manifest is None:
        raise _refuse(path, f"cannot be verified: its folder has no {manifest_path} (only files `ogsgen build` "
                            f"wrote are loaded)", rebuild_command(directory, name, None))
    if entry is None:
        raise _refuse(path, f"cannot be verified: {manifest_path} records no variant {name}",
                      rebuild_command(directory, name, manifest["catalog"]))
    if entry["sha256"] != sha:
        raise _refuse(path, f"does not match the sha256 {manifest_path} records for it (edited, truncated or "
                            f"damaged since it was built)", rebuild_command(directory, name, entry["catalog"]))
    return source, entry["catalog"]


@contextmanager
def _no_build_running(directory: Path):
    """Hold the folder's build lock shared (a build holds it exclusively) for the block, once a build under way has
    ended or _BUILD_WAIT_S have passed. A folder without a lock file has had no build to wait for."""
    try:
        fd = os.open(directory / LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        fd = None
    try:
        deadline = time.monotonic() + _BUILD_WAIT_S
        while fd is not None and time.monotonic() < deadline:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                time.sleep(0.01)
        yield
    finally:
        if fd is not None:
            os.close(fd)


def _verified_source(directory: Path, name: str) -> tuple[bytes, str]:
    """``_recorded_source``, read again while no build runs where the manifests do not record the file: a build
    may have replaced it between this load's reads of the file and of the manifest."""
    try:
        return _recorded_source(directory, name)
    except StaleKernelError:
        with _no_build_running(directory):
            return _recorded_source(directory, name)


def _execute(source: bytes, name: str, path: Path | None):
    """Run verified bytes as the module of kernel ``name``, read from ``path`` (None: rendered in memory, kept in no
    file). Python's linecache, where inspect (and so Triton's @jit) reads a function's source, gets these bytes too,
    whatever the file holds later."""
    sha = hashlib.sha256(source).hexdigest()
    module = _modules_by_sha.get(sha)
    if module is None:
        # A render the cache folder could not keep names no file: what its path holds (an old file, a FIFO) would
        # be read by tools that read the files of sys.modules (hypothesis does).
        filename = str(path) if path is not None else f"<ogsgen {name}, rendered in memory>"
        # mtime None: linecache.checkcache keeps the entry instead of comparing it with the file.
        linecache.cache[filename] = (len(source), None, source.decode().splitlines(keepends=True), filename)
        # The module name carries the content hash, so a rebuilt file never aliases an old one.
        module = types.ModuleType(f"ogsgen_kernels.{name}_{sha[:12]}")
        if path is not None:
            module.__file__ = filename
        sys.modules[module.__name__] = module
        try:
            exec(compile(source, filename, "exec"), module.__dict__)
        except BaseException:
            del sys.modules[module.__name__]
            raise
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


def _load_built(directory: Path, variant: KernelVariant):
    name = canonical_name(variant)
    source, catalog = _verified_source(directory, name)
    module = _execute(source, name, directory / f"{name}.py")
    problems = _staleness(module, variant)
    if problems:
        raise _refuse(directory / f"{name}.py", f"is stale ({'; '.join(problems)})",
                      rebuild_command(directory, name, catalog))
    return module


def _generate(variant: KernelVariant, reason: str):
    """Render the variant; its file in the cache folder is rewritten whenever it differs from the render (stale or
    damaged), and what runs is the render itself, so a cache folder that cannot be written costs only the copy."""
    name = canonical_name(variant)
    path = cache_dir() / f"{name}.py"
    source = render_variant(variant, "ogsgen:on-demand").source
    try:
        if write_atomic(path, source):
            log.info("ogsgen: generating %s into %s (%s)", name, path.parent, reason)
    except (OSError, UnreadableFileError) as exc:  # (UnreadableFileError: a FIFO or a huge file in its place)
        _warn_unwritable_cache(path, exc)
        return _execute(source.encode(), name, None)
    return _execute(source.encode(), name, path)


def _warn_unwritable_cache(path: Path, exc: OSError | UnreadableFileError) -> None:
    """Say once per process and folder why kernels rendered on first use cannot be kept in the cache folder."""
    if path.parent in _unwritable_caches_warned:
        return
    _unwritable_caches_warned.add(path.parent)
    why = f"{path.name} there {exc.problem}" if isinstance(exc, UnreadableFileError) else exc.strerror or str(exc)
    chosen_by = "OGSGEN_CACHE_DIR" if os.environ.get("OGSGEN_CACHE_DIR") else "the default of OGSGEN_CACHE_DIR"
    log.warning("ogsgen: the kernel cache folder %s (%s) cannot be written (%s): kernels rendered on first use run "
                "from memory, rendered again by each process; to keep them, point OGSGEN_CACHE_DIR at a folder you "
                "can write", path.parent, chosen_by, why)


def _load(variant: KernelVariant):
    name = canonical_name(variant)
    dirs = search_path()
    on_demand = _on_demand_setting()
    for directory in dirs:
        if not (directory / f"{name}.py").exists():  # (a FIFO or a folder there is refused, not skipped)
            continue
        try:
            return _load_built(directory, variant)
        except StaleKernelError as exc:
            if not on_demand:  # (by default too: a stale or damaged build is the builder's to fix)
                raise
            return _generate(variant, str(exc))
    if on_demand is not False:
        return _generate(variant, "not built")
    add = (f"add {variant.as_code()} to a catalog's VARIANTS" if variant.family == "matmul" else
           "add the matmul variant that needs it (its build includes it) to a catalog's VARIANTS")
    strict_by, leave_strict = _strict_mode_origin()
    raise VariantNotBuiltError(
        f"kernel variant {name} is not built in any of {[str(d) for d in dirs]}, and strict mode ({strict_by}) "
        f"renders none on first use. To build it, {add} and run `ogsgen build --spec CATALOG.py --out DIR`, then "
        f"add DIR to OGSGEN_PATH (or call ogsgen.add_search_path(DIR)); or {leave_strict} to render it on first use")


_KERNEL_SUFFIX = {"persistent": "_persistent", "warp_specialized": "_warp_specialized"}


def kernel_for(variant: KernelVariant, kernel: str = "tiled"):
    """A variant's kernel, imported once per process: its tiled (or reduce) kernel, or ``kernel`` "persistent" or
    "warp_specialized" where the variant has one (``ogsgen.spec.kernel_abi.KERNELS``)."""
    key = (variant, kernel)
    found = _kernels.get(key)
    if found is None:
        with _lock:
            found = _kernels.get(key)
            if found is None:
                found = getattr(_load(variant), canonical_name(variant) + _KERNEL_SUFFIX.get(kernel, ""))
                _kernels[key] = found
    return found
