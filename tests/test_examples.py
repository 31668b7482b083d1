"""The README's first call and the examples build and run as written."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

# The examples run at their full sizes on a GPU (several GiB each): they take turns (tests/conftest.py).
pytestmark = pytest.mark.large_gpu_memory


def _env():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"
    return env


def _python_blocks(section: str) -> list[str]:
    """The python code blocks of a README section."""
    readme = (ROOT / "README.md").read_text()
    text = readme[readme.index(f"## {section}\n"):]
    text = text[:text.find("\n## ", 1)]
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


@pytest.mark.slow  # (a process: 8 s on a CPU)
def test_readme_first_call_runs(tmp_path):
    # The README's first call as written (on the CPU through the interpreter), then its results against torch.
    code, = _python_blocks("First call")
    check = """
from ogsgen.testing import assert_close
assert y.shape == (256, 192) and out.shape == (256, 512)
assert_close(ogsgen.matmul_ogs_torch(x.float(), w.float(), bias, fused_activation=swiglu), y.float())
h_ref = ogsgen.matmul_ogs_torch(x.float(), w1.float(), None, routing_data, gather_indx, fused_activation=swiglu)
assert_close(h_ref, h.float())
assert_close(ogsgen.matmul_ogs_torch(h.float(), w2.float(), None, routing_data, scatter_indx=scatter_indx,
                                     gammas=routing_data.gate_scal), out.float())
