"""Build folders: manifests are validated when read, concurrent builds into one folder keep every entry, files
get the umask's mode, an --out that is a file or not writable is a clear error, and what a killed build left, FIFOs,
pathological manifests and a symlinked lock file are reported or refused."""
import json
import os
import stat
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest

import ogsgen
from ogsgen.cli import main
from ogsgen.codegen import build
from ogsgen.codegen.build import LOCK, MAX_FILE_BYTES
from ogsgen.spec import Catalog, default_catalog

A, B = "ogs_matmul_xbf16_wbf16_ybf16", "ogs_matmul_xfp16_wfp16_yfp16"


def _catalog(*names):
    by_name = default_catalog().by_name()
    return Catalog("small", tuple(by_name[n] for n in names))


def _edit_manifest(out: Path, edit) -> Path:
    path = out / "manifest.json"
    manifest = json.loads(path.read_text())
    edit(manifest["variants"])
    path.write_text(json.dumps(manifest))
    return path


@pytest.mark.parametrize("name,bad_path", [("ogs_gone", "../victim.py"), ("ogs_gone", "ABSOLUTE"),
                                           ("../victim", "../victim.py")])
def test_manifest_path_outside_the_folder_is_refused(tmp_path, name, bad_path):
    out, victim = tmp_path / "out", tmp_path / "victim.py"
    victim.write_text("keep me\n")
    build(_catalog(A), out)
    entry = {"path": str(victim) if bad_path == "ABSOLUTE" else bad_path, "sha256": "0" * 64}
    manifest = _edit_manifest(out, lambda variants: variants.update({name: entry}))
    with pytest.raises(ogsgen.BuildFolderError, match=f"{manifest}.*remove it and build again"):
        build(_catalog(A), out)  # a full build removes what the manifest lists and the catalog lacks
    assert victim.read_text() == "keep me\n"


@pytest.mark.parametrize("damage,problem", [
    (b"{", "not valid JSON"),
    (b"\xff\xfe{}", "not UTF-8"),
    (b"[]", "not a JSON object"),
    (b'{"schema": 2, "variants": {}}', "schema 2"),
    (b'{"schema": 1, "catalog": "c", "variants": []}', "'variants' is not an object"),
    ({A: f"{A}.py"}, f"entry {A!r} is not an object"),
    ({A: {"sha256": "0" * 64}}, f"entry {A!r} has no path"),
    ({A: {"path": f"sub/{A}.py", "sha256": "0" * 64}}, f"must be '{A}.py'"),
    ({A: {"path": f"{A}.py"}}, "sha256"),
])
def test_damaged_manifest_is_a_clear_error(tmp_path, damage, problem):
    out = tmp_path / "out"
    build(_catalog(A), out)
    if isinstance(damage, bytes):
        (out / "manifest.json").write_bytes(damage)
    else:
        _edit_manifest(out, lambda variants: variants.update(damage))
    with pytest.raises(ogsgen.BuildFolderError) as info:
        build(_catalog(B), out, only=B)  # a partial build merges what the manifest records
    message = str(info.value)
    assert str(out / "manifest.json") in message and problem in message and "remove it and build again" in message


