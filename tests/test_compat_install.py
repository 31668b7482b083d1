"""ogsgen.compat.install: ``import triton_kernels`` (every submodule) resolves to ogsgen's package of the chosen
generation, so that a client imports it unchanged. vLLM's gpt-oss MoE module, its mxfp4 weight preparation and its
generation check, fetched unchanged from vLLM's wheel (tests/fetch_vllm_moe.py), run on each generation in a process
of their own (tests/vllm_gpt_oss.py) against the torch reference."""
import importlib
import os
import pkgutil
import subprocess
import sys
import types
import zipfile
from pathlib import Path

import pytest

import ogsgen.compat
from ogsgen.errors import OgsgenError, SpecError

TESTS = Path(__file__).parent
PACKAGES = {"3.5": "ogsgen.compat.triton_kernels", "3.6": "ogsgen.compat.triton_kernels_v36",
            "3.8": "ogsgen.compat.triton_kernels_v3"}


def _triton_kernels_modules() -> list[str]:
    return [name for name in sys.modules if name == "triton_kernels" or name.startswith("triton_kernels.")]


@pytest.fixture
def no_triton_kernels(monkeypatch):
    """No triton_kernels imported during the test (one that this process imported before is put back after it)."""
    for name in _triton_kernels_modules():
        monkeypatch.delitem(sys.modules, name)
    yield
    for name in _triton_kernels_modules():
        del sys.modules[name]


@pytest.mark.usefixtures("no_triton_kernels")
@pytest.mark.parametrize("generation", PACKAGES)
def test_every_submodule_is_the_generations_module(generation):
    ogsgen.compat.install(generation)
    package = importlib.import_module(PACKAGES[generation])
    import triton_kernels
    assert triton_kernels is package
    names = [info.name for info in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]
    assert len(names) > 10
    for name in names:
        alias = "triton_kernels" + name.removeprefix(package.__name__)
        assert importlib.import_module(alias) is importlib.import_module(name), alias
    # What vLLM's get_triton_kernels_version checks: matmul_ogs (gone in 3.8), SparseMatrix (new in 3.6)
    has_matmul_ogs = importlib.util.find_spec("triton_kernels.matmul_ogs") is not None
    has_sparse_matrix = hasattr(importlib.import_module("triton_kernels.tensor"), "SparseMatrix")
    assert (has_matmul_ogs, has_sparse_matrix) == {"3.5": (True, False), "3.6": (True, True),
                                                   "3.8": (False, True)}[generation]
    with pytest.raises(ModuleNotFoundError, match="No module named 'triton_kernels.routing_details'"):
        import triton_kernels.routing_details  # noqa: F401 (a module of triton_kernels' own that ogsgen has not)
    ogsgen.compat.install(generation)  # again: nothing changes
    other = "3.6" if generation == "3.5" else "3.5"
    with pytest.raises(OgsgenError, match=rf"install\('{other}'\): triton_kernels is already ogsgen's {generation} "
                                          rf"package; a process serves one generation"):
        ogsgen.compat.install(other)


def test_unknown_generation_is_refused_with_the_choices():
    with pytest.raises(SpecError, match=r"install\('3.7'\): no such generation; choose '3.5' \(triton_kernels <= 3.5, "
                                        r"matmul_ogs and routing\), '3.6' .*or '3.8'"):
        ogsgen.compat.install("3.7")


@pytest.mark.usefixtures("no_triton_kernels")
def test_a_triton_kernels_imported_before_is_refused(monkeypatch):
    real = types.ModuleType("triton_kernels")
    real.__file__ = "/site-packages/triton_kernels/__init__.py"
    monkeypatch.setitem(sys.modules, "triton_kernels", real)
    with pytest.raises(OgsgenError, match=r"install\('3.5'\): triton_kernels is already imported, from "
                                          r"/site-packages/triton_kernels/__init__.py: call ogsgen.compat.install "
                                          r"before anything imports triton_kernels"):
        ogsgen.compat.install("3.5")
    assert sys.modules["triton_kernels"] is real


# ------------------------------------------------------------------ vLLM's gpt-oss MoE module, unchanged

def test_fetch_places_vllms_modules_from_the_wheel(tmp_path, serve_wheel):
    import fetch_vllm_moe
    wheel = tmp_path / "vllm-0.33.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name in fetch_vllm_moe.MODULES:
            archive.writestr(name, f"# {name}\n")
        archive.writestr("vllm/model_executor/layers/fused_moe/config.py", "# not fetched\n")
    downloads = serve_wheel(fetch_vllm_moe, wheel)
    dest = tmp_path / "vllm_moe"
    placed = fetch_vllm_moe.fetch(dest)
    assert placed == [dest / name for name in fetch_vllm_moe.MODULES]
    assert [path.read_text() for path in placed] == [f"# {name}\n" for name in fetch_vllm_moe.MODULES]
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*.py")) == sorted(fetch_vllm_moe.MODULES)
    assert fetch_vllm_moe.fetch(dest) == placed and len(downloads) == 1  # placed: not downloaded again


def _fetched() -> bool:
    import fetch_vllm_moe
    return all((fetch_vllm_moe.DEFAULT_DEST / name).is_file() for name in fetch_vllm_moe.MODULES)


@pytest.mark.skipif(not _fetched(), reason="vLLM's gpt-oss MoE module is not fetched: python tests/fetch_vllm_moe.py")
@pytest.mark.slow
@pytest.mark.parametrize("generation", ["3.5", "3.6", "3.8"])
def test_vllms_gpt_oss_moe_module_unchanged(generation, tmp_path):
    """bf16 and mxfp4 weights, the mxfp4 ones prepared as on a machine without CUDA and as on an H100 (hopper
    layouts, scales padded), through vLLM's triton_kernel_moe_forward."""
    env = {**os.environ, "OGSGEN_CACHE_DIR": str(tmp_path)}
    run = subprocess.run([sys.executable, str(TESTS / "vllm_gpt_oss.py"), generation], env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"vLLM reads generation {generation}" in run.stdout
    for case in ("bf16", "mxfp4 without CUDA", "mxfp4 on an H100"):
        assert f"{case}: matches the reference" in run.stdout, run.stdout
