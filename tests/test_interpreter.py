"""Triton's CPU interpreter, corrected: ogsgen's own calls, a user's script and a user's pytest session compute on
the CPU what the GPU computes (bf16 dots, fp32 -> bf16 rounding), and an uncorrected interpreter is never silent."""
import os
import subprocess
import sys
import textwrap
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

import ogsgen
from ogsgen.testing import assert_close

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU interpreter's behaviour")

# A fresh process (no test harness): a plain bf16 matmul, then one with a bf16 output of a rounding-sensitive value.
USER_SCRIPT = textwrap.dedent("""
    import torch, ogsgen
    from ogsgen.testing import assert_close
    x = torch.randn(64, 96, dtype=torch.bfloat16)
    w = torch.randn(96, 80, dtype=torch.bfloat16)
    y = ogsgen.matmul_ogs(x, w, None)
    ref = (x.float() @ w.float()).bfloat16()
    assert_close(ref, y, maxtol=1e-2, rmstol=1e-3)
    y = ogsgen.matmul_ogs(x, w, None)  # the replayed plan, too
    assert_close(ref, y, maxtol=1e-2, rmstol=1e-3)
    print("rounded like torch:", (y == ref).float().mean().item())
""")


def _python(code: str, cwd, **env):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1", **env})


@pytest.mark.slow  # (a process: 4 s)
def test_a_users_bf16_script_is_correct_on_the_cpu(tmp_path):
    result = _python(USER_SCRIPT, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert float(result.stdout.split(":")[-1]) > 0.99  # ties and fp32 summation order aside, torch's rounding
    assert "RuntimeWarning" not in result.stderr


@pytest.mark.slow  # (a fresh process: 5 s)
def test_triton_interpret_set_after_the_kernels_were_made_is_a_clear_error(tmp_path):
    # A notebook's sequence: a call on the CPU without the interpreter is refused, naming TRITON_INTERPRET; setting it
    # then (after Triton made ogsgen's functions, for a GPU) must say why that is too late, not fail in the
    # interpreter. Set before the imports, the same call runs.
    script = textwrap.dedent("""
        import os, torch, triton, ogsgen
        x, w = torch.randn(16, 32), torch.randn(32, 8)
        for step in ("before", "after"):
            try:
                ogsgen.matmul_ogs(x, w, None)
            except ogsgen.OgsgenError as exc:
                print(step, type(exc).__name__, exc)
            os.environ["TRITON_INTERPRET"] = "1"
    """)
    result = _python(script, tmp_path, TRITON_INTERPRET="0")
    assert result.returncode == 0, result.stderr[-3000:]
    before, after = result.stdout.splitlines()
    assert before.startswith("before SpecError x is on cpu") and "TRITON_INTERPRET=1, set before triton" in before
    assert after.startswith("after SpecError TRITON_INTERPRET=1 was set after ogsgen's Triton functions were made")
    assert "in the first cell" in after
    script = "import torch, ogsgen\nx, w = torch.randn(16, 32), torch.randn(32, 8)\n" \
             "print((ogsgen.matmul_ogs(x, w, None) - x @ w).abs().max().item())\n"
    result = _python(script, tmp_path)
    assert result.returncode == 0 and float(result.stdout) < 1e-4, result.stderr[-3000:]


@pytest.mark.slow
def test_an_uncorrected_interpreter_warns_once(tmp_path):
    script = textwrap.dedent("""
        import torch, ogsgen
        for rows in (64, 32):  # two signatures: two checked calls, one warning
            x, w = torch.randn(rows, 96, dtype=torch.bfloat16), torch.randn(96, 80, dtype=torch.bfloat16)
            y = ogsgen.matmul_ogs(x, w, None)
            print((y.float() - x.float() @ w.float()).abs().max().item())
    """)
    result = _python(script, tmp_path, OGSGEN_INTERPRETER_FIXES="0")
    assert result.returncode == 0, result.stderr[-3000:]
    assert max(float(v) for v in result.stdout.split()) > 1e3  # the uncorrected results are wrong...
    assert result.stderr.count("OGSGEN_INTERPRETER_FIXES=0 keeps it uncorrected") == 1, result.stderr  # ...and said
    assert "<string>:5: RuntimeWarning" in result.stderr  # at the caller's line (the matmul_ogs call)


# A user's own kernel, tested with pytest: the plugin corrects the interpreter before the test runs.
USER_TEST = textwrap.dedent("""
    import torch, triton, triton.language as tl

    @triton.jit
    def bf16_matmul(X, W, Y, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
        m, n, k = tl.arange(0, M), tl.arange(0, N), tl.arange(0, K)
        x = tl.load(X + m[:, None] * K + k[None, :])
        w = tl.load(W + k[:, None] * N + n[None, :])
        tl.store(Y + m[:, None] * N + n[None, :], tl.dot(x, w).to(tl.bfloat16))

    def test_my_kernel():
        x, w = torch.randn(16, 32).bfloat16(), torch.randn(32, 16).bfloat16()
        y = torch.empty(16, 16, dtype=torch.bfloat16)
        bf16_matmul[(1,)](x, w, y, 16, 16, 32)
        ref = (x.float() @ w.float()).bfloat16()
        assert (y.float() - ref.float()).abs().max() <= 0.02 * ref.float().abs().max()
""")


@pytest.mark.slow  # (a pytest process: 5 s)
def test_the_pytest_plugin_corrects_a_users_own_kernel(tmp_path):
    (tmp_path / "test_user_kernel.py").write_text(USER_TEST)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_user_kernel.py"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1"}
    installed = subprocess.run([*command, "-p", "ogsgen.pytest_plugin"] if not _plugin_registered() else command,
                               capture_output=True, text=True, cwd=tmp_path, env=env)
    assert installed.returncode == 0, installed.stdout[-3000:]