def test_damaged_manifest_through_the_cli(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.json").write_text("{")
    assert main(["build", "--only", A, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{out / 'manifest.json'} is damaged" in err and "remove it and build again" in err


def test_concurrent_partial_builds_keep_every_entry(tmp_path):
    catalog = _catalog(A, B)
    lost = []
    with ThreadPoolExecutor(2) as pool:
        for i in range(30):
            out, start = tmp_path / str(i), threading.Barrier(2)

            def run(name):
                start.wait()
                build(catalog, out, only=name)

            for future in [pool.submit(run, A), pool.submit(run, B)]:
                future.result()
            recorded = json.loads((out / "manifest.json").read_text())["variants"]
            lost += [(i, name) for name in (A, B) if name not in recorded]
    assert not lost, f"manifest entries lost by concurrent builds: {lost}"


def test_files_get_the_umask_mode(tmp_path):
    out = tmp_path / "out"
    previous = os.umask(0o027)
    try:
        build(_catalog(A), out)
        (out / f"{A}.py").write_text("# edited\n")
        build(_catalog(A), out)  # rewrites the edited file
    finally:
        os.umask(previous)
    modes = {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in out.iterdir()}
    assert modes and set(modes.values()) == {"0o640"}, modes


@pytest.mark.parametrize("flags", [[], ["--dry-run"], ["--check"]])
def test_out_naming_a_file(tmp_path, capsys, flags):
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("mine\n")
    assert main(["build", "--only", A, "--out", str(not_a_folder), *flags]) == 2
    assert f"--out {not_a_folder} is a file, not a folder" in capsys.readouterr().err
    assert not_a_folder.read_text() == "mine\n"


@pytest.mark.parametrize("flags", [[], ["--dry-run"], ["--check"]])
def test_out_inside_a_file(tmp_path, capsys, flags):
    inside = tmp_path / "file" / "out"
    inside.parent.write_text("mine\n")
    assert main(["build", "--only", A, "--out", str(inside), *flags]) == 2
    assert f"--out {inside} is inside a file ({inside.parent})" in capsys.readouterr().err


@pytest.mark.parametrize("sub", ["", "new"])
def test_out_not_writable(tmp_path, capsys, sub):
    read_only = tmp_path / "ro"
    read_only.mkdir()
    read_only.chmod(0o555)
    try:
        try:
            (read_only / "probe").touch()
        except PermissionError:
            pass
        else:
            pytest.skip("this user writes into read-only folders (root with CAP_DAC_OVERRIDE)")
        out = read_only / sub if sub else read_only
        assert main(["build", "--only", A, "--out", str(out)]) == 2
    finally:
        read_only.chmod(0o755)
    err = capsys.readouterr().err
    assert f"--out {out}: cannot write" in err and "Permission denied" in err


def test_check_reports_and_build_removes_what_a_killed_build_left(tmp_path, capsys):
    out = tmp_path / "out"
    build(_catalog(A), out)
    killed = [out / f".{A}.py.0123456789abcdef.tmp", out / ".manifest.json.fedcba9876543210.tmp"]
    not_ours = [out / ".notes.tmp", out / f".{A}.py.backup.tmp", out / "mine.0123456789abcdef.tmp"]
    for path in killed + not_ours:
        path.write_text("half a file\n")
    assert main(["build", "--check", "--only", A, "--out", str(out)]) == 1
    printed = capsys.readouterr().out
    assert all(f"leftover: {path}\n" in printed for path in killed), printed
    assert not any(str(path) in printed for path in not_ours), printed
    assert main(["build", "--only", A, "--out", str(out)]) == 0
    assert not any(path.exists() for path in killed) and all(path.exists() for path in not_ours)
    assert main(["build", "--check", "--only", A, "--out", str(out)]) == 0


@contextmanager
def _fifo(path: Path):
    """A FIFO at ``path``; a reader that opened it blocking gets an end of file within a second or two, so that a test
    of code that would wait on it forever fails instead of hanging."""
    os.mkfifo(path)
    done = threading.Event()

    def release_readers():
        while not done.wait(1.0):
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:  # no reader waits (ENXIO)
                pass

    releaser = threading.Thread(target=release_readers, daemon=True)
    releaser.start()
    try:
        yield path
    finally:
        done.set()
        releaser.join()


def test_fifo_manifest_is_refused_at_once(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    with _fifo(out / "manifest.json") as fifo:
        with pytest.raises(ogsgen.BuildFolderError, match=f"{fifo} is damaged .*it is a FIFO, not a regular file; "
                                                          f"remove it and build again"):
            build(_catalog(A), out)


def test_fifo_kernel_file_is_refused_at_once(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    with _fifo(out / f"{A}.py") as fifo:
        with pytest.raises(ogsgen.BuildFolderError, match=f"{fifo} is a FIFO, not a regular file; remove it and "
                                                          f"build again"):
            build(_catalog(A), out)
        assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


@pytest.mark.parametrize("content,problem", [
    ("[" * 100_000 + "]" * 100_000, "JSON nested too deeply"),
    ('{"schema": ' + "9" * 5000 + "}", "not valid JSON"),  # beyond int()'s digit limit: a ValueError, not a JSONError
    (None, "larger than"),
])
def test_pathological_manifest_is_a_clear_error(tmp_path, content, problem):
    out = tmp_path / "out"
    out.mkdir()
    manifest = out / "manifest.json"
    if content is None:  # sparse: takes no disk
        with open(manifest, "wb") as f:
            f.truncate(MAX_FILE_BYTES + 1)
    else:
        manifest.write_text(content)
    with pytest.raises(ogsgen.BuildFolderError, match=f"{manifest} is damaged.*{problem}.*remove it and build again"):
        build(_catalog(A), out)


def test_symlinked_lock_file_is_refused(tmp_path):
    out, victim = tmp_path / "out", tmp_path / "victim"
    out.mkdir()
    victim.write_text("keep me\n")
    (out / LOCK).symlink_to(victim)
    with pytest.raises(ogsgen.BuildFolderError, match=f"{out / LOCK} is a symbolic link .*remove the link"):
        build(_catalog(A), out)
    assert victim.read_text() == "keep me\n" and not (out / "manifest.json").exists()
