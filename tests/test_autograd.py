"""Gradients of ogsgen.matmul_ogs (the custom op ogsgen::matmul_ogs and its backward on generated kernels) against
torch autograd through the float32 reference matmul_ogs_torch, on the same inputs: dense, batched, MoE gather with
SwiGLU, scatter with gammas and top-k sums, dropped gates, empty experts, the router's logits."""
import pytest
import torch
import triton
import triton.language as tl

import ogsgen
from ogsgen import FusedActivation, PrecisionConfig, matmul_ogs, matmul_ogs_torch
from ogsgen.errors import UnsupportedError

SWIGLU = FusedActivation(ogsgen.swiglu, (1.702, 7.0))
FP32 = PrecisionConfig(allow_tf32=False)  # fp32 dots in full precision on the GPU too (tf32 is the default)


def _leaves(*tensors):
    return [None if t is None else t.detach().clone().requires_grad_() for t in tensors]


def _check_gradients(run, inputs, atol):
    """Backward of ``run(lib, *inputs)`` with a random output gradient, for ogsgen and for the float32 reference on
    the same values (the reference's inputs upcast; its gradients compared in float32)."""
    ours = _leaves(*inputs)
    theirs = [None if t is None else t.detach().float().requires_grad_() for t in inputs]
    y = run(matmul_ogs, *ours)
    y_ref = run(matmul_ogs_torch, *theirs)
    assert y.shape == y_ref.shape and y.grad_fn is not None
    grad = torch.randn_like(y_ref)
    y.backward(grad.to(y.dtype))
    y_ref.backward(grad)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if a is None:
            continue
        assert a.grad is not None and a.grad.dtype == a.dtype and a.grad.shape == a.shape, f"input {i}"
        scale = b.grad.abs().max().clamp_min(1e-6)  # errors relative to the largest gradient
        err = (a.grad.float() - b.grad).abs().max() / scale
        assert err < atol, f"input {i}: gradient off by {err:.3g} of its largest magnitude"
    return y


def test_dense_with_bias_gammas_alpha_and_swiglu(device):
    x, w = torch.randn(24, 32, device=device), torch.randn(32, 48, device=device)
    bias, gammas = torch.randn(48, device=device), torch.rand(24, device=device)
    _check_gradients(lambda mm, x, w, b, g: mm(x, w, b, gammas=g, out_alpha=0.5, fused_activation=SWIGLU,
                                               precision_config=FP32), (x, w, bias, gammas), atol=1e-4)


@pytest.mark.parametrize("bias_shape", [None, (3, 20), (20,)])
def test_batched(bias_shape, device):
    x, w = torch.randn(3, 16, 24, device=device), torch.randn(3, 24, 20, device=device)
    bias = None if bias_shape is None else torch.randn(bias_shape, device=device)
    _check_gradients(lambda mm, x, w, b: mm(x, w, b, precision_config=FP32), (x, w, bias), atol=1e-4)


@pytest.mark.parametrize("activation", [None, SWIGLU])
def test_batched_gammas_are_shared_by_the_batch_entries(activation, device):
    """gammas of a batched call hold one value per row of a batch entry: each entry's row m reads gammas[m], and
    d gammas[m] sums the entries' rows m (found by tests/test_fuzz_grad.py: the fused backward read past gammas and
    returned one gradient per row of every entry)."""
    x, w = torch.randn(3, 5, 16, device=device), torch.randn(3, 16, 8, device=device)
    gammas = torch.rand(5, device=device) + 0.5
    _check_gradients(lambda mm, x, w, g: mm(x, w, None, gammas=g, out_alpha=0.5, fused_activation=activation,
                                            precision_config=FP32), (x, w, gammas), atol=1e-4)


@pytest.mark.parametrize("k_act", [pytest.param(1, marks=pytest.mark.slow), 2, pytest.param(4, marks=pytest.mark.slow)])
def test_moe_gather_with_swiglu(k_act, device):
    """The first MoE matmul: tokens gathered to their experts, bias per expert, fused SwiGLU."""
    tokens, n_expts, width, n = 29, 6, 32, 40
    rd, gi, _ = ogsgen.routing(torch.randn(tokens, n_expts, device=device), k_act)
    x = torch.randn(tokens, width, device=device).bfloat16()
    w = (torch.randn(n_expts, width, n, device=device) / 4).bfloat16()
    bias = torch.randn(n_expts, n, device=device)
    _check_gradients(lambda mm, x, w, b: mm(x, w, b, rd, gather_indx=gi, fused_activation=SWIGLU), (x, w, bias),
                     atol=3e-2)