def _plugin_registered() -> bool:
    from importlib.metadata import entry_points
    return any(ep.value == "ogsgen.pytest_plugin" for ep in entry_points(group="pytest11"))


def test_the_plugin_is_declared_as_a_pytest_entry_point():
    text = (ROOT / "pyproject.toml").read_text()
    assert '[project.entry-points.pytest11]\nogsgen = "ogsgen.pytest_plugin"' in text


def test_threads_calling_ogsgen_at_once_get_right_answers():
    # The interpreter keeps a launch's state in globals: concurrent launches once failed with InterpreterError.
    threads = 3
    start = threading.Barrier(threads)

    def moe_call(seed):
        g = torch.Generator().manual_seed(seed)
        x, w = torch.randn(16, 32, generator=g).bfloat16(), torch.randn(4, 32, 16, generator=g).bfloat16()
        logits = torch.randn(16, 4, generator=g)
        start.wait()
        results = []
        for _ in range(2):
            rd, gi, _ = ogsgen.routing(logits, 2)
            y = ogsgen.matmul_ogs(x, w, None, rd, gather_indx=gi)
            results.append((ogsgen.matmul_ogs_torch(x.double(), w.double(), None, rd, gather_indx=gi), y))
        return results

    with ThreadPoolExecutor(threads) as pool:
        for results in pool.map(moe_call, range(threads)):
            for ref, y in results:
                assert_close(ref, y)


def test_a_loop_bounded_by_cdiv_runs_with_any_numpy():
    # Triton 3.6's interpreter makes `range(pid_k, tl.cdiv(K, BLOCK_K), split_k)` (the split-K loop) call int() on a
    # 1-element array, which numpy 2.4 refuses ("only 0-dimensional arrays can be converted to Python scalars").
    x, w = torch.randn(21, 100), torch.randn(100, 40)
    with ogsgen.opt_flags_constraints(split_k=3, block_k=16):
        y = ogsgen.matmul_ogs(x, w, None)
    assert_close(x.double() @ w.double(), y, maxtol=1e-5, rmstol=1e-6)
