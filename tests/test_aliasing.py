"""An output that shares memory with an input is refused, on the checked path and on a replayed plan alike."""
import pytest
import torch

import ogsgen
from ogsgen import PrecisionConfig, SpecError, matmul_ogs
from ogsgen.runtime import plans
from ogsgen.testing import assert_close

pytestmark = pytest.mark.usefixtures("y_acc_in_kernels")

def _square(device, n=32):
    return torch.randn(n, n, device=device).half(), torch.randn(n, n, device=device).half()


@pytest.mark.parametrize("case,message", [
    ("y is x", "y overlaps x in memory"),
    ("y is w", "y overlaps w in memory"),
    ("y is a view into x", "y overlaps x in memory"),
    ("y overlaps the bias", "y overlaps bias in memory"),
    ("y_acc_in is a shifted view of y", "y overlaps y_acc_in in memory"),
])
def test_output_overlapping_an_input_is_refused(case, message, device):
    x, w = _square(device)
    kwargs = {}
    if case == "y is x":
        kwargs["y"] = x
    elif case == "y is w":
        kwargs["y"] = w
    elif case == "y is a view into x":
        x = torch.randn(64, 32, device=device).half()
        kwargs["y"] = x[16:48]
        x = x[:32]
    elif case == "y overlaps the bias":
        storage = torch.zeros(32 * 32 + 16, device=device)
        kwargs.update(bias=storage[:32], y=storage[16:].view(32, 32),
                      precision_config=PrecisionConfig(out_dtype=torch.float32))
    else:
        buffer = torch.zeros(33, 32, device=device).half()
        kwargs.update(y=buffer[1:], y_acc_in=buffer[:32])
    with pytest.raises(SpecError, match=message):
        matmul_ogs(x, w, kwargs.pop("bias", None), **kwargs)


def test_replayed_plan_refuses_an_overlapping_output(device):
    # The first call of a signature records a plan that later calls replay without the argument checks; an
    # overlapping y with the same shapes and strides must still be refused, not computed in place.
    x, w = _square(device)
    y = torch.empty_like(x)
    expected = x.float() @ w.float()
    assert_close(expected, matmul_ogs(x, w, None, y=y).float())
    assert plans._plans, "the call should have recorded a plan"
    before = x.clone()
    with pytest.raises(SpecError, match="y overlaps x in memory"):
        matmul_ogs(x, w, None, y=x)
    assert torch.equal(x, before)
    assert_close(expected, matmul_ogs(x, w, None, y=y).float())  # the plan still serves disjoint calls


def test_y_acc_in_may_be_y_itself(device):
    # In-place accumulation (dW += x^T dy): each tile reads y_acc_in's elements before it writes them.
    x, w = _square(device)
    acc = torch.randn(32, 32, device=device).half()
    expected = acc.float() + x.float() @ w.float()
    for _ in range(2):  # checked path, then a replayed plan
        y = acc.clone()
        out = matmul_ogs(x, w, None, y=y, y_acc_in=y)
        assert out.data_ptr() == y.data_ptr()
        assert_close(expected, out.float())


def test_disjoint_views_of_one_buffer_are_accepted(device):
    x, w = _square(device)
    buffer = torch.empty(64, 32, device=device).half()
    buffer[:32] = x
    out = matmul_ogs(buffer[:32], w, None, y=buffer[32:])
    assert_close(x.float() @ w.float(), out.float())


def test_gradients_are_refused_until_autograd_exists(device):
    x, w = _square(device)
    x.requires_grad_(True)
    with pytest.raises(ogsgen.UnsupportedError, match=r"x requires grad, but matmul_ogs has no autograd yet"):
        matmul_ogs(x, w, None)
    bias = torch.zeros(32, device=device, requires_grad=True)
    with pytest.raises(ogsgen.UnsupportedError, match="bias requires grad"):
        matmul_ogs(x.detach(), w, bias)
    with torch.no_grad():
        assert_close(x.detach().float() @ w.float(), matmul_ogs(x, w, None).float())
