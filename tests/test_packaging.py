"""A non-editable install ships templates/ and generated/ inside the package, and the runtime finds them."""
import os
import site
import subprocess
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

CHECK = """
import os, sys
os.environ.setdefault("TRITON_INTERPRET", "1")
import torch, ogsgen
from ogsgen._resources import data_dir
site = sys.argv[1]
assert str(data_dir("templates")).startswith(site), data_dir("templates")
assert str(data_dir("generated")).startswith(site), data_dir("generated")
x, w = torch.randn(5, 16, dtype=torch.float16), torch.randn(16, 8, dtype=torch.float16)
y = ogsgen.matmul_ogs(x, w, None)
torch.testing.assert_close(y.float(), x.float() @ w.float(), atol=2e-2, rtol=1e-2)
print("installed ogsgen", ogsgen.__version__, "ok")
"""


def test_wheel_install_in_fresh_venv(tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    # torch/triton/jinja2 come from this test's environment through plain path entries (no download of
    # a multi-GB torch); those do not run that environment's .pth files, so an editable ogsgen there
    # stays invisible and ogsgen must come from the fresh install.
    venv_site = subprocess.run([python, "-c", "import site; print(site.getsitepackages()[0])"], check=True,
                               capture_output=True, text=True).stdout.strip()
    Path(venv_site, "parent_env.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    clean_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-deps", str(ROOT)],
                   check=True, cwd=tmp_path, env=clean_env)
    package_dir = subprocess.run([python, "-c", "import ogsgen, os; print(os.path.dirname(ogsgen.__file__))"],
                          check=True, cwd=tmp_path, env=clean_env, capture_output=True, text=True).stdout.strip()
    assert package_dir.startswith(str(env_dir)), package_dir
    assert sorted(p.name for p in Path(package_dir, "templates").iterdir()) == sorted(
        p.name for p in (ROOT / "templates").iterdir())
    assert (Path(package_dir) / "generated" / "manifest.json").is_file()
    ogsgen = env_dir / "bin" / "ogsgen"
    result = subprocess.run([ogsgen, "build", "--check"], cwd=tmp_path, env=clean_env, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    result = subprocess.run([python, "-c", CHECK, str(env_dir)], cwd=tmp_path, env=clean_env, capture_output=True,
                            text=True)
    assert result.returncode == 0 and "ok" in result.stdout, result.stdout + result.stderr


def test_every_subpackage_is_listed_in_pyproject():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "ogsgen").rglob("__init__.py")}
    assert on_disk <= listed, f"add {sorted(on_disk - listed)} to [tool.setuptools] packages in pyproject.toml"
