"""Build folders: render a catalog into ``<out>/<canonical_name>.py`` plus ``<out>/manifest.json``.

Output is byte-identical across runs and machines (sorted keys, no timestamps, no absolute
paths); a file is written only when its content changes, and always through a temporary file
and an atomic rename, so a reader never sees half a file. Builds into one folder take turns (a file
lock), and a manifest is validated whenever it is read: its entries name files inside the folder.

A build that changes anything first writes its new manifest beside the old one (``.manifest.json.next``), then
replaces the kernel files, then renames the new manifest over the old: at every moment, a build killed
included, each kernel file is recorded by one of the two manifests, which the loader accepts. The next build
takes over what an interrupted one left (its manifest, its temporary files).
"""
from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from filelock import FileLock

from .._resources import data_dir, installed
from .._version import __version__
from ..errors import BuildFolderError, SpecError, did_you_mean
from ..spec.catalog import DEFAULT_CATALOG_NAME, Catalog
from .render import RenderedKernel, render_variant

MANIFEST = "manifest.json"
MANIFEST_SCHEMA = 1
# Held around a build's read-merge-write of the manifest. It stays in the folder; .gitignore and the wheel's
# package-data (*.py, manifest.json) leave it out.
LOCK = ".manifest.json.lock"
# The manifest of a build under way (or interrupted): written before the kernel files, renamed to MANIFEST after.
PENDING = ".manifest.json.next"
# What a build reads from a folder is bounded: the default catalog's manifest is 0.3 MB, a kernel file under 0.1 MB.
MAX_FILE_BYTES = 64 << 20
_SHA256 = re.compile(r"[0-9a-f]{64}")
# write_atomic's temporary files for the files a build writes (a killed build leaves them behind).
_TEMP = re.compile(rf"\.({re.escape(MANIFEST)}|{re.escape(PENDING)}|\w+\.py)\.[0-9a-f]{{16}}\.tmp")
_FILE_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
               (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"))


class UnreadableFileError(BuildFolderError):
    """A file in a build folder is not a regular file (a FIFO would block its reader, a device never end) or is
    larger than MAX_FILE_BYTES. ``problem`` says which, for callers that name their own fix."""

    def __init__(self, path: Path, problem: str):
        super().__init__(f"{path} {problem}; remove it and build again")
        self.problem = problem


def read_regular(path: Path, limit: int = MAX_FILE_BYTES) -> tuple[bytes, os.stat_result]:
    """The bytes of the regular file ``path`` (at most ``limit``) and the stat of what was read."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opened without O_NONBLOCK waits for a writer
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = next((name for test, name in _FILE_KINDS if test(st.st_mode)), "a special file")
            raise UnreadableFileError(path, f"is {kind}, not a regular file")
        with open(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise UnreadableFileError(path, f"is larger than {limit} bytes, more than any file ogsgen writes")
    return data, st


def _holds(path: Path, data: bytes) -> bool:
    """Whether ``path`` holds exactly ``data`` (False when it does not exist)."""
    try:
        return read_regular(path)[0] == data
    except FileNotFoundError:
        return False


def select(catalog: Catalog, only: str | None):
    """The catalog's variants whose canonical names match the glob ``only`` (all when None)."""
    variants = catalog.by_name()
    if only is None:
        return list(variants.values())
    chosen = [v for name, v in variants.items() if fnmatch.fnmatchcase(name, only)]
    if not chosen:
        raise SpecError(f"--only {only!r} matches no variant of catalog {catalog.name}{did_you_mean(only, variants)}; "
                        f"`ogsgen list` shows the names")
    return chosen


def render_catalog(catalog: Catalog, only: str | None = None,
                   progress: Callable[[int, int, str], None] | None = None) -> list[RenderedKernel]:
    variants = select(catalog, only)
    rendered = []
    for i, variant in enumerate(variants):
        kernel = render_variant(variant, catalog.name)
        rendered.append(kernel)
        if progress:
            progress(i + 1, len(variants), kernel.name)
    return rendered


def write_atomic(path: Path, text: str) -> bool:
    """Write ``text`` to ``path`` unless it already holds exactly that; True when written. The file gets mode 0644
    less the umask: others read it as the user's other files, and no one else writes it (the loader refuses files
    others can write, which a umask of 002 would give)."""
    data = text.encode()
    if _holds(path, data):
        return False
    _replace(path, data)
    return True


def _replace(path: Path, data: bytes) -> None:
    """Give ``path`` the content ``data`` by an atomic rename of a temporary file beside it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # Not tempfile.mkstemp, which makes files 0600 whatever the umask; O_EXCL never shares another writer's file.
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _manifest_text(catalog_name: str, entries: dict) -> str:
    manifest = {"schema": MANIFEST_SCHEMA, "ogsgen_version": __version__, "catalog": catalog_name,
                "variants": entries}
    return json.dumps(manifest, indent=2, sort_keys=True) + "\n"


def _manifest_problem(manifest) -> str | None:
    """What makes a parsed manifest unusable, or None."""
    if not isinstance(manifest, dict):
        return "it is not a JSON object"
    if manifest.get("schema") != MANIFEST_SCHEMA:
        return f"it has schema {manifest.get('schema')!r}, ogsgen {__version__} reads schema {MANIFEST_SCHEMA}"
    if not isinstance(manifest.get("catalog"), str):
        return "its 'catalog' is not a string"
    variants = manifest.get("variants")
    if not isinstance(variants, dict):
        return "its 'variants' is not an object"
    for name, entry in variants.items():
        if not name.isidentifier():  # a canonical name; the entry's file is named after it
            return f"entry {name!r} is not a kernel name"
        if not isinstance(entry, dict):
            return f"entry {name!r} is not an object"
        if "path" not in entry:
            return f"entry {name!r} has no path"
        if entry["path"] != f"{name}.py":  # builds remove and the loader reads these files: none outside the folder
            return f"entry {name!r} has path {entry['path']!r}, which must be '{name}.py'"
        if not (isinstance(entry.get("sha256"), str) and _SHA256.fullmatch(entry["sha256"])):
            return f"entry {name!r} has no valid sha256"
        if not isinstance(entry.get("catalog"), str):
            return f"entry {name!r} has no catalog"
    return None


def parse_manifest(path: Path, data: bytes) -> dict:
    """The manifest ``path`` holds (``data``), validated."""
    try:
        manifest = json.loads(data.decode("utf-8"))
        problem = _manifest_problem(manifest)
    except UnicodeDecodeError:
        problem = "it is not UTF-8"
    except RecursionError:
        problem = "it is not a manifest (JSON nested too deeply)"
    except ValueError as exc:
        problem = f"it is not valid JSON ({exc})"
    if problem:
        raise BuildFolderError(f"{path} is damaged or was not written by this version of ogsgen: {problem}; "
                               f"remove it and build again")
    return manifest


def read_manifest(out_dir: Path, filename: str = MANIFEST) -> dict:
    """The folder's manifest.json (or ``filename``, another manifest there), validated ({} when there is none)."""
    path = Path(out_dir) / filename
    try:
        data, _ = read_regular(path)
    except FileNotFoundError:
        return {}
    except UnreadableFileError as exc:
        raise BuildFolderError(f"{path} is damaged or was not written by this version of ogsgen: it {exc.problem}; "
                               f"remove it and build again") from None
    return parse_manifest(path, data)


def _recorded(out_dir: Path) -> dict:
    """The entries of the folder's manifest, with those of an interrupted build's manifest whose files it wrote."""
    recorded = read_manifest(out_dir).get("variants", {})
    for name, entry in read_manifest(out_dir, PENDING).get("variants", {}).items():
        try:
            written = hashlib.sha256(read_regular(out_dir / entry["path"])[0]).hexdigest() == entry["sha256"]
        except FileNotFoundError:
            written = False
        if written:
            recorded[name] = entry
    return recorded


def _temporaries(out_dir: Path) -> list[Path]:
    """The temporary files of builds killed while writing (a build removes them under the folder's lock)."""
    return sorted(p for p in out_dir.glob(".*.tmp") if _TEMP.fullmatch(p.name))


def _folder(out_dir) -> Path:
    """``out_dir`` as a Path, unless it or the nearest of its parents that exists is a file."""
    out_dir = Path(out_dir)
    existing = next(p for p in (out_dir, *out_dir.parents) if p.exists())
    if not existing.is_dir():
        where = "is a file, not a folder" if existing == out_dir else f"is inside a file ({existing})"
        raise BuildFolderError(f"--out {out_dir} {where}; give a folder (created when missing)")
    return out_dir


def _planned(catalog: Catalog, rendered: list[RenderedKernel], recorded: dict, partial: bool) -> dict[str, str]:
    """File name -> content of everything a build writes, the manifest included."""
    entries = {k.name: k.manifest_entry() for k in rendered}
    if partial:  # --only: keep what an earlier build recorded for the other variants
        entries = {**recorded, **entries}
    files = {k.filename: k.source for k in rendered}
    files[MANIFEST] = _manifest_text(catalog.name, entries)
    return files


@dataclass
class BuildReport:
    written: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)


