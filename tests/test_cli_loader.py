"""The CLI (build / list / show, --check, --only, --dry-run), catalogs, and the runtime loader."""
import argparse
import fnmatch
import hashlib
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ogsgen
from ogsgen.cli import main, parser
from ogsgen.runtime import loader
from ogsgen.spec import BF16, FP16, KernelVariant, canonical_name, default_catalog, load_catalog_file, registered

HERE = Path(__file__).parent
CUSTOM_CATALOG = HERE / "catalogs" / "custom_catalog.py"
BETAS_VARIANT = "ogs_matmul_xfp16_wfp16_yfp16_bias_betas"  # in no catalog


@pytest.fixture
def isolated_loader(monkeypatch, tmp_path):
    """A loader that sees only the package's generated/ plus what the test adds."""
    monkeypatch.setattr(loader, "_extra_dirs", [])
    monkeypatch.setattr(loader, "_kernels", {})
    monkeypatch.setattr(loader, "_modules_by_sha", {})  # else a file identical to one imported earlier aliases it
    monkeypatch.setattr(loader, "_manifests", {})
    monkeypatch.setattr(loader, "_on_demand", None)
    monkeypatch.setattr(loader, "_unwritable_caches_warned", set())
    monkeypatch.delenv("OGSGEN_PATH", raising=False)
    monkeypatch.delenv("OGSGEN_ON_DEMAND", raising=False)
    monkeypatch.setenv("OGSGEN_CACHE_DIR", str(tmp_path / "cache"))
    return loader


def _betas_call(device):
    x = torch.randn(9, 16, device=device, dtype=torch.float16)
    w = torch.randn(16, 24, device=device, dtype=torch.float16)
    bias, betas = torch.randn(24, device=device), torch.rand(9, device=device)
    y = ogsgen.matmul_ogs(x, w, bias, betas=betas)
    ref = ogsgen.matmul_ogs_torch(x.float(), w.float(), bias, betas=betas)
    torch.testing.assert_close(y, ref.half(), atol=2e-2, rtol=1e-2)


# ---------------------------------------------------------------- CLI

def test_the_docs_name_only_commands_that_exist():
    commands, = (action.choices for action in parser()._actions if isinstance(action, argparse._SubParsersAction))
    text = "\n".join(path.read_text() for path in [HERE.parent / "README.md", *(HERE.parent / "docs").glob("*.md")])
    named = set(re.findall(r"`ogsgen (\w+)", text))
    for listing in re.findall(r"ogsgen (\w+(?: \(--\w+\))?(?: / \w+(?: \(--\w+\))?)+)", text):  # "ogsgen a / b"
        named |= {command.split()[0] for command in listing.split(" / ")}
    assert {"build", "warmup"} <= named and named <= set(commands), sorted(named - set(commands))