print("first call ok")
"""
    result = subprocess.run([sys.executable, "-c", code + check], env=_env(), cwd=tmp_path, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "first call ok" in result.stdout


def test_readme_commands_run_on_the_cpu_and_name_nothing_outside_the_repository():
    readme = (ROOT / "README.md").read_text()
    examples = [before.lstrip("`") for before in re.findall(r"(\S*) *python examples/", readme)]
    assert examples and set(examples) == {"TRITON_INTERPRET=1"}, examples  # (the examples launch kernels)
    assert "../" not in readme  # (links into docs/ are relative to the README)


def test_readme_activation_is_the_examples():
    code, = _python_blocks("Custom activations and epilogues")
    example = (EXAMPLES / "custom_activation.py").read_text()
    body = code[code.index("@triton.jit"):code.index("\n\n", code.index("@triton.jit"))]
    assert body in example, "the README's relu_squared differs from examples/custom_activation.py's"


def test_readme_activation_is_a_catalog_file_as_written(tmp_path):
    code, = _python_blocks("Custom activations and epilogues")
    (tmp_path / "my_catalog.py").write_text(code)
    result = subprocess.run([sys.executable, "-m", "ogsgen", "list", "--spec", "my_catalog.py"], env=_env(),
                            cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ogs_matmul_xbf16_wbf16_ybf16_bias_act_relu_squared" in result.stdout.split()


@pytest.mark.slow  # (these examples build or train in a subprocess: the quick subset stays under 3 minutes)
def test_custom_activation_example(tmp_path):
    out = tmp_path / "my_kernels"
    subprocess.run([sys.executable, "-m", "ogsgen", "build", "--spec", str(EXAMPLES / "custom_activation.py"),
                    "--out", str(out)], check=True, env=_env(), cwd=tmp_path)
    result = subprocess.run([sys.executable, str(EXAMPLES / "custom_activation.py"), str(out)], env=_env(),
                            cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "matches torch" in result.stdout


@pytest.mark.slow  # (a process: 4 s)
def test_moe_layer_example(tmp_path):
    result = subprocess.run([sys.executable, str(EXAMPLES / "moe_layer.py")], env=_env(), cwd=tmp_path,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "MoE layer matches torch" in result.stdout


@pytest.mark.slow  # (two ranks in subprocesses)
def test_expert_parallel_layer_example(tmp_path):
    """Two ranks (gloo on the CPU, or NCCL where two GPUs are) exchange tokens with all_to_all_single; each rank's
    printed difference against the one-process layer is within bf16's tolerance."""
    env = _env()
    if torch.cuda.device_count() < 2:  # (the example refuses two ranks on one GPU: its ranks take the CPU)
        env.update(CUDA_VISIBLE_DEVICES="", TRITON_INTERPRET="1")
    result = subprocess.run([sys.executable, str(EXAMPLES / "expert_parallel_layer.py"), "--world", "2"], env=env,
                            cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    diffs = dict(re.findall(r"^rank (\d+): max relative difference (\S+) against the one-process layer",
                            result.stdout, flags=re.M))
    assert sorted(diffs) == ["0", "1"], result.stdout
    assert all(float(diff) <= 2e-2 for diff in diffs.values()), result.stdout


@pytest.mark.slow
def test_mxfp8_moe_layer_example(tmp_path):
    result = subprocess.run([sys.executable, str(EXAMPLES / "mxfp8_moe_layer.py")], env=_env(), cwd=tmp_path,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "mxfp8 x mxfp4 MoE layer" in result.stdout and "matches torch" in result.stdout


def _table_rows(text: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| path")]


@pytest.mark.slow
def test_format_accuracy_example_and_the_docs_table(tmp_path):
    """The accuracy script at a small width: its errors in the order the formats imply, the table written between
    the markers of a markdown file, and docs/formats.md's table listing the script's paths (its numbers come from
    the script at its default width)."""
    doc = tmp_path / "formats.md"
    markers = (ROOT / "docs" / "formats.md").read_text()
    start = markers.index("<!-- format accuracy table")
    doc.write_text("before\n" + markers[start:markers.index("<!-- end of the format accuracy table -->", start)]
                   + "<!-- end of the format accuracy table -->\nafter\n")
    result = subprocess.run([sys.executable, str(EXAMPLES / "format_accuracy.py"), "--tokens", "16", "--hidden", "64",
                             "--experts", "4", "--top-k", "2", "--write", str(doc)],
                            env={**_env(), "OGSGEN_CACHE_DIR": str(tmp_path / "kernels")}, cwd=tmp_path,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {row[0]: [float(v) for v in row[4:]] for row in _table_rows(result.stdout)}
    assert len(rows) == 9
    bf16 = rows["bf16 x, bf16 w"]
    assert bf16[0] < 1e-2 and bf16[2] < 1e-2
    for name, (layer_rms, _, own_rms) in rows.items():
        if "mxfp4" in name:   # mxfp4 weights dominate the error
            assert layer_rms > 5 * bf16[0], name
        # bf16 x and h add bf16's rounding to the path's weights; mxfp8 and e4m3 x and h add e4m3's (3 mantissa bits)
        e4m3 = name.startswith(("mxfp8 x", "e4m3 x", "fp8e4m3_b128"))
        assert (1e-2 < own_rms < 1e-1) if e4m3 else own_rms < 1e-2, name
    written = doc.read_text()
    assert written.startswith("before\n") and written.endswith("after\n") and result.stdout.strip() in written
    documented = _table_rows((ROOT / "docs" / "formats.md").read_text()[start:])
    assert [row[:4] for row in documented] == [row[:4] for row in _table_rows(result.stdout)]


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["fp8e4m3_b128", "fp8e4m3_channel"])
def test_deepseek_fp8_layer_example(fmt, tmp_path):
    result = subprocess.run([sys.executable, str(EXAMPLES / "deepseek_fp8_layer.py"), "--format", fmt], env=_env(),
                            cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert f"{fmt} MoE layer" in result.stdout and "matches torch" in result.stdout


@pytest.mark.slow
def test_custom_epilogue_example(tmp_path):
    out = tmp_path / "my_epilogue_kernels"
    subprocess.run([sys.executable, "-m", "ogsgen", "build", "-q", "--spec", str(EXAMPLES / "custom_epilogue.py"),
                    "--out", str(out)], check=True, env=_env(), cwd=tmp_path)
    result = subprocess.run([sys.executable, str(EXAMPLES / "custom_epilogue.py"), str(out)], env=_env(),
                            cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "matches torch (dense and top-2 MoE)" in result.stdout


@pytest.mark.slow
def test_train_moe_example(tmp_path):
    result = subprocess.run([sys.executable, str(EXAMPLES / "train_moe.py")], env=_env(), cwd=tmp_path,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "training matches the torch reference" in result.stdout
