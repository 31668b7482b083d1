"""Kernels the search path does not hold are rendered on first use (the default) into OGSGEN_CACHE_DIR, or from
memory where that folder cannot be written; strict mode (OGSGEN_ON_DEMAND=0, set_on_demand(False)) refuses them."""
import inspect
import logging
import os
import re
import sys
from pathlib import Path

import pytest

import ogsgen
from ogsgen.codegen.render import render_variant
from ogsgen.spec import BF16, FP16, KernelVariant, canonical_name, default_catalog
from test_cli_loader import BETAS_VARIANT, _betas_call, isolated_loader  # noqa: F401 (a fixture)

BETAS = KernelVariant(FP16, FP16, FP16, bias=True, betas=True)  # in no catalog
BF16_BETAS = KernelVariant(BF16, BF16, BF16, bias=True, betas=True)  # in no catalog either


def test_the_variants_here_are_not_built():
    assert {canonical_name(BETAS), canonical_name(BF16_BETAS)}.isdisjoint(default_catalog().by_name())


def test_the_suite_keeps_rendered_kernels_out_of_the_home_folder():
    # conftest points OGSGEN_CACHE_DIR at a temporary folder (which xdist workers share) unless it is set already.
    assert not ogsgen.runtime.loader.cache_dir().is_relative_to(Path.home() / ".cache" / "ogsgen")


def test_a_variant_not_built_is_rendered_on_first_use_by_default(isolated_loader, tmp_path, device, caplog):
    with caplog.at_level("INFO", logger="ogsgen"):
        _betas_call(device)  # (against matmul_ogs_torch)
    path = tmp_path / "cache" / ogsgen.__version__ / f"{BETAS_VARIANT}.py"
    assert isolated_loader.cache_dir() == path.parent
    assert path.read_text() == render_variant(BETAS, "ogsgen:on-demand").source
    assert f"generating {BETAS_VARIANT}" in caplog.text
    assert Path(isolated_loader.kernel_for(BETAS).fn.__code__.co_filename) == path


def _strict_by_variable(monkeypatch):
    monkeypatch.setenv("OGSGEN_ON_DEMAND", "0")
    return r"strict mode \(OGSGEN_ON_DEMAND=0 in the environment\)"


def _strict_by_call(monkeypatch):
    ogsgen.set_on_demand(False)  # (isolated_loader restores the setting)
    return r"strict mode \(ogsgen\.set_on_demand\(False\)\)"


@pytest.mark.parametrize("strict", [_strict_by_variable, _strict_by_call])
def test_strict_mode_refuses_a_variant_not_built(isolated_loader, tmp_path, monkeypatch, strict):
    how = strict(monkeypatch)
    with pytest.raises(ogsgen.VariantNotBuiltError) as info:
        isolated_loader.kernel_for(BETAS)
    message = str(info.value)
    assert BETAS_VARIANT in message and "ogsgen build --spec CATALOG.py --out DIR" in message
    assert "add KernelVariant(FP16, FP16, FP16, bias=True, betas=True) to a catalog's VARIANTS" in message
    assert re.search(how, message), message
    assert not (tmp_path / "cache").exists()


def test_strict_mode_still_loads_built_variants(isolated_loader, monkeypatch):
    monkeypatch.setenv("OGSGEN_ON_DEMAND", "0")
    kernel = isolated_loader.kernel_for(KernelVariant(BF16, BF16, BF16))
    assert Path(kernel.fn.__code__.co_filename).parent == isolated_loader.data_dir("generated")


@pytest.mark.parametrize("value", ["true", "yes", "2", " 1", "off"])
def test_other_values_of_the_variable_are_refused(isolated_loader, monkeypatch, value):
    monkeypatch.setenv("OGSGEN_ON_DEMAND", value)
    with pytest.raises(ogsgen.SpecError) as info:
        isolated_loader.kernel_for(KernelVariant(BF16, BF16, BF16))  # (built: the setting is checked anyway)
    message = str(info.value)
    assert f"OGSGEN_ON_DEMAND={value!r}" in message and "'0'" in message and "'1'" in message, message


def _a_file(cache):
    cache.write_text("not a folder\n")
    return "Not a directory"


def _read_only(cache):
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only folders")
    cache.mkdir()
    cache.chmod(0o555)
    return "Permission denied"


def _a_fifo_in_place_of_the_kernel(cache):
    (cache / ogsgen.__version__).mkdir(parents=True)
    os.mkfifo(cache / ogsgen.__version__ / f"{BETAS_VARIANT}.py")
    return f"{BETAS_VARIANT}.py there is a FIFO"


@pytest.mark.parametrize("make_unwritable", [_a_file, _read_only, _a_fifo_in_place_of_the_kernel])
def test_unwritable_cache_renders_in_memory_with_one_warning(isolated_loader, tmp_path, device, caplog,
                                                             make_unwritable):
    why = make_unwritable(tmp_path / "cache")
    with caplog.at_level("INFO", logger="ogsgen"):
        _betas_call(device)  # (against matmul_ogs_torch)
        kernel = isolated_loader.kernel_for(BF16_BETAS)  # a second variant: no second warning
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "OGSGEN_CACHE_DIR" in warnings[0] and str(isolated_loader.cache_dir()) in warnings[0]
    assert why in warnings[0] and "run from memory" in warnings[0]
    assert inspect.getsource(kernel.fn) in render_variant(BF16_BETAS, "ogsgen:on-demand").source
    # What the cache path holds, if anything, is not the render: no module names it (hypothesis, which reads the
    # files of sys.modules, would block on the FIFO).
    assert isolated_loader.kernel_for(BETAS).fn.__code__.co_filename == f"<ogsgen {BETAS_VARIANT}, rendered in memory>"
    path = str(isolated_loader.cache_dir() / f"{BETAS_VARIANT}.py")
    assert path not in {getattr(module, "__file__", None) for module in list(sys.modules.values())}