def build(catalog: Catalog, out_dir: str | os.PathLike, only: str | None = None, dry_run: bool = False,
          progress=None) -> BuildReport:
    """Render and write; a full build also removes the files an earlier build wrote for variants the
    catalog no longer has (files ogsgen did not write are left alone)."""
    out_dir = _folder(out_dir)
    package_folder = out_dir.resolve() == data_dir("generated").resolve()
    if package_folder and installed():
        raise BuildFolderError(f"--out {out_dir} is the installed ogsgen's generated/ folder: its kernels ship built "
                               f"(`ogsgen build --check` checks them) and pip owns its files (one a build added would "
                               f"stay behind when pip removes ogsgen); build into a folder of your own with --out DIR "
                               f"and load it with OGSGEN_PATH=DIR or ogsgen.add_search_path(DIR)")
    if package_folder and catalog.name != DEFAULT_CATALOG_NAME:
        raise BuildFolderError(f"--out {out_dir} is ogsgen's own generated/ folder, whose kernels the default catalog "
                               f"builds (a build of catalog {catalog.name} would replace or remove them); choose "
                               f"another --out for your catalog")
    rendered = render_catalog(catalog, only, progress)
    if dry_run:
        return _write(catalog, rendered, out_dir, only, dry_run)
    lock = out_dir / LOCK
    if lock.is_symlink():  # filelock opens it without following links since 3.20.1; refuse it whatever the version
        raise BuildFolderError(f"{lock} is a symbolic link (to {os.readlink(lock)}); a build's lock must be a file "
                               f"of its own, which the build creates: remove the link")
    try:
        out_dir.mkdir(mode=0o755, parents=True, exist_ok=True)  # as its files: writable by no one else
        # One build at a time per folder: a partial build merges its entries into the manifest it read.
        with FileLock(lock):
            return _write(catalog, rendered, out_dir, only, dry_run)
    except OSError as exc:
        what = f"{exc.filename} ({exc.strerror})" if exc.filename else str(exc)
        raise BuildFolderError(f"--out {out_dir}: cannot write {what}; choose a folder you can write, "
                               f"or fix its permissions") from exc


