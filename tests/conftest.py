"""Test set-up: without a GPU, kernels run through Triton's CPU interpreter (with its known defects corrected,
ogsgen.numerics.interpreter); with one, the same tests run on the GPU."""
import contextlib
import os
import shutil
import tempfile
import time
import zlib
from pathlib import Path

import pytest
import torch
from filelock import FileLock, Timeout

HAS_CUDA = torch.cuda.is_available()
_GPU_MEMORY_LOCK = Path(tempfile.gettempdir()) / "ogsgen-tests-large-gpu-memory.lock"
_GPU_MEMORY_SLOTS = 2  # an 80 GB card: tests of up to about 35 GB two at a time (larger ones: whole_card=True)
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

if os.environ.get("TRITON_INTERPRET") == "1":
    # ogsgen's pytest plugin has done this where ogsgen is installed; a checkout on PYTHONPATH has no plugin.
    from ogsgen.testing import install_interpreter_fixes

    install_interpreter_fixes()


def pytest_configure(config):
    # Kernels missing from the catalog are rendered on first use into OGSGEN_CACHE_DIR (wgmma verdicts are kept there
    # too): unless the environment names a folder, a temporary one, never the user's ~/.cache/ogsgen. Set before
    # collection; xdist's workers and the tests' subprocesses inherit it (workers find it set and share it).
    if not os.environ.get("OGSGEN_CACHE_DIR"):
        folder = tempfile.mkdtemp(prefix="ogsgen-test-cache-")
        os.environ["OGSGEN_CACHE_DIR"] = folder

        def remove_it():
            os.environ.pop("OGSGEN_CACHE_DIR", None)
            shutil.rmtree(folder, ignore_errors=True)

        config.add_cleanup(remove_it)


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@contextlib.contextmanager
def _gpu_memory_turn(marker):
    slots = [FileLock(f"{_GPU_MEMORY_LOCK}.{i}") for i in range(_GPU_MEMORY_SLOTS)]
    with contextlib.ExitStack() as held:
        if marker.kwargs.get("whole_card"):
            for slot in slots:
                held.enter_context(slot)
        else:  # whichever slot is free first
            while not any(_try_to_hold(slot, held) for slot in slots):
                time.sleep(0.2)
        yield


def _try_to_hold(slot, held) -> bool:
    try:
        slot.acquire(timeout=0)
    except Timeout:
        return False
    held.callback(slot.release)
    return True


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_makereport(item, call):
    # The peak of torch's GPU cache while the test ran (reset by _gpu_memory), in its report: the gate's log records it.
    if HAS_CUDA and call.when == "call":
        item.user_properties.append(("peak_gib", round(torch.cuda.max_memory_reserved() / 2**30, 2)))


@pytest.fixture(autouse=True)
def _gpu_memory(request):
    """On a GPU, tests marked large_gpu_memory share the card in turns: each holds one of its slots (file locks
    shared by every pytest process on the machine: xdist workers, the gate's fuzzers), or all of them when marked
    ``whole_card=True``; a test that leaves more than 2 GiB in torch's cache returns it, so that the gate's processes
    share one card."""
    if not HAS_CUDA:
        yield
        return
    marker = request.node.get_closest_marker("large_gpu_memory")
    torch.cuda.reset_peak_memory_stats()
    with _gpu_memory_turn(marker) if marker else contextlib.nullcontext():
        yield
    if torch.cuda.memory_reserved() > 2 << 30:
        torch.cuda.empty_cache()


@pytest.fixture
def device():
    return "cuda" if HAS_CUDA else "cpu"


@pytest.fixture(autouse=True)
def _fresh_seed(request):
    # Fresh random inputs per case, reproducible from the test id.
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture(autouse=True)
def _no_plans_across_tests():
    # A launch plan records what the checked path decided, which tests change by monkeypatching its parts.
    from ogsgen.runtime import plans
    plans.clear()
    yield
    plans.clear()


@pytest.fixture(scope="session")
def y_acc_in_kernels(tmp_path_factory):
    """The dense fp16 variant with y_acc_in (not in the default catalog), built and on the search path."""
    import ogsgen
    from ogsgen.codegen import build
    from ogsgen.spec import FP16, Catalog, KernelVariant
    from ogsgen.spec.catalog import _expand

    out = tmp_path_factory.mktemp("y_acc_in_kernels")
    build(Catalog("y_acc_in", _expand([KernelVariant(FP16, FP16, FP16, y_acc_in=True)], "y_acc_in")), out)
    ogsgen.add_search_path(out)


@pytest.fixture(scope="module")
def kernels_on_demand(tmp_path_factory):
    """Every variant a module's calls need, rendered on demand into a temporary cache (not the repository)."""
    import ogsgen
    from ogsgen.runtime import loader

    old_cache, old_on_demand = os.environ.get("OGSGEN_CACHE_DIR"), loader._on_demand
    os.environ["OGSGEN_CACHE_DIR"] = str(tmp_path_factory.mktemp("kernels_on_demand"))
    ogsgen.set_on_demand(True)
    yield
    loader._on_demand = old_on_demand
    if old_cache is None:
        os.environ.pop("OGSGEN_CACHE_DIR", None)
    else:
        os.environ["OGSGEN_CACHE_DIR"] = old_cache


@pytest.fixture
def serve_wheel(monkeypatch):
    """``serve_wheel(script, wheel)``: the fetch script's ``pip download`` (its ``subprocess.run``) places ``wheel``
    instead; returns the list of the commands it is given."""
    def serve(script, wheel):
        downloads = []

        def pip_download(command, check):
            downloads.append(command)
            shutil.copy(wheel, command[command.index("--dest") + 1])
        monkeypatch.setattr(script.subprocess, "run", pip_download)
        return downloads
    return serve


@pytest.fixture(params=["hopper", "strided"])
def default_layout(request, monkeypatch):
    """The mxfp4 layouts ogsgen.compat's default helpers pick: the hopper ones (a GPU with wgmma) or the strided
    ones."""
    import ogsgen
    from ogsgen.compat import _tensor

    if HAS_CUDA and request.param == "hopper" and not ogsgen.devices.target().wgmma:
        pytest.skip("the hopper layouts need a GPU with wgmma")
    monkeypatch.setattr(_tensor, "_hopper_layouts_wanted", lambda: request.param == "hopper")
    return request.param


@pytest.fixture
def host_checks(monkeypatch):
    """The routing checks that read routing data back to the host, on a GPU too (there they run only with
    OGSGEN_DEBUG=1; on the CPU always): a test of refused routing expects their SpecError. Without them a GPU catches
    bad expert ids and histograms by device asserts, which end the process (ogsgen.moe.checks)."""
    from ogsgen.moe import checks

    monkeypatch.setattr(checks, "DEBUG", True)
