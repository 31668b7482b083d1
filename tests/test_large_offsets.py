"""Tensors whose column, K or split offsets reach 2**31 elements take the kernels' 64-bit-offset specialization.

Each case used to compute such an offset in 32 bits: a crash, or (a column-major y) stores outside y and wrong
values. On the CPU the tensors are views with one huge stride into a large allocation of which only the viewed
elements are touched; tests/test_gpu.py runs the real sizes on a GPU.
"""
import pytest
import torch

import ogsgen
from ogsgen.runtime import memory
from ogsgen.testing import assert_close

STRIDE = 1 << 25  # 64 elements apart by this stride is 2**31 elements


pytestmark = pytest.mark.usefixtures("y_acc_in_kernels")


def _strided(rows: int, cols: int, device) -> torch.Tensor:
    """A (rows, cols) fp16 view whose row stride is STRIDE (only its elements are ever touched)."""
    return torch.empty(rows, STRIDE, dtype=torch.float16, device=device)[:, :cols]


def _fill(view: torch.Tensor) -> torch.Tensor:
    view.copy_(torch.randn(view.shape, device=view.device).half())
    return view


@pytest.mark.parametrize("case", ["w K-contiguous", "w N-contiguous", "x K-major", "y column-major",
                                  "y_acc_in column-major", "split-K reduce into column-major y"])
@pytest.mark.large_gpu_memory
def test_offsets_past_2_31(case, device):
    m, k, n = 16, 32, 65
    x = torch.randn(m, k, device=device).half()
    w = torch.randn(k, n, device=device).half()
    y = y_acc_in = None
    constraints = {}
    if case == "w K-contiguous":
        w = _fill(_strided(n, k, device).T)  # N stride 2**25, 64 columns apart: 2**31 elements
    elif case == "w N-contiguous":
        k = 65
        x = torch.randn(m, k, device=device).half()
        w = _fill(_strided(k, n, device))  # K stride 2**25
    elif case == "x K-major":
        k = 65
        x = _fill(_strided(k, m, device).T)
        w = torch.randn(k, n, device=device).half()
    elif case in ("y column-major", "split-K reduce into column-major y"):
        y = _strided(n, m, device).T.fill_(float("nan"))
        constraints = dict(split_k=2) if case.startswith("split") else {}
    else:
        y_acc_in = _fill(_strided(n, m, device).T)
    with ogsgen.opt_flags_constraints(**constraints):
        out = ogsgen.matmul_ogs(x, w, None, y=y, y_acc_in=y_acc_in)
    ref = x.float() @ w.float() + (0 if y_acc_in is None else y_acc_in.float())
    assert_close(ref, out.float(), what=case)
    if y is not None:
        assert out.data_ptr() == y.data_ptr()


def test_ordinary_calls_keep_32_bit_offsets():
    # DeepSeek-V3's w1 at T=8192: 7.5e9 weight elements in all, but experts, rows and batches are indexed in 64 bits
    # anyway; only spans along the dimensions indexed in 32 bits count.
    w = torch.empty(256, 7168, 4096, device="meta", dtype=torch.bfloat16)
    x = torch.empty(8192 * 8, 7168, device="meta", dtype=torch.bfloat16)
    assert not memory.needs_64bit_offsets((x, (-1,)), (w, (-2, -1)), (x.mT, (-1,)))
    assert memory.needs_64bit_offsets((w.transpose(0, 1), (-2, -1)))  # (K, E, N): the expert dim is now 32-bit
    assert memory.needs_64bit_offsets((torch.empty(2**31 + 1, 1, device="meta").mT, (-1,)))