def _write(catalog: Catalog, rendered: list[RenderedKernel], out_dir: Path, only: str | None,
           dry_run: bool) -> BuildReport:
    report = BuildReport()
    recorded = _recorded(out_dir)
    planned = _planned(catalog, rendered, recorded, only is not None)
    for filename, text in planned.items():
        (report.unchanged if _holds(out_dir / filename, text.encode()) else report.written).append(filename)
    if only is None:
        report.removed = [entry["path"] for entry in recorded.values()
                          if entry["path"] not in planned and (out_dir / entry["path"]).exists()]
    if dry_run:
        return report
    for temporary in _temporaries(out_dir):
        temporary.unlink()
    new_manifest = MANIFEST in report.written
    if new_manifest:  # first, renamed over the old one last: every kernel file is recorded by one of the two
        _replace(out_dir / PENDING, planned[MANIFEST].encode())
    for filename in report.written:
        if filename != MANIFEST:
            _replace(out_dir / filename, planned[filename].encode())
    if new_manifest:
        os.replace(out_dir / PENDING, out_dir / MANIFEST)
    else:  # an interrupted build's manifest, whose entries the manifest holds
        (out_dir / PENDING).unlink(missing_ok=True)
    for filename in report.removed:  # after the switch: the old manifest's readers could still want them
        (out_dir / filename).unlink()
    return report


@dataclass
class CheckReport:
    stale: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    leftover: list[str] = field(default_factory=list)  # of interrupted builds; the next build removes them

    @property
    def ok(self) -> bool:
        return not (self.stale or self.missing or self.extra or self.leftover)


def check(catalog: Catalog, out_dir: str | os.PathLike, only: str | None = None) -> CheckReport:
    """Compare a build folder with what ``build`` would write now, without writing anything."""
    out_dir = _folder(out_dir)
    planned = _planned(catalog, render_catalog(catalog, only), _recorded(out_dir), only is not None)
    report = CheckReport()
    for filename, text in sorted(planned.items()):
        path = out_dir / filename
        if not path.exists():
            report.missing.append(filename)
        elif not _holds(path, text.encode()):
            report.stale.append(filename)
    if out_dir.is_dir():
        report.leftover = [p.name for p in _temporaries(out_dir)]
        if (out_dir / PENDING).exists():
            report.leftover.append(PENDING)
        if only is None:
            report.extra = sorted(p.name for p in out_dir.glob("*.py") if p.name not in planned)
    return report
