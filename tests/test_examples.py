"""The README's examples build and run as written."""
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def _env():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"
    return env


def test_readme_shows_the_examples_verbatim():
    readme = (ROOT / "README.md").read_text()
    for example in ("custom_activation.py", "moe_layer.py"):
        assert (EXAMPLES / example).read_text() in readme, example


def test_custom_activation_example(tmp_path):
    out = tmp_path / "my_kernels"
    subprocess.run([sys.executable, "-m", "ogsgen", "build", "--spec", str(EXAMPLES / "custom_activation.py"),
                    "--out", str(out)], check=True, env=_env(), cwd=tmp_path)
    result = subprocess.run([sys.executable, str(EXAMPLES / "custom_activation.py"), str(out)], env=_env(),
                            cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "matches torch" in result.stdout


def test_moe_layer_example(tmp_path):
    result = subprocess.run([sys.executable, str(EXAMPLES / "moe_layer.py")], env=_env(), cwd=tmp_path,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "MoE layer matches torch" in result.stdout


def test_custom_epilogue_example(tmp_path):
    out = tmp_path / "my_epilogue_kernels"
    subprocess.run([sys.executable, "-m", "ogsgen", "build", "-q", "--spec", str(EXAMPLES / "custom_epilogue.py"),
                    "--out", str(out)], check=True, env=_env(), cwd=tmp_path)
    result = subprocess.run([sys.executable, str(EXAMPLES / "custom_epilogue.py"), str(out)], env=_env(),
                            cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "matches torch (dense and top-2 MoE)" in result.stdout
