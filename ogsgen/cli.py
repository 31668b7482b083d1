"""Command line: ``ogsgen build | list | show | warmup``."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ._version import __version__
from .errors import OgsgenError, did_you_mean

# The commands import the compiler (and with it torch) when they run: --help and --version stay instant.


def _catalog(args):
    from .spec.catalog import default_catalog, load_catalog_file

    return load_catalog_file(args.spec) if args.spec else default_catalog()


def _progress(done: int, total: int, name: str) -> None:
    if sys.stderr.isatty():
        end = "\n" if done == total else ""
        sys.stderr.write(f"\r\x1b[2K[{done:>{len(str(total))}}/{total}] {name}{end}")
        sys.stderr.flush()


def _progress_bar(done: int, total: int, name: str) -> None:
    """A bar on a terminal; in a log, one line per tenth done."""
    width, filled = 30, 30 * done // total
    line = f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {name}"
    if sys.stderr.isatty():
        sys.stderr.write(f"\r\x1b[2K{line}" + ("\n" if done == total else ""))
    elif done == total or done * 10 // total != (done - 1) * 10 // total:
        sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _cmd_build(args) -> int:
    from ._resources import data_dir, installed
    from .codegen.build import MANIFEST, build

    if args.spec and not args.out:
        raise OgsgenError("--spec needs --out DIR: user kernels go to a folder of your own, not into the package")
    catalog = _catalog(args)
    out = Path(args.out) if args.out else data_dir("generated")
    # An installed ogsgen ships its kernels built, in a folder pip owns: there `ogsgen build` checks them.
    if args.check or (not args.out and installed()):
        return _check(args, catalog, out)
    report = build(catalog, out, args.only, dry_run=args.dry_run, progress=_progress)
    verb = "would write" if args.dry_run else "wrote"
    if not args.quiet:
        for name in report.written:
            print(f"{verb} {out / name}")
        for name in report.removed:
            print(f"{'would remove' if args.dry_run else 'removed'} {out / name}")
    kernels = [name for name in report.written if name != MANIFEST]
    unchanged = [name for name in report.unchanged if name != MANIFEST]
    manifest = " and the manifest" if MANIFEST in report.written else ""
    print(f"{catalog.name}: {len(kernels) + len(unchanged)} variant(s): {verb} {len(kernels)} kernel file(s)"
          f"{manifest}, {len(unchanged)} unchanged, {len(report.removed)} removed, in {out}")
    return 0


def _check(args, catalog, out: Path) -> int:
    from ._resources import installed
    from .codegen.build import check, select

    command = "ogsgen build --check" if args.check else "ogsgen build"
    report = check(catalog, out, args.only)
    for label, names in (("stale", report.stale), ("missing", report.missing), ("extra", report.extra),
                         ("leftover", report.leftover)):
        for name in names:
            print(f"{label}: {out / name}")
    if not report.ok:
        spec, folder = (f" --spec {args.spec}" if args.spec else ""), (f" --out {args.out}" if args.out else "")
        fix = ("reinstall ogsgen, whose package ships them built" if not args.out and installed() else
               f"run `ogsgen build{spec}{folder}`")
        print(f"{command}: {out} does not match catalog {catalog.name}; {fix}")
        return 1
    print(f"{command}: {out} is up to date ({len(select(catalog, args.only))} variant(s))")
    if not args.check:
        print("ogsgen build: an installed ogsgen ships its kernels built, so this build only checked them; build a "
              "catalog of your own with --spec FILE --out DIR")
    return 0


def _cmd_list(args) -> int:
    from .codegen.build import select
    from .spec.variant import canonical_name

    for variant in select(_catalog(args), args.only):
        print(canonical_name(variant))
    return 0


def _cmd_show(args) -> int:
    from .codegen.render import render_variant

    catalog = _catalog(args)
    variants = catalog.by_name()
    if args.name not in variants:
        hint = "" if args.spec else " (a variant of your own catalog: add --spec FILE)"
        raise OgsgenError(f"show: no variant named {args.name!r} in catalog {catalog.name}"
                          f"{did_you_mean(args.name, variants)}{hint}; `ogsgen list` shows them")
    sys.stdout.write(render_variant(variants[args.name], catalog.name).source)
    return 0


def _cmd_warmup(args) -> int:
    from .codegen.build import select
    from .runtime.warmup import warmup
    from .spec.variant import canonical_name

    if args.out:  # the worker processes find user-built kernels through the environment
        os.environ["OGSGEN_PATH"] = os.pathsep.join([str(Path(args.out).resolve()),
                                                     *filter(None, [os.environ.get("OGSGEN_PATH")])])
    names = [canonical_name(v) for v in select(_catalog(args), args.only)]
    report = warmup(args.spec, names, jobs=args.jobs, progress=_progress_bar)
    for description, error in report.failures:
        print(f"failed: {description}: {error}")
    print(f"ogsgen warmup: {report.done - len(report.failures)} of {report.done} launch configurations of "
          f"{len(names)} variants compiled or found in Triton's cache in {report.seconds:.0f} s")
    if (replaced := report.hazard_replaced):
        print(f"ogsgen warmup: {replaced} {'binary' if replaced == 1 else 'binaries'} had ptxas's wgmma register "
              f"hazard; their calls run a clean tile or wait for each wgmma instead (correct; docs/troubleshooting.md)")
    return 1 if report.failures else 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ogsgen", description="Generate specialized Triton MoE matmul kernels.")
    p.add_argument("--version", action="version", version=f"ogsgen {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    def add_catalog_args(cmd):
        cmd.add_argument("--spec", metavar="FILE", help="a user catalog file (Python, defines VARIANTS); "
                                                        "default: the embedded catalog")
        cmd.add_argument("--only", metavar="GLOB", help="only variants whose canonical name matches the glob, "
                                                        "e.g. 'ogs_matmul_xbf16_*_act_swiglu'")

    b = sub.add_parser("build", help="render kernels into a folder with a manifest")
    add_catalog_args(b)
    b.add_argument("--out", metavar="DIR", help="output folder (default: the package's generated/ in a source "
                                                 "checkout; an installed ogsgen's kernels ship built, and `ogsgen "
                                                 "build` only checks them)")
    b.add_argument("--check", action="store_true", help="render in memory; exit 1 naming stale, missing and "
                                                         "extra files and what interrupted builds left")
    b.add_argument("--dry-run", action="store_true", help="report what would be written, write nothing")
    b.add_argument("-q", "--quiet", action="store_true", help="print only the summary line, not each file")
    b.set_defaults(run=_cmd_build)
    ls = sub.add_parser("list", help="list the canonical names of a catalog's variants")
    add_catalog_args(ls)
    ls.set_defaults(run=_cmd_list)
    show = sub.add_parser("show", help="print the generated source of one variant")
    show.add_argument("name")
    show.add_argument("--spec", metavar="FILE", help="a user catalog file")
    show.set_defaults(run=_cmd_show)
    w = sub.add_parser("warmup", help="compile the built variants for this GPU into Triton's cache, so that a "
                                      "later process's first calls compile nothing")
    add_catalog_args(w)
    w.add_argument("--out", "--path", metavar="DIR", dest="out",
                   help="the folder the --spec catalog was built into (ogsgen build --out DIR); --path is its old "
                        "name, still accepted")
    w.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1), help="compiler processes")
    w.set_defaults(run=_cmd_warmup)
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.run(args)
    except OgsgenError as exc:
        print(f"ogsgen: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and friends
        sys.stderr.close()
        return 0
