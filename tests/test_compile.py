"""torch.compile and torch.library: a whole MoE layer (routing, w1 gather + SwiGLU, w2 scatter + gammas) traced with
fullgraph=True, forward and backward equal to eager; the custom ops checked by torch.library.opcheck; on the GPU,
inductor and a CUDA graph of the layer including its routing."""
import warnings

import pytest
import torch
import torch._dynamo.testing

import ogsgen
from ogsgen import FusedActivation

SWIGLU = FusedActivation(ogsgen.swiglu, (1.702, 7.0))
SILU_AND_MUL = FusedActivation(ogsgen.silu_and_mul)
TOKENS, N_EXPTS, K_ACT, WIDTH, HIDDEN = 16, 4, 2, 32, 24


def moe_layer(x, router_w, w1, b1, w2, b2):
    rd, gi, si = ogsgen.routing(x.float() @ router_w, K_ACT)
    h = ogsgen.matmul_ogs(x, w1, b1, rd, gather_indx=gi, fused_activation=SWIGLU)
    return ogsgen.matmul_ogs(h, w2, b2, rd, scatter_indx=si, gammas=rd.gate_scal)


def silu_moe_layer(x, router_w, w1, b1, w2, b2):
    """The layer with DeepSeek's, Qwen's and Mixtral's activation."""
    rd, gi, si = ogsgen.routing(x.float() @ router_w, K_ACT)
    h = ogsgen.matmul_ogs(x, w1, b1, rd, gather_indx=gi, fused_activation=SILU_AND_MUL)
    return ogsgen.matmul_ogs(h, w2, b2, rd, scatter_indx=si, gammas=rd.gate_scal)


def _parameters(device, requires_grad=True, tokens=TOKENS):
    tensors = (torch.randn(tokens, WIDTH, device=device).bfloat16(), torch.randn(WIDTH, N_EXPTS, device=device),
               (torch.randn(N_EXPTS, WIDTH, 2 * HIDDEN, device=device) / 4).bfloat16(),
               torch.randn(N_EXPTS, 2 * HIDDEN, device=device),
               (torch.randn(N_EXPTS, HIDDEN, WIDTH, device=device) / 4).bfloat16(),
               torch.randn(N_EXPTS, WIDTH, device=device))
    return [t.requires_grad_(requires_grad) for t in tensors]


def _forward_backward(fn, params):
    for p in params:
        p.grad = None
    out = fn(*params)
    out.float().square().sum().backward()
    return out.detach(), [p.grad.clone() for p in params]


@pytest.mark.slow  # (6 s on a CPU)
@pytest.mark.parametrize("layer", [moe_layer, silu_moe_layer], ids=["swiglu", "silu_and_mul"])
def test_fullgraph_moe_layer_matches_eager(layer, device):
    params = _parameters(device)
    backend = "inductor" if device == "cuda" else "aot_eager"  # inductor's CPU code needs a C++ compiler
    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True, backend=backend)
    out, grads = _forward_backward(compiled, params)
    out_eager, grads_eager = _forward_backward(layer, params)
    torch.testing.assert_close(out, out_eager, atol=0, rtol=0)
    for grad, grad_eager in zip(grads, grads_eager):
        # the same kernels; inductor fuses the elementwise steps around them (x's two gradients, from the router
        # and from w1, summed in fp32 and rounded to bf16 once), so bf16 gradients may differ by a rounding
        torch.testing.assert_close(grad.float(), grad_eager.float(), atol=1e-2 * grad_eager.abs().max().item(), rtol=0)
        assert grad.abs().sum() > 0


@pytest.mark.slow
def test_token_counts_share_one_dynamic_graph(device):
    """As a server compiles its MoE layer: with dynamic shapes, calls of other token counts reuse the graph (the ops'
    fake implementations take symbolic sizes) and match eager."""
    backend = "inductor" if device == "cuda" else "aot_eager"
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend(backend)
    compiled = torch.compile(moe_layer, fullgraph=True, backend=counter, dynamic=True)
    frames = []
    for tokens in (16, 24, 9):
        params = _parameters(device, tokens=tokens)
        out, grads = _forward_backward(compiled, params)
        out_eager, grads_eager = _forward_backward(moe_layer, params)
        torch.testing.assert_close(out, out_eager, atol=0, rtol=0)
        for grad, grad_eager in zip(grads, grads_eager):
            torch.testing.assert_close(grad.float(), grad_eager.float(), atol=1e-2 * grad_eager.abs().max().item(),
                                       rtol=0)
        frames.append(counter.frame_count)
    assert frames[1:] == frames[:1] * 2, f"compiled frames after each token count: {frames} (a recompile)"


def test_an_activation_passed_in_compiles_with_dynamic_shapes(device):
    """A layer that takes its FusedActivation as an argument, compiled with dynamic shapes (dynamo traces the
    argument's int fields as symbols): equal to eager at two row counts, one graph."""
    def layer(x, w, activation):
        return ogsgen.matmul_ogs(x, w, None, fused_activation=activation)
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(layer, fullgraph=True, backend=counter, dynamic=True)
    w = torch.randn(WIDTH, 2 * HIDDEN, device=device).bfloat16()
    frames = []
    for rows in (16, 24, 9):
        x = torch.randn(rows, WIDTH, device=device).bfloat16()
        for activation in (SWIGLU, SILU_AND_MUL):
            torch.testing.assert_close(compiled(x, w, activation), layer(x, w, activation), atol=0, rtol=0)
        frames.append(counter.frame_count)
    assert frames[2] == frames[1], f"compiled frames after each row count: {frames} (a recompile)"


