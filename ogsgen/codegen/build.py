"""Build folders: render a catalog into ``<out>/<canonical_name>.py`` plus ``<out>/manifest.json``.

Output is byte-identical across runs and machines (sorted keys, no timestamps, no absolute
paths); a file is written only when its content changes, and always through a temporary file
and an atomic rename, so a reader never sees half a file. Builds into one folder take turns (a file
lock), and a manifest is validated whenever it is read: its entries name files inside the folder.
"""
from __future__ import annotations

import fnmatch
import json
import os
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from filelock import FileLock

from .._version import __version__
from ..errors import BuildFolderError, SpecError, did_you_mean
from ..spec.catalog import Catalog
from .render import RenderedKernel, render_variant

MANIFEST = "manifest.json"
MANIFEST_SCHEMA = 1
# Held around a build's read-merge-write of the manifest. It stays in the folder; .gitignore and the wheel's
# package-data (*.py, manifest.json) leave it out.
LOCK = ".manifest.json.lock"
_SHA256 = re.compile(r"[0-9a-f]{64}")


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
    """Write ``text`` to ``path`` unless it already holds exactly that; True when written. The file gets the mode
    the umask gives (0644 under umask 022), as any file the user creates."""
    data = text.encode()
    try:
        if path.read_bytes() == data:
            return False
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    # Not tempfile.mkstemp, which makes files 0600 whatever the umask; O_EXCL never shares another writer's file.
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return True


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


def read_manifest(out_dir: Path) -> dict:
    """The folder's manifest.json, validated ({} when the folder has none)."""
    path = Path(out_dir) / MANIFEST
    try:
        manifest = json.loads(path.read_bytes().decode("utf-8"))
        problem = _manifest_problem(manifest)
    except FileNotFoundError:
        return {}
    except UnicodeDecodeError:
        problem = "it is not UTF-8"
    except json.JSONDecodeError as exc:
        problem = f"it is not valid JSON ({exc})"
    if problem:
        raise BuildFolderError(f"{path} is damaged or was not written by this version of ogsgen: {problem}; "
                               f"remove it and build again")
    return manifest


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
    rendered = render_catalog(catalog, only, progress)
    if dry_run:
        return _write(catalog, rendered, out_dir, only, dry_run)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        # One build at a time per folder: a partial build merges its entries into the manifest it read.
        with FileLock(out_dir / LOCK):
            return _write(catalog, rendered, out_dir, only, dry_run)
    except OSError as exc:
        what = f"{exc.filename} ({exc.strerror})" if exc.filename else str(exc)
        raise BuildFolderError(f"--out {out_dir}: cannot write {what}; choose a folder you can write, "
                               f"or fix its permissions") from exc


def _write(catalog: Catalog, rendered: list[RenderedKernel], out_dir: Path, only: str | None,
           dry_run: bool) -> BuildReport:
    report = BuildReport()
    recorded = read_manifest(out_dir).get("variants", {})
    planned = _planned(catalog, rendered, recorded, only is not None)
    for filename, text in planned.items():
        path = out_dir / filename
        changed = (not path.exists() or path.read_bytes() != text.encode()) if dry_run else write_atomic(path, text)
        (report.written if changed else report.unchanged).append(filename)
    if only is None:
        for entry in recorded.values():
            path = out_dir / entry["path"]
            if entry["path"] not in planned and path.exists():
                report.removed.append(entry["path"])
                if not dry_run:
                    path.unlink()
    return report


@dataclass
class CheckReport:
    stale: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.stale or self.missing or self.extra)


def check(catalog: Catalog, out_dir: str | os.PathLike, only: str | None = None) -> CheckReport:
    """Compare a build folder with what ``build`` would write now, without writing anything."""
    out_dir = _folder(out_dir)
    recorded = read_manifest(out_dir).get("variants", {})
    planned = _planned(catalog, render_catalog(catalog, only), recorded, only is not None)
    report = CheckReport()
    for filename, text in sorted(planned.items()):
        path = out_dir / filename
        if not path.exists():
            report.missing.append(filename)
        elif path.read_bytes() != text.encode():
            report.stale.append(filename)
    if only is None and out_dir.is_dir():
        report.extra = sorted(p.name for p in out_dir.glob("*.py") if p.name not in planned)
    return report
