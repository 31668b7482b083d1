"""Tensors whose negation torch keeps as a flag (``torch._neg_view``, the imaginary part of a ``conj()`` view) and
not in their memory, which is what the kernels read: matmul_ogs and routing read them through copies holding their
values, on the checked path and on a replayed plan alike, and so do the quantizers of ogsgen.numerics. (Outputs with the
flag are refused: test_bad_inputs.py.)"""
import pytest
import torch

import ogsgen
from ogsgen import FlexCtx, InFlexData, PrecisionConfig, matmul_ogs
from ogsgen.numerics import quantize_fp8, quantize_mx
from ogsgen.testing import assert_close

pytestmark = pytest.mark.usefixtures("kernels_on_demand")  # (bias with betas is not in the default catalog)
M, K, N = 8, 16, 24
IEEE = PrecisionConfig(allow_tf32=False)  # fp32 dots in full precision on the GPU too


def negated_memory(t):
    """A tensor that reads as ``t`` but whose memory holds ``-t``."""
    return torch._neg_view(-t)


def conj_imaginary(t):
    """The imaginary part of a conjugated complex view: reads as ``t``, memory holds ``-t``."""
    return torch.complex(torch.zeros_like(t), -t).conj().imag


@pytest.mark.parametrize("lazy", [negated_memory, conj_imaginary])
@pytest.mark.parametrize("argument", ["x", "w", "bias", "betas", "gammas"])
def test_lazy_inputs_are_read_as_their_values(argument, lazy, device):
    args = {"x": torch.randn(M, K, device=device), "w": torch.randn(K, N, device=device),
            "bias": torch.randn(N, device=device), "betas": torch.rand(M, device=device) + 0.5,
            "gammas": torch.rand(M, device=device) + 0.5}
    x, w, bias, betas, gammas = (args[name].double() for name in ("x", "w", "bias", "betas", "gammas"))
    expected = (x @ w + bias * betas[:, None]) * gammas[:, None]
    args[argument] = lazy(args[argument])
    assert args[argument].is_neg()
    y = matmul_ogs(args["x"], args["w"], args["bias"], betas=args["betas"], gammas=args["gammas"],
                   precision_config=IEEE)
    assert_close(expected, y, maxtol=1e-5, rmstol=1e-6)


def test_a_replayed_plan_reads_a_lazy_input_as_its_values(device):
    # The first call records a plan for tensors of this shape, strides and dtype; a negated view of the same layout
    # must not replay it on its raw memory.
    x, w = torch.randn(M, K, device=device), torch.randn(K, N, device=device)
    expected = x.double() @ w.double()
    assert_close(expected, matmul_ogs(x, w, None, precision_config=IEEE), maxtol=1e-5, rmstol=1e-6)
    assert_close(expected, matmul_ogs(negated_memory(x), w, None, precision_config=IEEE), maxtol=1e-5, rmstol=1e-6)
    assert_close(-expected, matmul_ogs(torch._neg_view(x), w, None, precision_config=IEEE), maxtol=1e-5, rmstol=1e-6)


def test_lazy_flexpoint_weight_scale(device):
    x = torch.randn(M, 32, device=device).bfloat16()
    w = (torch.randn(32, N, device=device) / 4).to(torch.float8_e4m3fn).mT.contiguous().mT  # K-contiguous (Hopper)
    scale = torch.tensor([1.5], device=device)
    pc = PrecisionConfig(out_dtype=torch.float32, flex_ctx=FlexCtx(rhs_data=InFlexData(scale=negated_memory(scale))))
    y = matmul_ogs(x, w, None, precision_config=pc)
    assert_close(x.double() @ (w.double() * 1.5), y, maxtol=1e-5, rmstol=1e-6)


@pytest.mark.usefixtures("y_acc_in_kernels")
def test_lazy_y_acc_in(device):
    x, w = torch.randn(M, K, device=device).half(), torch.randn(K, N, device=device).half()
    acc = torch.randn(M, N, device=device).half()
    y = matmul_ogs(x, w, None, y_acc_in=negated_memory(acc))
    assert_close(x.double() @ w.double() + acc.double(), y)
    # y_acc_in a negated view of y itself: y = x @ w - y, read through a copy taken before y is written
    y = acc.clone()
    matmul_ogs(x, w, None, y=y, y_acc_in=torch._neg_view(y))
    assert_close(x.double() @ w.double() - acc.double(), y)


def test_lazy_inputs_of_a_ragged_k_product(device):
    # inner_routing_data (an expert weights' gradient): y[e] = x[:, segment e] @ w[segment e]
    x, w = torch.randn(M, 6, device=device), torch.randn(6, N, device=device)
    hist = torch.tensor([2, 0, 4], dtype=torch.int32, device=device)
    inner = ogsgen.InnerRoutingData(ogsgen.RoutingData(None, hist, 3, 1))
    y = matmul_ogs(negated_memory(x), w, None, inner_routing_data=inner, precision_config=IEEE)
    x, w = x.double(), w.double()
    expected = torch.stack([x[:, :2] @ w[:2], torch.zeros(M, N, dtype=torch.float64, device=device),
                            x[:, 2:] @ w[2:]])
    assert_close(expected, y, maxtol=1e-5, rmstol=1e-6)


def test_routing_from_lazy_topk_ids(device):
    ids = torch.tensor([[0, 2], [1, 2], [3, 0], [2, 1]], dtype=torch.int32, device=device)
    weights = torch.rand(ids.shape, device=device)
    expected = ogsgen.routing_from_topk(ids, weights, 4)
    routed = ogsgen.routing_from_topk(negated_memory(ids), weights, 4)
    assert torch.equal(routed[0].expt_hist, expected[0].expt_hist)
    assert torch.equal(routed[0].expt_data.block_schedule_data, expected[0].expt_data.block_schedule_data)
    for got, want in ((routed[1].src_indx, expected[1].src_indx), (routed[2].src_indx, expected[2].src_indx)):
        assert torch.equal(got, want)


@pytest.mark.parametrize("lazy", [torch._neg_view, pytest.param(conj_imaginary, marks=pytest.mark.slow)])
@pytest.mark.parametrize("quantize", [
    lambda x: quantize_fp8(x, (1, 128)), lambda x: quantize_fp8(x, (1, 0)), lambda x: quantize_fp8(x, (128, 128)),
    lambda x: quantize_mx(x, "e4m3"), lambda x: quantize_mx(x, "e2m1"), lambda x: quantize_mx(x, "e4m3", axis=0)],
    ids=["fp8-1x128", "fp8-row", "fp8-128x128", "mx-e4m3", "mx-e2m1", "mx-e4m3-axis0"])
def test_quantizers_read_a_lazy_input_as_its_values(quantize, lazy, device):
    x = torch.randn(64, 256, device=device)
    view = lazy(x)  # reads as -x (conj_imaginary: as x, its memory -x)
    assert view.is_neg()
    want = quantize(view.clone().resolve_neg())
    for got, expected in zip(quantize(view), want):
        assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8)) if got.element_size() == 1 else \
            torch.equal(got, expected)
