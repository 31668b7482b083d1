"""An output that shares memory with an input, or whose elements overlap each other, is refused, on the checked path
and on a replayed plan alike."""
import re

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


@pytest.mark.parametrize("layout,strides", [
    ("rows with gaps", (40, 1)), ("transposed", (1, 32)), ("rows overlapping by 8 elements", (24, 1)),
    ("rows overlapping a transposed column", (1, 16))])
def test_output_elements_overlapping_each_other_are_refused(layout, strides, device):
    # Every stride away from 0 was taken once: rows closer than their length overlap, and programs storing them
    # race for the shared elements.
    x, w = _square(device)
    buffer = torch.zeros(32 * 40, device=device).half()
    y = buffer.as_strided((32, 32), strides)
    if "overlapping" in layout:
        with pytest.raises(SpecError, match=re.escape(f"y (shape (32, 32), strides {strides}) has elements that "
                                                      f"overlap each other")):
            matmul_ogs(x, w, None, y=y)
        assert not buffer.any()
    else:
        assert matmul_ogs(x, w, None, y=y) is y
        assert_close(x.float() @ w.float(), y.float())


def test_the_launch_path_refuses_gradients(device):
    # ogsgen.matmul_ogs is differentiable (tests/test_autograd.py); the runtime's launch path under it is not, and
    # says so rather than return a result without a gradient.
    from ogsgen.runtime import matmul_ogs as launch_path
    x, w = _square(device)
    x.requires_grad_(True)
    with pytest.raises(ogsgen.UnsupportedError, match=r"x requires grad, but ogsgen.runtime.matmul_ogs"):
        launch_path(x, w, None)
    bias = torch.zeros(32, device=device, requires_grad=True)
    with pytest.raises(ogsgen.UnsupportedError, match="bias requires grad"):
        launch_path(x.detach(), w, bias)
    with torch.no_grad():
        assert_close(x.detach().float() @ w.float(), launch_path(x, w, None).float())
    assert matmul_ogs(x, w, None).grad_fn is not None


def test_replay_guard_agrees_with_the_checked_path():
    # The guard a plan keeps compares addresses against bounds computed once; for views of one buffer at every
    # relative offset (transposed, strided, identical) it admits exactly the calls the checked path admits.
    from ogsgen.runtime import memory
    buffer = torch.zeros(4096)
    layouts = [lambda o: buffer[o:o + 64].view(8, 8), lambda o: buffer[o:o + 64].view(8, 8).t(),
               lambda o: buffer[o:o + 128:2], lambda o: buffer[o:o + 8]]
    names = ("y", "y_acc_in", "x")
    for y_layout in layouts:
        for acc_layout in layouts:
            recorded = [y_layout(1000), acc_layout(2000), buffer[3000:3016]]
            guard = memory.DisjointGuard(recorded, (0,), ((0, 1),))
            for y_offset in range(960, 1100, 3):
                for acc_offset in (960, 1000, 1030, 1064, 2000):
                    tensors = [y_layout(y_offset), acc_layout(acc_offset), buffer[3000:3016]]
                    try:
                        memory.check_outputs_disjoint({"y": tensors[0]}, dict(zip(names[1:], tensors[1:])),
                                                      same_allowed=(("y", "y_acc_in"),))
                        admitted = True
                    except SpecError:
                        admitted = False
                    if memory.same_elements(*recorded[:2]) or not memory.same_elements(*tensors[:2]):
                        assert guard(tensors) == admitted, (y_offset, acc_offset)


def test_replayed_plan_refuses_a_preact_overlapping_an_input(device):
    # preact (the rows before the activation, written for the backward) is an output like y: a replayed plan must
    # refuse one that overlaps x, even when the call passes no y.
    from ogsgen import FusedActivation, swiglu
    from ogsgen.runtime.matmul import launch
    x, w = _square(device)
    act = FusedActivation(swiglu, (1.702, 7.0))
    launch(x, w, None, fused_activation=act, preact=torch.empty_like(x))
    assert plans._plans, "the call should have recorded a plan"
    before = x.clone()
    with pytest.raises(SpecError, match="preact overlaps x in memory"):
        launch(x, w, None, fused_activation=act, preact=x)
    assert torch.equal(x, before)
