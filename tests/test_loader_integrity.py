"""The loader executes only the bytes a build folder's manifest records (their sha256 is checked before anything
runs), shows Triton exactly those bytes, and checks on-demand files against a fresh render."""
import hashlib
import inspect
import json
import os
import stat
from pathlib import Path

import pytest

import ogsgen
from ogsgen.cli import main
from ogsgen.codegen.build import parse_manifest
from ogsgen.spec import BF16, FP16, KernelVariant, load_catalog_file
from test_cli_loader import CUSTOM_CATALOG, isolated_loader  # noqa: F401 (a fixture)

NAME = "ogs_matmul_xfp16_wfp16_yfp16"
VARIANT = KernelVariant(FP16, FP16, FP16)
EDIT = ("acc *= out_alpha", "acc *= -out_alpha")


def _built(tmp_path, *names):
    out = tmp_path / "build"
    for name in names or (NAME,):
        assert main(["build", "--only", name, "--out", str(out)]) == 0
    return out


def _edited(source: str) -> str:
    edited = source.replace(*EDIT, 1)
    assert edited != source, f"the kernel no longer contains {EDIT[0]!r}; pick another edit"
    return edited


def _refusal(loader, variant=VARIANT) -> str:
    with pytest.raises(ogsgen.StaleKernelError) as info:
        loader.kernel_for(variant)
    return str(info.value)