@pytest.mark.slow  # (6 s on a CPU)
def test_custom_ops_pass_opcheck(device):
    x, router_w, w1, b1, w2, b2 = _parameters(device, requires_grad=False)
    rd, gi, si = ogsgen.routing(x.float() @ router_w, K_ACT)
    meta = rd.expt_data
    routing = (rd.expt_hist, meta.slice_offs, meta.block_offs_data, meta.block_schedule_data)
    w1.requires_grad_()
    torch.library.opcheck(torch.ops.ogsgen.matmul_ogs.default, (
        x, w1, b1, *routing, gi.src_indx, gi.dst_indx, None, None, None, None, None, N_EXPTS, K_ACT, None, "swiglu",
        [1.702, 7.0], None, True, True))  # (the forward stores the rows before SwiGLU for the backward)
    h = torch.randn(TOKENS * K_ACT, HIDDEN, device=device).bfloat16().requires_grad_()
    torch.library.opcheck(torch.ops.ogsgen.matmul_ogs.default, (
        h, w2, b2, *routing, None, None, si.src_indx, si.dst_indx, None, rd.gate_scal, None, N_EXPTS, K_ACT, None,
        None, [], None, True, False))
    dense = torch.randn(8, WIDTH, device=device, requires_grad=True)
    torch.library.opcheck(torch.ops.ogsgen.matmul_ogs.default, (
        dense, router_w.requires_grad_(), None, None, None, None, None, None, None, None, None, None, None, None, 1, 1,
        0.5, None, [], torch.float32, False, False))
    torch.library.opcheck(torch.ops.ogsgen.matmul_ogs_inner.default, (
        x.mT, h.detach(), *routing, gi.src_indx, K_ACT, 32, torch.float32, True))
    z = torch.randn(TOKENS * K_ACT, 2 * HIDDEN, device=device).bfloat16()
    torch.library.opcheck(torch.ops.ogsgen.activation_backward.default, (
        "swiglu", [1.702, 7.0], z, torch.randn(TOKENS, HIDDEN, device=device).bfloat16(), si.dst_indx, K_ACT, rd.gate_scal, meta.slice_offs[N_EXPTS:], 0.5, True,
        torch.bfloat16))
    ids = torch.topk(torch.randn(TOKENS, N_EXPTS, device=device), K_ACT).indices.reshape(-1)
    torch.library.opcheck(torch.ops.ogsgen.routing_metadata.default, (ids, N_EXPTS, ids.numel()))


@pytest.mark.gpu
def test_compiling_the_layer_warns_of_nothing_in_ogsgen():
    """Dynamo warns where it traces through a cached function ("silent incorrectness is a potential risk"): none of
    ogsgen's code it traces may draw that, or any other warning, at a user's compile."""
    getattr(torch._dynamo.utils, "warn_once_cache", set()).clear()  # (Dynamo warns once per process)
    torch._dynamo.reset()
    params = _parameters("cuda")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.compile(moe_layer, fullgraph=True, backend="aot_eager")(*params)
    ours = [str(w.message) for w in caught if "ogsgen" in str(w.message) or "/ogsgen/" in w.filename]
    assert not ours, ours


@pytest.mark.gpu
def test_cuda_graph_of_the_layer_with_its_routing():
    params = _parameters("cuda", requires_grad=False)
    with torch.no_grad():
        expected = moe_layer(*params)  # also compiles every kernel before the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = moe_layer(*params)
        params[0].copy_(torch.randn_like(params[0]))  # new tokens, new routing: replayed from the same graph
        graph.replay()
        torch.testing.assert_close(captured, moe_layer(*params), atol=0, rtol=0)
        assert not torch.equal(captured, expected)


@pytest.mark.gpu
def test_reduce_overhead_mode_captures_the_layer():
    params = _parameters("cuda", requires_grad=False)
    torch._dynamo.reset()
    compiled = torch.compile(moe_layer, fullgraph=True, mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(3):  # warm-up runs, then a recorded graph replayed
            out = compiled(*params)
        torch.testing.assert_close(out, moe_layer(*params), atol=0, rtol=0)


def test_precision_config_built_inside_a_compiled_function(device):
    """A PrecisionConfig (and its FlexCtx) built in the compiled code itself, as a model's forward does."""
    def dense(x, w):
        pc = ogsgen.PrecisionConfig(out_dtype=torch.float32, flex_ctx=ogsgen.FlexCtx())
        return ogsgen.matmul_ogs(x, w, None, precision_config=pc)

    x, w = torch.randn(8, 32, device=device).bfloat16(), torch.randn(32, 16, device=device).bfloat16()
    torch._dynamo.reset()
    y = torch.compile(dense, fullgraph=True, backend="aot_eager")(x, w)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y.double(), x.double() @ w.double(), atol=1e-4, rtol=1e-5)
