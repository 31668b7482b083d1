"""Packaging: the wheel ships templates/ and generated/ inside the package, and pyproject lists every subpackage.

The install itself (a fresh environment with only the wheel and its declared dependencies, the README's build
commands and one matmul) is .ci/fresh_install.sh, which CI runs: it downloads the dependencies, too slow here."""
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


def test_wheel_ships_the_data_folders(tmp_path):
    pytest.importorskip("setuptools")  # builds here without downloading a build environment
    source = tmp_path / "src"
    for folder in ("ogsgen", "templates", "generated"):
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source)
    (source / "generated" / LOCK).touch()  # what `ogsgen build` leaves there
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(tmp_path / "dist"), str(source)], check=True, cwd=tmp_path)
    wheel, = (tmp_path / "dist").glob("ogsgen-*.whl")
    names = zipfile.ZipFile(wheel).namelist()

    def shipped(folder):
        return {name.removeprefix(f"ogsgen/{folder}/") for name in names if name.startswith(f"ogsgen/{folder}/")}

    templates = {p.name for p in (source / "templates").glob("*.jinja")}
    assert templates and shipped("templates") == templates
    assert shipped("generated") == {p.name for p in (source / "generated").glob("*.py")} | {"manifest.json"}


def test_build_lock_stays_out_of_git():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    ignored = subprocess.run(["git", "check-ignore", "--quiet", f"generated/{LOCK}"], cwd=ROOT).returncode == 0
    assert ignored, f"add {LOCK} to .gitignore: `ogsgen build` leaves it in generated/"