def test_moe_gather_with_silu_and_mul(device):
    """The first MoE matmul of DeepSeek, Qwen and Mixtral: tokens gathered to their experts, no bias, fused
    SiLU-and-mul; its backward kernel (the rows before the activation kept by the forward) against torch's autograd
    of the reference."""
    tokens, n_expts, width, n = 29, 6, 32, 40
    rd, gi, _ = ogsgen.routing(torch.randn(tokens, n_expts, device=device), 2)
    x = torch.randn(tokens, width, device=device).bfloat16()
    w = (torch.randn(n_expts, width, n, device=device) / 4).bfloat16()
    silu_and_mul = FusedActivation(ogsgen.silu_and_mul)
    _check_gradients(lambda mm, x, w: mm(x, w, None, rd, gather_indx=gi, fused_activation=silu_and_mul), (x, w),
                     atol=3e-2)
    # float32 (a dense call): the backward's formula to float32 rounding
    x, w = torch.randn(24, 32, device=device), torch.randn(32, 48, device=device)
    _check_gradients(lambda mm, x, w: mm(x, w, None, fused_activation=silu_and_mul, precision_config=FP32), (x, w),
                     atol=1e-4)


@pytest.mark.parametrize("k_act", [pytest.param(1, marks=pytest.mark.slow), 2, pytest.param(4, marks=pytest.mark.slow),
                                   pytest.param(8, marks=pytest.mark.slow)])
