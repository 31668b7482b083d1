"""The README's custom-activation example builds and runs as written."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "custom_activation.py"


def test_readme_shows_the_example_verbatim():
    assert EXAMPLE.read_text() in (ROOT / "README.md").read_text()


def test_example_builds_and_runs(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if "cuda" not in subprocess.run([sys.executable, "-c", "import torch; print('cuda' if torch.cuda.is_available() "
                                     "else '')"], capture_output=True, text=True, env=env).stdout:
        env["TRITON_INTERPRET"] = "1"
    out = tmp_path / "my_kernels"
    subprocess.run([sys.executable, "-m", "ogsgen", "build", "--spec", str(EXAMPLE), "--out", str(out)], check=True,
                   env=env, cwd=tmp_path)
    result = subprocess.run([sys.executable, str(EXAMPLE), str(out)], env=env, cwd=tmp_path, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr
    assert "matches torch" in result.stdout
