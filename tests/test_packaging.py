"""Packaging: the wheel ships templates/ and generated/ inside the package, and pyproject lists every subpackage.

The install itself (a fresh environment with only the wheel and its declared dependencies, the README's build
commands and one matmul) is .ci/fresh_install.sh, which CI runs: it downloads the dependencies, too slow here."""
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from ogsgen.codegen.build import LOCK

ROOT = Path(__file__).resolve().parent.parent


def test_every_subpackage_is_listed_in_pyproject():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "ogsgen").rglob("__init__.py")}
    assert on_disk <= listed, f"add {sorted(on_disk - listed)} to [tool.setuptools] packages in pyproject.toml"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """ogsgen's wheel, built from a copy of the checkout whose generated/ holds the lock `ogsgen build` leaves."""
    pytest.importorskip("setuptools")  # builds here without downloading a build environment
    tmp_path = tmp_path_factory.mktemp("wheel")
    source = tmp_path / "src"
    for folder in ("ogsgen", "templates", "generated"):
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source)
    (source / "generated" / LOCK).touch()
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(tmp_path / "dist"), str(source)], check=True, cwd=tmp_path)
    wheel, = (tmp_path / "dist").glob("ogsgen-*.whl")
    return wheel, source


def test_wheel_ships_the_data_folders(wheel):
    wheel, source = wheel
    names = zipfile.ZipFile(wheel).namelist()

    def shipped(folder):
        return {name.removeprefix(f"ogsgen/{folder}/") for name in names if name.startswith(f"ogsgen/{folder}/")}

    templates = {p.name for p in (source / "templates").glob("*.jinja")}
    assert templates and shipped("templates") == templates
    assert shipped("generated") == {p.name for p in (source / "generated").glob("*.py")} | {"manifest.json"}


@pytest.mark.slow
def test_build_in_an_installed_package_checks_and_writes_nothing(wheel, tmp_path):
    # `pip install .` then `ogsgen build`: a file written into the package's generated/ (a build's lock) is not in
    # pip's record of the install, so a later `pip install -e .` left the folder behind, and `import ogsgen` found
    # that empty leftover instead of the editable checkout.
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site),
                    str(wheel[0])], check=True)
    package = site / "ogsgen" / "generated"
    before = sorted(p.name for p in package.iterdir())
    env = {**os.environ, "PYTHONPATH": str(site)}

    def ogsgen_build(*flags):
        return subprocess.run([sys.executable, "-m", "ogsgen", "build", *flags], env=env, cwd=tmp_path,
                              capture_output=True, text=True)

    done = ogsgen_build()
    assert done.returncode == 0, done.stderr
    assert f"ogsgen build: {package} is up to date (" in done.stdout and "only checked them" in done.stdout
    refused = ogsgen_build("--out", str(package))
    assert refused.returncode == 2 and "is the installed ogsgen's generated/ folder" in refused.stderr, refused.stderr
    assert sorted(p.name for p in package.iterdir()) == before
    (package / next(p for p in before if p.endswith(".py"))).write_text("# edited\n")
    stale = ogsgen_build()
    assert stale.returncode == 1 and "reinstall ogsgen" in stale.stdout, stale.stdout


def test_build_lock_and_the_readmes_build_folders_stay_out_of_git():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    readme = (ROOT / "README.md").read_text()
    folders = re.findall(r"ogsgen build [^\n]*--out (\S+)", "".join(re.findall(r"```bash\n(.*?)```", readme,
                                                                             flags=re.S)))
    assert folders, "the README's commands build into no --out folder"
    for path in [f"generated/{LOCK}", *(f"{folder}/manifest.json" for folder in folders)]:
        ignored = subprocess.run(["git", "check-ignore", "--quiet", path], cwd=ROOT).returncode == 0
        assert ignored, f"add {path} to .gitignore: the README's commands leave it in the checkout"