@pytest.mark.slow
def test_build_check_dry_run_only(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["build", "--only", "ogs_matmul_xfp16_*", "--out", str(out), "--dry-run"]) == 0
    assert not out.exists()
    assert main(["build", "--check", "--out", str(out)]) == 1
    assert "missing: " in capsys.readouterr().out
    assert main(["build", "--only", "ogs_matmul_xfp16_*", "--out", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    expected = [n for n in default_catalog().by_name() if n.startswith("ogs_matmul_xfp16_")]
    assert manifest["catalog"] == "ogsgen:default" and sorted(manifest["variants"]) == sorted(expected)
    entry = manifest["variants"]["ogs_matmul_xfp16_wfp16_yfp16_act_swiglu"]
    assert entry["path"] == "ogs_matmul_xfp16_wfp16_yfp16_act_swiglu.py"
    assert entry["spec"]["activation"]["name"] == "swiglu" and entry["functions"]["activation"]
    assert main(["build", "--check", "--only", "ogs_matmul_xfp16_*", "--out", str(out)]) == 0
    (out / "ogs_stray.py").write_text("")
    capsys.readouterr()
    assert main(["build", "--check", "--out", str(out)]) == 1
    text = capsys.readouterr().out
    assert "extra: " in text and "ogs_stray.py" in text and "missing: " in text


def test_list_and_show(capsys):
    assert main(["list", "--only", "*_act_swiglu"]) == 0
    names = capsys.readouterr().out.split()
    assert names and all(n.endswith("_act_swiglu") for n in names)
    assert main(["show", names[0]]) == 0
    assert f"def {names[0]}(" in capsys.readouterr().out
    assert main(["show", "ogs_nope"]) == 2
    assert "no variant named 'ogs_nope'" in capsys.readouterr().err


def test_only_matching_nothing_is_an_error(capsys):
    assert main(["build", "--only", "nothing*", "--dry-run"]) == 2
    assert "--only 'nothing*' matches no variant" in capsys.readouterr().err


def test_misspelt_names_get_suggestions(capsys):
    assert main(["show", "ogs_matmul_xbf16_wbf16_ybf16_swiglu"]) == 2
    err = capsys.readouterr().err
    assert "did you mean ogs_matmul_xbf16_wbf16_ybf16_act_swiglu" in err and "add --spec FILE" in err
    assert main(["list", "--only", "ogs_matmul_xbf16_wbf16_ybf16_swiglu"]) == 2
    assert "did you mean ogs_matmul_xbf16_wbf16_ybf16_act_swiglu" in capsys.readouterr().err


def test_build_quiet_prints_the_summary_only_and_counts_variants_as_check_does(tmp_path, capsys):
    only = "ogs_matmul_xfp16_wfp16_yfp16_bias*"
    n = len([v for v in default_catalog().by_name() if fnmatch.fnmatchcase(v, only)])
    assert main(["build", "--only", only, "--out", str(tmp_path), "-q"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [f"ogsgen:default: {n} variant(s): wrote {n} kernel file(s) and the manifest, 0 unchanged, "
                   f"0 removed, in {tmp_path}"]
    assert main(["build", "--check", "--only", only, "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"ogsgen build --check: {tmp_path} is up to date ({n} variant(s))\n"


def test_warmup_folder_flag_and_its_old_name():
    for flag in ("--out", "--path"):
        args = parser().parse_args(["warmup", "--spec", "c.py", flag, "built"])
        assert args.out == "built"


def test_spec_needs_out(capsys):
    assert main(["build", "--spec", str(CUSTOM_CATALOG)]) == 2
    assert "--spec needs --out" in capsys.readouterr().err


def test_user_catalog_never_builds_into_the_package_folder(tmp_path, monkeypatch, capsys):
    # A built folder stands for the package's generated/, which a user catalog's full build would empty.
    package = tmp_path / "generated"
    assert main(["build", "--only", "ogs_matmul_xfp16_wfp16_yfp16", "--out", str(package)]) == 0
    monkeypatch.setattr(importlib.import_module("ogsgen.codegen.build"), "data_dir", lambda name: package,
                        raising=False)
    before = {p.name: p.read_bytes() for p in package.iterdir()}
    (tmp_path / "link").symlink_to(package)
    for out in (package, tmp_path / "link", package / ".." / "generated"):
        for flags in ([], ["--dry-run"]):
            assert main(["build", "--spec", str(CUSTOM_CATALOG), "--out", str(out), *flags]) == 2
            err = capsys.readouterr().err
            assert f"--out {out} is ogsgen's own generated/ folder" in err and "choose another --out" in err, err
    assert {p.name: p.read_bytes() for p in package.iterdir()} == before
    assert main(["build", "--only", "ogs_matmul_xfp16_wfp16_yfp16", "--out", str(tmp_path / "link")]) == 0


CLASHING_NAMES = """
import triton
import ogsgen
from ogsgen.spec import BF16, KernelVariant

@ogsgen.register_activation
@triton.jit
def clash_epi_tail(tile):
    return tile

@ogsgen.register_activation
@triton.jit
def clash(tile):
    return tile * 2

@ogsgen.register_epilogue
@triton.jit
def tail(tile, offs_m, offs_n, mask):
    return tile + 1

VARIANTS = [KernelVariant(BF16, BF16, BF16, activation=clash_epi_tail),
            KernelVariant(BF16, BF16, BF16, activation=clash, epilogue=tail)]
"""


def test_two_variants_of_one_name_are_refused(tmp_path, capsys):
    path = tmp_path / "clashing_catalog.py"
    path.write_text(CLASHING_NAMES)
    assert main(["list", "--spec", str(path)]) == 2
    err = capsys.readouterr().err
    assert ("KernelVariant(BF16, BF16, BF16, activation=clash_epi_tail) and KernelVariant(BF16, BF16, BF16, "
            "activation=clash, epilogue=tail) have one canonical name, ogs_matmul_xbf16_wbf16_ybf16_act_clash_epi_tail"
            in err and "rename one of their functions" in err), err


def test_user_catalog_list(capsys):
    assert main(["list", "--spec", str(CUSTOM_CATALOG)]) == 0
    assert "ogs_matmul_xbf16_wbf16_ybf16_bias_act_leaky_scaled" in capsys.readouterr().out.split()


@pytest.mark.parametrize("content,message", [
    (None, "no such file"),
    ("VARIANTS = [", "SyntaxError"),
    ("x = 1\n", "defines no VARIANTS"),
    ("VARIANTS = 3\n", "VARIANTS must be a list"),
    ("VARIANTS = ['ogs_matmul']\n", "VARIANTS[0] is a str, not a KernelVariant"),
    ("import ogsgen, triton\n@ogsgen.register_activation(name='bad name')\n@triton.jit\ndef f(tile):\n"
     "    return tile\nVARIANTS = []\n", "must be a valid Python identifier"),
    ("from ogsgen.spec import KernelVariant, BF16\nVARIANTS = [KernelVariant(BF16, BF16, 'bf16')]\n",
     "KernelVariant.y must be a NumericFormat"),
])
def test_malformed_catalogs(tmp_path, capsys, content, message):
    path = tmp_path / "bad_catalog.py"
    if content is not None:
        path.write_text(content)
    assert main(["list", "--spec", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"--spec {path}" in err and message in err


def test_a_user_catalogs_files_name_the_command_that_rebuilds_them(tmp_path):
    assert main(["build", "--spec", str(CUSTOM_CATALOG), "--out", str(tmp_path), "-q"]) == 0
    banner = next(tmp_path.glob("*.py")).read_text().splitlines()[:2]
    assert banner[1] == (f"# `ogsgen build --spec {CUSTOM_CATALOG.name} --out <this folder>` (your catalog file's path "
                         f"in --spec).")


def test_an_empty_catalog_builds_nothing(tmp_path, capsys):
    path, out = tmp_path / "empty_catalog.py", tmp_path / "out"
    path.write_text("VARIANTS = []\n")
    assert main(["build", "--spec", str(path), "--out", str(out)]) == 2
    assert "VARIANTS is empty, so there is nothing to build" in capsys.readouterr().err and not out.exists()


def test_catalog_must_be_python(tmp_path, capsys):
    path = tmp_path / "catalog.json"
    path.write_text("{}")
    assert main(["list", "--spec", str(path)]) == 2
    assert "a catalog is a Python file" in capsys.readouterr().err


def test_catalog_file_cannot_shadow_a_module(tmp_path, monkeypatch):
    real_json = sys.modules["json"]
    monkeypatch.setitem(sys.modules, "json", real_json)  # restored after the test, whatever happens
    catalog = tmp_path / "json.py"
    catalog.write_text("from ogsgen.spec import FP16, KernelVariant\nVARIANTS = [KernelVariant(FP16, FP16, FP16)]\n")
    assert main(["list", "--spec", str(catalog)]) == 0
    assert sys.modules["json"] is real_json


def test_catalog_builds_alike_from_any_folder(tmp_path):
    name = "ogs_matmul_xbf16_wbf16_ybf16_bias_act_leaky_scaled"
    sources = []
    for folder in ("one", "two"):
        (tmp_path / folder).mkdir()
        copy = tmp_path / folder / CUSTOM_CATALOG.name
        copy.write_text(CUSTOM_CATALOG.read_text())
        assert main(["build", "--spec", str(copy), "--only", name, "--out", str(tmp_path / folder / "out")]) == 0
        sources.append((tmp_path / folder / "out" / f"{name}.py").read_text())
    assert sources[0] == sources[1] and str(tmp_path) not in sources[0]
    assert "leaky_scaled = ogsgen.user_catalogs.custom_catalog:leaky_scaled(" in sources[0]


def test_python_dash_m_and_version():
    result = subprocess.run([sys.executable, "-m", "ogsgen", "--version"], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(HERE.parent)})
    assert result.returncode == 0 and result.stdout.strip() == f"ogsgen {ogsgen.__version__}"


def test_help_version_and_plugin_import_no_torch():
    # --help and --version answer at once, and the pytest plugin (loaded by every pytest session of the
    # environment) costs nothing: none of them imports torch.
    script = ("import sys, ogsgen.pytest_plugin\n"
              "from ogsgen.cli import parser\n"
              "for flags in (['--help'], ['--version'], ['build', '--help'], ['warmup', '--help']):\n"
              "    try:\n"
              "        parser().parse_args(flags)\n"
              "    except SystemExit:\n"
              "        pass\n"
              "print(sorted(m for m in ('torch', 'triton', 'jinja2') if m in sys.modules))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(HERE.parent)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


# ---------------------------------------------------------------- loader

def test_variant_not_built(isolated_loader, device, monkeypatch):
    # In strict mode, the message gives the catalog line to add.
    monkeypatch.setenv("OGSGEN_ON_DEMAND", "0")
    with pytest.raises(ogsgen.VariantNotBuiltError, match=BETAS_VARIANT + r".*add KernelVariant\(FP16, FP16, FP16, "
                       r"bias=True, betas=True\) to a catalog's VARIANTS.*ogsgen build --spec"):
        _betas_call(device)


def test_missing_reduce_kernel_names_the_calls_variant(isolated_loader, device, monkeypatch):
    # A top-2 scatter runs a matmul kernel (in the default catalog) and a reduce kernel that applies the epilogue
    # (not built: only generated/ is searched); the reduce kernel is built with the call's variant, which the
    # message spells out in strict mode.
    monkeypatch.setenv("OGSGEN_ON_DEMAND", "0")
    column_scale = load_catalog_file(CUSTOM_CATALOG) and registered("epilogue", "column_scale")
    x, w = torch.randn(8, 32, device=device).bfloat16(), torch.randn(4, 32, 16, device=device).bfloat16()
    routing_data, gather_indx, scatter_indx = ogsgen.routing(torch.randn(8, 4, device=device), 2)
    epilogue = ogsgen.Epilogue(column_scale, (torch.rand(16, device=device),))
    with pytest.raises(ogsgen.VariantNotBuiltError, match=r"ogs_reduce_.*add the matmul variant that needs it.*"
                       r"This call's matmul variant: KernelVariant\(BF16, BF16, BF16, ragged=True, gather=True, "
                       r"scatter=True, epilogue=column_scale\)"):
        ogsgen.matmul_ogs(x, w, None, routing_data, gather_indx, scatter_indx, epilogue=epilogue)


def test_load_from_user_build_dir(isolated_loader, tmp_path, device):
    catalog = tmp_path / "betas_catalog.py"
    catalog.write_text("from ogsgen.spec import FP16, KernelVariant\n"
                       "VARIANTS = [KernelVariant(FP16, FP16, FP16, bias=True, betas=True)]\n")
    assert main(["build", "--spec", str(catalog), "--out", str(tmp_path / "build")]) == 0
    ogsgen.add_search_path(tmp_path / "build")
    _betas_call(device)
    kernel = isolated_loader.kernel_for(KernelVariant(FP16, FP16, FP16, bias=True, betas=True))
    assert Path(kernel.fn.__code__.co_filename) == tmp_path / "build" / f"{BETAS_VARIANT}.py"


def test_ogsgen_path_variable(isolated_loader, tmp_path, monkeypatch):
    assert main(["build", "--only", "ogs_matmul_xbf16_wbf16_ybf16", "--out", str(tmp_path / "b")]) == 0
    monkeypatch.setenv("OGSGEN_PATH", str(tmp_path / "b"))
    assert isolated_loader.search_path()[0] == tmp_path / "b"
    kernel = isolated_loader.kernel_for(KernelVariant(BF16, BF16, BF16))
    assert Path(kernel.fn.__code__.co_filename) == tmp_path / "b" / "ogs_matmul_xbf16_wbf16_ybf16.py"


def test_add_search_path_rejects_missing_folder(tmp_path):
    with pytest.raises(ogsgen.BuildFolderError, match="ogsgen build --out") as info:
        ogsgen.add_search_path(tmp_path / "missing")
    assert isinstance(info.value, FileNotFoundError)  # what it raised before it was a BuildFolderError


def _built_by_an_older_ogsgen(out, name, old, new):
    """Build ``name`` into ``out`` as a build from other sources would have: its provenance differs from today's
    (``old`` replaced by ``new``) and its manifest records the file as it is."""
    assert main(["build", "--only", name, "--out", str(out)]) == 0
    path = out / f"{name}.py"
    path.write_text(path.read_text().replace(old, new))
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["variants"][name]["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (out / "manifest.json").write_text(json.dumps(manifest))


def test_stale_file_is_refused(isolated_loader, tmp_path):
    name = "ogs_matmul_xbf16_wbf16_ybf16"
    _built_by_an_older_ogsgen(tmp_path, name, "'template_sha256': '", "'template_sha256': 'old")
    ogsgen.add_search_path(tmp_path)
    with pytest.raises(ogsgen.StaleKernelError, match=f"{name}.py is stale.*template triton_matmul_ogs.py.jinja.*"
                                                      f"`ogsgen build --out {tmp_path} --only {name}`"):
        isolated_loader.kernel_for(KernelVariant(BF16, BF16, BF16))


def test_stale_function_source_is_refused(isolated_loader, tmp_path):
    name = "ogs_matmul_xbf16_wbf16_ybf16_act_swiglu"
    _built_by_an_older_ogsgen(tmp_path, name, "'activation': '", "'activation': 'old")
    ogsgen.add_search_path(tmp_path)
    with pytest.raises(ogsgen.StaleKernelError, match="activation 'swiglu' has a different source"):
        isolated_loader.kernel_for(KernelVariant(BF16, BF16, BF16, activation=ogsgen.swiglu))


def test_on_demand_generation(isolated_loader, tmp_path, device, caplog):
    ogsgen.set_on_demand(True)
    with caplog.at_level("INFO", logger="ogsgen"):
        _betas_call(device)
    generated = list((tmp_path / "cache").rglob(f"{BETAS_VARIANT}.py"))
    assert len(generated) == 1 and "generating " + BETAS_VARIANT in caplog.text


def test_on_demand_replaces_stale_file(isolated_loader, tmp_path):
    name = "ogs_matmul_xbf16_wbf16_ybf16"
    _built_by_an_older_ogsgen(tmp_path / "b", name, "'template_sha256': '", "'template_sha256': 'old")
    ogsgen.add_search_path(tmp_path / "b")
    ogsgen.set_on_demand(True)
    kernel = isolated_loader.kernel_for(KernelVariant(BF16, BF16, BF16))
    assert Path(kernel.fn.__code__.co_filename).parent == isolated_loader.cache_dir()


RACE_SCRIPT = """
import os, torch
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
import ogsgen
device = "cuda" if torch.cuda.is_available() else "cpu"
x = torch.randn(9, 16, device=device, dtype=torch.float16); w = torch.randn(16, 24, device=device, dtype=torch.float16)
bias, betas = torch.randn(24, device=device), torch.rand(9, device=device)
y = ogsgen.matmul_ogs(x, w, bias, betas=betas)
ref = ogsgen.matmul_ogs_torch(x.float(), w.float(), bias, betas=betas).half()
torch.testing.assert_close(y, ref, atol=2e-2, rtol=1e-2)
print("ok")
"""


@pytest.mark.slow
def test_two_processes_racing_on_demand(tmp_path):
    env = {**os.environ, "OGSGEN_ON_DEMAND": "1", "OGSGEN_CACHE_DIR": str(tmp_path),
           "PYTHONPATH": str(HERE.parent)}
    script = RACE_SCRIPT
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    files = list(tmp_path.rglob("*.py"))
    assert [f.name for f in files] == [f"{BETAS_VARIANT}.py"] and not list(tmp_path.rglob("*.tmp"))


def test_kernel_cache_returns_same_object(isolated_loader):
    variant = KernelVariant(BF16, BF16, BF16)
    assert isolated_loader.kernel_for(variant) is isolated_loader.kernel_for(KernelVariant(BF16, BF16, BF16))
    assert canonical_name(variant) == isolated_loader.kernel_for(variant).__name__
