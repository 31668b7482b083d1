"""Build folders: render a catalog into ``<out>/<canonical_name>.py`` plus ``<out>/manifest.json``.

Output is byte-identical across runs and machines (sorted keys, no timestamps, no absolute
paths); a file is written only when its content changes, and always through a temporary file
and an atomic rename, so a reader never sees half a file.
"""
from __future__ import annotations

import fnmatch
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .._version import __version__
from ..errors import SpecError
from ..spec.catalog import Catalog
from .render import RenderedKernel, render_variant

MANIFEST = "manifest.json"
MANIFEST_SCHEMA = 1


def select(catalog: Catalog, only: str | None):
    """The catalog's variants whose canonical names match the glob ``only`` (all when None)."""
    variants = catalog.by_name()
    if only is None:
        return list(variants.values())
    chosen = [v for name, v in variants.items() if fnmatch.fnmatchcase(name, only)]
    if not chosen:
        raise SpecError(f"--only {only!r} matches no variant of catalog {catalog.name}; "
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
    """Write ``text`` to ``path`` unless it already holds exactly that; True when written."""
    try:
        if path.read_text() == text:
            return False
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return True


def _manifest_text(catalog_name: str, entries: dict) -> str:
    manifest = {"schema": MANIFEST_SCHEMA, "ogsgen_version": __version__, "catalog": catalog_name,
                "variants": entries}
    return json.dumps(manifest, indent=2, sort_keys=True) + "\n"


def read_manifest(out_dir: Path) -> dict:
    path = Path(out_dir) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except json.JSONDecodeError as exc:
        raise SpecError(f"{path} is not valid JSON ({exc}); rebuild it with `ogsgen build --out {out_dir}`") from None
    if manifest.get("schema") != MANIFEST_SCHEMA:
        raise SpecError(f"{path} has manifest schema {manifest.get('schema')!r}, this ogsgen reads "
                        f"{MANIFEST_SCHEMA}; rebuild it with `ogsgen build --out {out_dir}`")
    return manifest


def _planned(catalog: Catalog, rendered: list[RenderedKernel], out_dir: Path, partial: bool) -> dict[str, str]:
    """File name -> content of everything a build writes, the manifest included."""
    entries = {k.name: k.manifest_entry() for k in rendered}
    if partial:  # --only: keep what an earlier build recorded for the other variants
        entries = {**read_manifest(out_dir).get("variants", {}), **entries}
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
    out_dir = Path(out_dir)
    rendered = render_catalog(catalog, only, progress)
    report = BuildReport()
    previous = read_manifest(out_dir).get("variants", {})
    planned = _planned(catalog, rendered, out_dir, only is not None)
    for filename, text in planned.items():
        path = out_dir / filename
        changed = (not path.exists() or path.read_text() != text) if dry_run else write_atomic(path, text)
        (report.written if changed else report.unchanged).append(filename)
    if only is None:
        for entry in previous.values():
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
    out_dir = Path(out_dir)
    planned = _planned(catalog, render_catalog(catalog, only), out_dir, only is not None)
    report = CheckReport()
    for filename, text in sorted(planned.items()):
        path = out_dir / filename
        if not path.exists():
            report.missing.append(filename)
        elif path.read_text() != text:
            report.stale.append(filename)
    if only is None and out_dir.is_dir():
        report.extra = sorted(p.name for p in out_dir.glob("*.py") if p.name not in planned)
    return report