DAMAGES = {
    "edited": _edited,
    # Still parses: the file ends before the persistent kernel.
    "truncated_at_a_line": lambda s: s[:s.index("\n@triton.jit", s.index("\ndef ")) + 1],
    "truncated_mid_line": lambda s: s[:s.index("acc *= out_alpha") + 5],
    "empty": lambda s: "",
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_damaged_kernel_file_is_refused(isolated_loader, tmp_path, monkeypatch, damage):
    out = _built(tmp_path)
    path = out / f"{NAME}.py"
    path.write_text(DAMAGES[damage](path.read_text()))
    monkeypatch.setenv("OGSGEN_PATH", str(out))
    message = _refusal(isolated_loader)
    assert f"{path} does not match the sha256 {out / 'manifest.json'} records" in message
    assert f"`ogsgen build --out {out} --only {NAME}`" in message


def _announcing_kernel(marker):
    return f"import pathlib\npathlib.Path({str(marker)!r}).write_text('executed')\n"


@pytest.mark.parametrize("manifest", ["none", "without_the_variant", "damaged"])
def test_file_the_manifest_does_not_vouch_for_never_runs(isolated_loader, tmp_path, monkeypatch, manifest):
    folder = _built(tmp_path, "ogs_matmul_xbf16_wbf16_ybf16") if manifest != "none" else tmp_path / "planted"
    folder.mkdir(exist_ok=True)
    if manifest == "damaged":
        (folder / "manifest.json").write_text("{")
    marker = tmp_path / "marker"
    (folder / f"{NAME}.py").write_text(_announcing_kernel(marker))
    monkeypatch.setenv("OGSGEN_PATH", str(folder))
    message = _refusal(isolated_loader)
    assert not marker.exists(), "the loader executed a file before verifying it"
    assert str(folder / f"{NAME}.py") in message and f"ogsgen build --out {folder} --only {NAME}" in message
    expected = {"none": f"has no {folder / 'manifest.json'}",
                "without_the_variant": f"{folder / 'manifest.json'} records no variant {NAME}",
                "damaged": f"{folder / 'manifest.json'} is damaged"}[manifest]
    assert expected in message


def test_rebuild_command_names_the_user_catalog(isolated_loader, tmp_path):
    name = "ogs_matmul_xbf16_wbf16_ybf16_bias_act_leaky_scaled"
    out = tmp_path / "build"
    assert main(["build", "--spec", str(CUSTOM_CATALOG), "--only", name, "--out", str(out)]) == 0
    (out / f"{name}.py").write_text(_edited((out / f"{name}.py").read_text()))
    ogsgen.add_search_path(out)
    message = _refusal(isolated_loader, load_catalog_file(CUSTOM_CATALOG).by_name()[name])
    assert f"`ogsgen build --out {out} --only {name} --spec custom_catalog.py`" in message


def test_rebuild_command_of_the_package_folder(isolated_loader, tmp_path, monkeypatch):
    out = _built(tmp_path)
    (out / f"{NAME}.py").write_text(_edited((out / f"{NAME}.py").read_text()))
    monkeypatch.setattr(isolated_loader, "data_dir", lambda name: out)  # stands for the package's generated/
    assert "rebuild it with `ogsgen build`," in _refusal(isolated_loader)


def test_triton_sees_the_verified_source(isolated_loader, tmp_path, monkeypatch):
    out = _built(tmp_path)
    path = out / f"{NAME}.py"
    original = path.read_text()
    monkeypatch.setenv("OGSGEN_PATH", str(out))
    kernel = isolated_loader.kernel_for(VARIANT)
    path.write_text(_edited(original))  # after the load: the source Triton reads must not follow the file
    assert inspect.getsource(kernel.fn) in original and EDIT[1] not in inspect.getsource(kernel.fn)


def test_the_bytes_verified_are_the_bytes_executed(isolated_loader, tmp_path, monkeypatch):
    out = _built(tmp_path)
    path = out / f"{NAME}.py"
    original = path.read_text()
    manifest = isolated_loader._manifest

    def racing_writer(directory, *filename):  # changes the file after the loader read it, before it runs
        path.write_text(_edited(original))
        return manifest(directory, *filename)

    monkeypatch.setattr(isolated_loader, "_manifest", racing_writer)
    monkeypatch.setenv("OGSGEN_PATH", str(out))
    kernel = isolated_loader.kernel_for(VARIANT)
    assert EDIT[0] in inspect.getsource(kernel.fn) and EDIT[1] not in inspect.getsource(kernel.fn)


def test_manifest_is_read_once_per_version(isolated_loader, tmp_path, monkeypatch):
    out = _built(tmp_path, NAME, "ogs_matmul_xbf16_wbf16_ybf16")
    reads = []
    monkeypatch.setattr(isolated_loader, "parse_manifest",
                        lambda path, data: reads.append(path) or parse_manifest(path, data))
    monkeypatch.setenv("OGSGEN_PATH", str(out))
    isolated_loader.kernel_for(VARIANT)
    isolated_loader.kernel_for(KernelVariant(BF16, BF16, BF16))
    manifest = out / "manifest.json"
    assert reads == [manifest]
    _built(tmp_path, "ogs_matmul_xbf16_wbf16_ybf16_bias")  # rewrites the manifest
    isolated_loader.kernel_for(KernelVariant(BF16, BF16, BF16, bias=True))
    assert reads == [manifest, manifest]
    manifest.chmod(0o600)  # a chmod changes what the trust check said: read again
    isolated_loader._kernels.clear()
    isolated_loader.kernel_for(VARIANT)
    assert reads == [manifest] * 3


def test_on_demand_file_is_checked_against_the_render(isolated_loader, tmp_path):
    variant = KernelVariant(FP16, FP16, FP16, bias=True, betas=True)  # in no catalog
    ogsgen.set_on_demand(True)
    isolated_loader.kernel_for(variant)
    path, = (tmp_path / "cache").rglob("*.py")
    rendered = path.read_text()
    path.write_text(_edited(rendered))
    isolated_loader._kernels.clear()  # as a new process would
    isolated_loader._modules_by_sha.clear()
    kernel = isolated_loader.kernel_for(variant)
    assert EDIT[1] not in inspect.getsource(kernel.fn) and path.read_text() == rendered


def test_fifo_kernel_file_is_refused_not_skipped(isolated_loader, tmp_path, monkeypatch):
    out = _built(tmp_path)
    path = out / f"{NAME}.py"
    path.unlink()
    os.mkfifo(path)
    monkeypatch.setenv("OGSGEN_PATH", str(out))
    assert (f"{path} is a FIFO, not a regular file; rebuild it with `ogsgen build --out {out} --only {NAME}"
            in _refusal(isolated_loader))


def test_deeply_nested_manifest_is_refused(isolated_loader, tmp_path, monkeypatch):
    out = _built(tmp_path)
    (out / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    monkeypatch.setenv("OGSGEN_PATH", str(out))
    message = _refusal(isolated_loader)
    assert f"{out / 'manifest.json'} is damaged" in message and "JSON nested too deeply" in message


def _plant(folder: Path, marker: Path) -> None:
    """Replace the folder's kernel by one that announces its run, and record its sha256 in the manifest, as whoever
    can write the folder can."""
    path = folder / f"{NAME}.py"
    path.write_text(_announcing_kernel(marker))
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["variants"][NAME]["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (folder / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("what,mode,who", [("folder", 0o777, "its group and everyone"), ("folder", 0o775, "its group"),
                                           ("manifest", 0o646, "everyone"), ("kernel", 0o664, "its group")])
def test_what_others_can_write_never_runs(isolated_loader, tmp_path, monkeypatch, what, mode, who):
    out, marker = _built(tmp_path), tmp_path / "marker"
    _plant(out, marker)
    path = {"folder": out, "manifest": out / "manifest.json", "kernel": out / f"{NAME}.py"}[what]
    path.chmod(mode)
    monkeypatch.setenv("OGSGEN_PATH", str(out))
    with pytest.raises(isolated_loader.UntrustedFolderError) as info:
        isolated_loader.kernel_for(VARIANT)
    assert not marker.exists(), "the loader executed a file others could have written"
    assert f"{path} is writable by {who}" in str(info.value) and f"`chmod go-w {path}`" in str(info.value)
    path.chmod(mode & ~0o022)  # the fix the message gives: the file is the user's own now, and its hash matches
    with pytest.raises(ogsgen.StaleKernelError, match="is stale"):  # (it runs, then lacks the kernel's provenance)
        isolated_loader.kernel_for(VARIANT)
    assert marker.exists()


@pytest.mark.parametrize("what", ["folder", "manifest", "kernel"])
def test_what_another_user_owns_never_runs(isolated_loader, tmp_path, monkeypatch, what):
    out, marker = _built(tmp_path), tmp_path / "marker"
    _plant(out, marker)
    path = {"folder": out, "manifest": out / "manifest.json", "kernel": out / f"{NAME}.py"}[what]
    try:
        os.chown(path, 65534, -1)  # nobody
    except PermissionError:
        pytest.skip("only root can give a file to another user")
    monkeypatch.setenv("OGSGEN_PATH", str(out))
    with pytest.raises(isolated_loader.UntrustedFolderError, match=f"{path} belongs to user id 65534, neither you "
                                                                   f"nor root"):
        isolated_loader.kernel_for(VARIANT)
    assert not marker.exists()


def test_package_folder_is_refused_only_when_everyone_can_write_it(isolated_loader, tmp_path, monkeypatch):
    # A group-writable install (a shared environment) is a normal one; a world-writable one is not.
    out = _built(tmp_path)
    monkeypatch.setattr(isolated_loader, "data_dir", lambda name: out)  # stands for the package's generated/
    out.chmod(0o775)
    assert isolated_loader.kernel_for(VARIANT).__name__ == NAME
    out.chmod(0o777)
    isolated_loader._kernels.clear()
    with pytest.raises(isolated_loader.UntrustedFolderError, match=f"{out} is writable by everyone"):
        isolated_loader.kernel_for(VARIANT)


def test_build_under_umask_002_is_trusted(isolated_loader, tmp_path, monkeypatch):
    # Where users have their own group (umask 002), files would be group-writable: a build writes none such.
    previous = os.umask(0o002)
    try:
        out = _built(tmp_path)
    finally:
        os.umask(previous)
    written = [out, out / "manifest.json", out / f"{NAME}.py"]
    assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in written} == {"0o755", "0o644"}
    monkeypatch.setenv("OGSGEN_PATH", str(out))
    assert isolated_loader.kernel_for(VARIANT).__name__ == NAME