@pytest.mark.parametrize("gammas_grad", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_moe_scatter_with_gammas(k_act, gammas_grad, device):
    """The second MoE matmul: sorted rows scattered back to their tokens, weighted by gammas, summed over top-k."""
    tokens, n_expts, width, n = 21, 9, 32, 24
    rd, _, si = ogsgen.routing(torch.randn(tokens, n_expts, device=device), k_act)
    x = torch.randn(tokens * k_act, width, device=device).bfloat16()
    w = (torch.randn(n_expts, width, n, device=device) / 4).bfloat16()
    bias, gammas = torch.randn(n_expts, n, device=device), rd.gate_scal.detach().clone()
    if gammas_grad:
        _check_gradients(lambda mm, x, w, b, g: mm(x, w, b, rd, scatter_indx=si, gammas=g), (x, w, bias, gammas),
                         atol=3e-2)
    else:  # constant gates: the backward takes no recompute
        _check_gradients(lambda mm, x, w, b: mm(x, w, b, rd, scatter_indx=si, gammas=gammas), (x, w, bias),
                         atol=3e-2)


@pytest.mark.slow
def test_dropped_gates_and_empty_experts(device):
    """Gates dropped (-1) and experts without rows: their rows and weights get zero gradients."""
    tokens, n_expts, k_act, width, n = 12, 8, 2, 16, 24
    ids = torch.randint(0, 3, (tokens, k_act), device=device)  # experts 3..7 empty
    ids[::3, 1] = -1
    rd, gi, si = ogsgen.routing_from_topk(ids, torch.rand(tokens, k_act, device=device), n_expts)
    x = torch.randn(tokens, width, device=device).bfloat16()
    w1 = (torch.randn(n_expts, width, 2 * n, device=device) / 4).bfloat16()
    w2 = (torch.randn(n_expts, n, width, device=device) / 4).bfloat16()

    def layer(mm, x, w1, w2, gammas):
        h = mm(x, w1, None, rd, gather_indx=gi, fused_activation=SWIGLU)
        return mm(h.to(torch.bfloat16), w2, None, rd, scatter_indx=si, gammas=gammas)
    gammas = rd.gate_scal.detach().clone()
    _check_gradients(layer, (x, w1, w2, gammas), atol=4e-2)
    ours = _leaves(x, w1, w2, gammas)
    layer(matmul_ogs, *ours).sum().backward()
    assert torch.count_nonzero(ours[1].grad[3:]) == 0 and torch.count_nonzero(ours[2].grad[3:]) == 0


def test_router_logits_get_gradients_through_the_gates(device):
    tokens, n_expts, k_act, width = 16, 4, 2, 16
    logits = torch.randn(tokens, n_expts, device=device, requires_grad=True)
    rd, gi, si = ogsgen.routing(logits, k_act)
    x = torch.randn(tokens * k_act, width, device=device).bfloat16()
    w = torch.randn(n_expts, width, 8, device=device).bfloat16()
    y = matmul_ogs(x, w, None, rd, scatter_indx=si, gammas=rd.gate_scal)
    y.float().square().sum().backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0
    # the same as through the reference with the same gates
    logits_ref = logits.detach().clone().requires_grad_()
    rd_ref, _, si_ref = ogsgen.routing(logits_ref, k_act)
    matmul_ogs_torch(x.float(), w.float(), None, rd_ref, scatter_indx=si_ref,
                     gammas=rd_ref.gate_scal).square().sum().backward()
    torch.testing.assert_close(logits.grad, logits_ref.grad, atol=3e-2 * logits_ref.grad.abs().max().item(), rtol=0)


def test_tf32_by_default_in_forward_and_backward(device):
    """fp32 operands take tf32 dots by default (as the forward does, so does its backward): within tf32's rounding
    of the reference, not within fp32's."""
    x, w = torch.randn(64, 256, device=device), torch.randn(256, 32, device=device)
    _check_gradients(lambda mm, x, w: mm(x, w, None), (x, w), atol=1e-2)


def test_gradient_refusals(device):
    x = torch.randn(8, 16, device=device, requires_grad=True)
    w = torch.randn(16, 8, device=device)
    with pytest.raises(UnsupportedError, match="y \\(a preallocated output\\)"):
        matmul_ogs(x, w, None, y=torch.empty(8, 8, device=device))
    with pytest.raises(UnsupportedError, match="precision_config's scales"):
        matmul_ogs(x, w, None, precision_config=PrecisionConfig(enforce_bitwise_invariance=True))
    with pytest.raises(UnsupportedError, match="quantized weights have no gradient"):
        matmul_ogs(x.detach().to(torch.float8_e4m3fn).requires_grad_(False), w.to(torch.float8_e4m3fn), None,
                   y_acc_in=torch.zeros(8, 8, device=device, requires_grad=True))
    with pytest.raises(UnsupportedError, match="betas has no gradient"):
        matmul_ogs(x, w, torch.zeros(8, device=device), betas=torch.ones(8, device=device, requires_grad=True))


@pytest.mark.parametrize("split_k", [pytest.param(2, marks=pytest.mark.slow), 3])
def test_split_k_forward_and_backward(split_k, device):
    """K split in every matmul of the step (the forward's and the backward's); dW's ragged-K product is not split."""
    tokens, n_expts, k_act, width, n = 19, 5, 2, 96, 16
    rd, _, si = ogsgen.routing(torch.randn(tokens, n_expts, device=device), k_act)
    x = torch.randn(tokens * k_act, width, device=device).bfloat16()
    w = (torch.randn(n_expts, width, n, device=device) / 8).bfloat16()
    with ogsgen.opt_flags_constraints(split_k=split_k):
        _check_gradients(lambda mm, x, w: mm(x, w, None, rd, scatter_indx=si), (x, w), atol=3e-2)
        dense_x, dense_w = torch.randn(16, width, device=device), torch.randn(width, 24, device=device)
        _check_gradients(lambda mm, x, w: mm(x, w, None, precision_config=FP32), (dense_x, dense_w), atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", ["gpt-oss", "DeepSeek-V3"])
@pytest.mark.large_gpu_memory(whole_card=True)
def test_model_sized_expert_layer_gradients(shape):
    """A model's expert layer at its real widths (gpt-oss-120b: 128 experts top-4, width 2880, w1 N 5760;
    DeepSeek-V3: top-8, width 7168, w1 N 4096, with 64 of its 256 experts so that the float32 reference and its
    gradients fit beside ogsgen's), with some tokens' last gate dropped."""
    n_expts, k_act, width, n1 = {"gpt-oss": (128, 4, 2880, 5760), "DeepSeek-V3": (64, 8, 7168, 4096)}[shape]
    tokens = 96
    ids = torch.topk(torch.randn(tokens, n_expts, device="cuda"), k_act).indices
    ids[::5, -1] = -1
    rd, gi, si = ogsgen.routing_from_topk(ids, torch.rand(tokens, k_act, device="cuda"), n_expts)
    x = torch.randn(tokens, width, device="cuda").bfloat16()
    w1 = (torch.randn(n_expts, width, n1, device="cuda") / width ** 0.5).bfloat16()
    w2 = (torch.randn(n_expts, n1 // 2, width, device="cuda") / (n1 // 2) ** 0.5).bfloat16()
    b1 = torch.randn(n_expts, n1, device="cuda") / 10

    def layer(mm, x, w1, b1, w2, gammas):
        h = mm(x, w1, b1, rd, gather_indx=gi, fused_activation=SWIGLU)
        return mm(h.to(torch.bfloat16), w2, None, rd, scatter_indx=si, gammas=gammas)
    _check_gradients(layer, (x, w1, b1, w2, rd.gate_scal.detach().clone()), atol=3e-2)


def test_gradient_of_a_sum_arrives_expanded(device):
    """y.sum().backward() hands the backward a stride-0 gradient."""
    x, w, bias = (torch.randn(8, 16, device=device, requires_grad=True),
                  torch.randn(16, 4, device=device, requires_grad=True), torch.randn(4, device=device, requires_grad=True))
    matmul_ogs(x, w, bias, precision_config=FP32).sum().backward()
    torch.testing.assert_close(x.grad, torch.ones(8, 4, device=device) @ w.detach().T, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(bias.grad, torch.full((4,), 8.0, device=device))


def test_swiglu_forward_keeps_its_rows_before_the_activation_for_the_backward(device, monkeypatch):
    """Under autograd the forward of a built-in SwiGLU also stores out_alpha * (x @ w + bias) (its preact variant),
    and the backward takes SwiGLU's gradient there: it launches no matmul recomputing those rows."""
    from ogsgen.runtime import loader, plans
    plans.clear()  # every launch through the loader, none replayed from an earlier test's plan
    tokens, n_expts, width, n = 19, 4, 32, 48
    rd, gi, _ = ogsgen.routing(torch.randn(tokens, n_expts, device=device), 2)
    x = torch.randn(tokens, width, device=device).bfloat16()
    w = (torch.randn(n_expts, width, n, device=device) / 4).bfloat16().requires_grad_()
    bias = torch.randn(n_expts, n, device=device)
    launched = []
    original = loader.kernel_for
    monkeypatch.setattr(loader, "kernel_for", lambda variant, kernel="tiled": launched.append(variant) or
                        original(variant, kernel))
    y = matmul_ogs(x, w, bias, rd, gather_indx=gi, fused_activation=SWIGLU, out_alpha=0.5)
    assert [v.preact for v in launched] == [True]
    meta = rd.expt_data
    routing = (rd.expt_hist, meta.slice_offs, meta.block_offs_data, meta.block_schedule_data)
    _, preact = torch.ops.ogsgen.matmul_ogs(x, w.detach(), bias, *routing, gi.src_indx, gi.dst_indx, None, None, None,
                                            None, None, n_expts, 2, 0.5, "swiglu", [1.702, 7.0], None, True, True)
    expected = matmul_ogs_torch(x.float(), w.detach().float(), bias, rd, gather_indx=gi, out_alpha=0.5)
    routed = int(meta.slice_offs[n_expts])
    torch.testing.assert_close(preact[:routed].float(), expected[:routed], atol=3e-2, rtol=1e-2)
    launched.clear()
    from ogsgen.ops import gradients
    monkeypatch.setattr(gradients, "_dz_by_torch", lambda *args: pytest.fail("SwiGLU's gradient taken by torch ops"))
    y.float().square().sum().backward()
    recomputed = [v for v in launched if v.ragged and v.gather and not v.inner]
    assert not recomputed and w.grad is not None


@pytest.mark.parametrize("scatter", [False, True])
@pytest.mark.parametrize("with_gammas", [False, True])
@pytest.mark.parametrize("activation", ["swiglu", None])
def test_fused_activation_backward_against_torch_autograd(activation, scatter, with_gammas, device):
    """The backward's fused kernel (SwiGLU's registered backward, or no activation) against torch autograd of
    SwiGLU's torch reference (or the identity): rows past the routed count and a scatter's dropped gates get zeros;
    values past SwiGLU's clamp limit on both sides pass no gradient."""
    from ogsgen.spec.builtins import swiglu_torch
    n_rows, n, k_act, routed, alpha, limit = 21, 40, 2, 17, 1.702, 3.0
    z = (torch.randn(n_rows, n, device=device) * 3).bfloat16()  # |z| > limit in about a third of the entries
    dst = torch.randperm(n_rows, device=device).int() if scatter else None
    if scatter:
        dst[3] = -1  # a dropped gate
    n_out = n // 2 if activation else n
    dy = torch.randn(n_rows // k_act + 1 if scatter else n_rows, n_out, device=device).bfloat16()
    gammas = torch.rand(n_rows, device=device) if with_gammas else None
    args = [alpha, limit] if activation else []
    dz, d_gammas = torch.ops.ogsgen.activation_backward(
        activation, args, z if activation or with_gammas else None, dy, dst, k_act, gammas,
        torch.tensor([routed], dtype=torch.int32, device=device), 0.5, with_gammas, torch.bfloat16)
    live = torch.arange(n_rows, device=device) < routed
    g = dy.float()[(dst.long() // k_act).clamp_min(0)] if scatter else dy.float()
    if scatter:
        live &= dst >= 0
    g = torch.where(live[:, None], g, 0.0)
    z_leaf = z.float().requires_grad_()
    act = swiglu_torch(z_leaf, alpha, limit) if activation else z_leaf * 1
    expected = torch.autograd.grad(act, z_leaf, g * (gammas[:, None] if with_gammas else 1))[0] * 0.5
    assert dz.dtype == torch.bfloat16 and dz.shape == z.shape
    torch.testing.assert_close(dz.float(), expected, atol=2e-2, rtol=1e-2)
    assert torch.count_nonzero(dz[~live]) == 0
    assert (z.float()[:, 0::2] > limit).any() and (z.float()[:, 1::2].abs() > limit).any()  # the clamps are taken
    if with_gammas:
        torch.testing.assert_close(d_gammas, (g * act.detach()).sum(-1), atol=1e-3, rtol=1e-3)
    else:
        assert d_gammas.numel() == 0


def test_fused_activation_backward_needs_the_rows_before_the_activation(device):
    from ogsgen.errors import SpecError
    with pytest.raises(SpecError, match="activation_backward needs z, the rows before the activation"):
        torch.ops.ogsgen.activation_backward("swiglu", [1.702, 7.0], None, torch.randn(4, 2, device=device), None,
                                             1, None, None, None, False, torch.float32)


def test_preact_refuses_what_it_cannot_keep(device):
    from ogsgen.errors import SpecError
    from ogsgen.runtime.matmul import launch
    x, w = torch.randn(8, 16, device=device), torch.randn(16, 24, device=device)
    with pytest.raises(SpecError, match=r"preact must have the matmul's shape before the activation, \(8, 24\)"):
        launch(x, w, None, fused_activation=SWIGLU, preact=torch.empty(8, 12, device=device))
    with pytest.raises(SpecError, match="preact keeps a matmul's rows before its activation: it needs a "
                                        "fused_activation"):
        launch(x, w, None, preact=torch.empty(8, 24, device=device))
    with pytest.raises(SpecError, match="preact must be torch.float32"):
        launch(x, w, None, fused_activation=SWIGLU, preact=torch.empty(8, 24, device=device).bfloat16())


@triton.jit
def autograd_cubed_scaled(tile, scale):  # an activation registered without a backward function (test below)
    return tl.fma(tile * tile, tile * scale, 0.0)


@pytest.mark.parametrize("mode", ["dense", "gather with gammas"])
def test_activation_without_a_backward_function_takes_torch_autograd_of_its_reference(mode, device, monkeypatch,
                                                                                         tmp_path):
    """A user's activation registered without ``backward``: the backward recomputes the rows before it and takes
    torch's autograd of its reference there (no fused kernel)."""
    from ogsgen.ops import gradients
    from ogsgen.runtime import loader

    spec = ogsgen.register_activation(autograd_cubed_scaled, arg_names=("scale",),
                                      reference=lambda tile, scale: tile ** 3 * scale)
    try:
        monkeypatch.setenv("OGSGEN_CACHE_DIR", str(tmp_path))  # its variants rendered on demand, not kept
        monkeypatch.setattr(loader, "_on_demand", True)
        monkeypatch.setattr(gradients, "activation_backward_op",
                            lambda *args: pytest.fail("the fused kernel took an activation without a backward"))
        act = FusedActivation(spec, (0.5,))
        if mode == "dense":
            x, w = torch.randn(12, 16, device=device), torch.randn(16, 8, device=device) / 4
            _check_gradients(lambda mm, x, w: mm(x, w, None, fused_activation=act, precision_config=FP32), (x, w),
                             atol=1e-4)
        else:
            rd, gi, _ = ogsgen.routing(torch.randn(10, 4, device=device), 2)
            x, w = torch.randn(10, 16, device=device), torch.randn(4, 16, 8, device=device) / 4
            gammas = torch.rand(20, device=device) + 0.5
            _check_gradients(lambda mm, x, w, g: mm(x, w, None, rd, gather_indx=gi, gammas=g, fused_activation=act,
                                                    precision_config=FP32), (x, w, gammas), atol=1e-4)
    finally:
        ogsgen.unregister("autograd_cubed_scaled")
