"""ogsgen.compat.triton_kernels: code written for triton_kernels' matmul_ogs generation runs on ogsgen by changing
its imports. The call pattern is vLLM's gpt-oss MoE path (fused SwiGLU into preallocated 3-D buffers, then the
scatter with gammas), the router gate's dense call and the process-wide opt flags constraints; on a GPU with
triton_kernels importable (PYTHONPATH=third_party, bench/fetch_peers.py) the same code runs on both libraries."""
import importlib

import pytest
import torch

import ogsgen
from ogsgen.errors import InapplicableConstraintError, SpecError, SpecTypeError, UnsupportedError
from ogsgen.runtime.opt_flags import current_constraints
from ogsgen.testing import assert_close


def _library(prefix: str):
    modules = {name: importlib.import_module(f"{prefix}.{name}")
               for name in ("matmul_ogs", "routing", "swiglu", "matmul_ogs_details.opt_flags")}
    return modules["matmul_ogs"], modules["routing"], modules["swiglu"], modules["matmul_ogs_details.opt_flags"]


def gpt_oss_layer(prefix, x, w_gate, b_gate, w1, b1, w2, b2, top_k, alpha=1.702, limit=7.0):
    """The MoE layer as vLLM's triton_kernels path calls it, on the library under ``prefix``."""
    mo, ro, sw, _ = _library(prefix)
    pc = mo.PrecisionConfig(flex_ctx=mo.FlexCtx(rhs_data=mo.InFlexData()))
    logits = mo.matmul_ogs(x, w_gate, b_gate, precision_config=pc)  # the router gate: a dense call
    routing_data, gather_indx, scatter_indx = ro.routing(logits, top_k)
    act = mo.FusedActivation(mo.FnSpecs("swiglu", sw.swiglu_fn, ("alpha", "limit")), (alpha, limit), 2)
    tokens, hidden, inter = x.shape[0], w2.shape[-1], w1.shape[-1] // 2
    h = torch.empty((1, tokens * top_k, inter), device=x.device, dtype=x.dtype)
    mo.matmul_ogs(x, w1, b1, routing_data, gather_indx=gather_indx, precision_config=pc, fused_activation=act, y=h)
    out = torch.empty((1, tokens, hidden), device=x.device, dtype=x.dtype)
    y = mo.matmul_ogs(h.view(tokens * top_k, inter), w2, b2, routing_data, scatter_indx=scatter_indx,
                      precision_config=pc, gammas=routing_data.gate_scal, y=out)
    assert y.shape == (tokens, hidden) and y.data_ptr() == out.data_ptr()  # 2-D, written into the given buffer
    return logits, out[0]


def _weights(device, tokens=24, hidden=64, inter=32, experts=4):
    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, device=device) * scale).bfloat16()
    return (rand(tokens, hidden), rand(hidden, experts, scale=hidden ** -0.5), torch.randn(experts, device=device),
            rand(experts, hidden, 2 * inter, scale=hidden ** -0.5), torch.randn(experts, 2 * inter, device=device),
            rand(experts, inter, hidden, scale=inter ** -0.5), torch.randn(experts, hidden, device=device))


def _torch_layer(x, w_gate, b_gate, w1, b1, w2, b2, top_k, logits):
    routing_data, gather_indx, scatter_indx = ogsgen.routing(logits, top_k)
    act = ogsgen.FusedActivation(ogsgen.swiglu, (1.702, 7.0))
    h = ogsgen.matmul_ogs_torch(x, w1, b1, routing_data, gather_indx, fused_activation=act)
    return ogsgen.matmul_ogs_torch(h, w2, b2, routing_data, scatter_indx=scatter_indx,
                                   gammas=routing_data.gate_scal)


def test_vllm_gpt_oss_call_pattern(device):
    tensors = _weights(device)
    logits, out = gpt_oss_layer("ogsgen.compat.triton_kernels", *tensors, top_k=2)
    x, w_gate, b_gate = tensors[:3]
    assert_close(x.float() @ w_gate.float() + b_gate, logits.float(), what="router logits")
    assert_close(_torch_layer(*tensors, 2, logits).float(), out.float(), what="MoE layer")


def test_activation_specs_built_per_call_cost_no_source_hashing():
    # vLLM builds FnSpecs and FusedActivation on every forward call: the second build reuses the first's specs.
    mo, _, sw, _ = _library("ogsgen.compat.triton_kernels")
    first = mo.FusedActivation(mo.FnSpecs("swiglu", sw.swiglu_fn, ("alpha", "limit")), (1.702, 7.0), 2)
    again = mo.FusedActivation(mo.FnSpecs("swiglu", sw.swiglu_fn, ("alpha", "limit")), (1.702, 7.0), 2)
    assert again.specs is first.specs and first.specs == ogsgen.swiglu


def test_swiglu_with_the_default_reduction_n_is_refused(device):
    # triton_kernels' kernel refuses FusedActivation(swiglu specs, args) with reduction_n left at 1 (the activation
    # returns half the columns the kernel expects); ogsgen returned an output whose right half was never written.
    mo, _, sw, _ = _library("ogsgen.compat.triton_kernels")
    with pytest.raises(SpecError, match=r"folds 2 columns into one \(reduction_n=2\); pass reduction_n=2"):
        mo.FusedActivation(mo.FnSpecs("swiglu", sw.swiglu_fn, ("alpha", "limit")), (1.702, 7.0))
    with pytest.raises(SpecError, match="pass reduction_n=2"):  # ogsgen's own FnSpecs of the same function
        ogsgen.FnSpecs("swiglu_folding_one", ogsgen.swiglu.fn, ("alpha", "limit"))


def test_swiglu_specs_train_as_the_builtin(device):
    # The compat SwiGLU is the built-in's specs (its torch reference and fused backward): autograd runs through it.
    mo, _, sw, _ = _library("ogsgen.compat.triton_kernels")
    act = mo.FusedActivation(mo.FnSpecs("swiglu", sw.swiglu_fn, ("alpha", "limit")), (1.702, 7.0), 2)
    x, w = torch.randn(12, 32, device=device, requires_grad=True), torch.randn(32, 48, device=device,
                                                                              requires_grad=True)
    pc = mo.PrecisionConfig(allow_tf32=False)
    y = mo.matmul_ogs(x, w, None, precision_config=pc, fused_activation=act)
    grad = torch.randn_like(y)
    y.backward(grad)
    x_ref, w_ref = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    y_ref = mo.matmul_ogs_torch(x_ref, w_ref, None, fused_activation=act)
    y_ref.backward(grad)
    assert_close(y_ref.detach(), y.detach(), what="forward")
    assert_close(x_ref.grad, x.grad, what="dx")
    assert_close(w_ref.grad, w.grad, what="dw")
    assert act.specs is ogsgen.swiglu


def test_process_wide_constraints_use_triton_kernels_names():
    _, _, _, opt_flags = _library("ogsgen.compat.triton_kernels")
    try:
        opt_flags.update_opt_flags_constraints({"is_persistent": False, "split_k": 1})
        assert dict(current_constraints()) == {"persistent": False, "split_k": 1}
        with ogsgen.opt_flags_constraints(split_k=2):  # a scoped block overrides the process-wide value
            assert dict(current_constraints()) == {"persistent": False, "split_k": 2}
        with pytest.warns(RuntimeWarning, match="'epilogue_subtile' has no counterpart"):
            opt_flags.update_opt_flags_constraints({"epilogue_subtile": 1})
        with pytest.raises(InapplicableConstraintError, match="block_m must be a power of two"):
            opt_flags.update_opt_flags_constraints({"block_m": 48})
        assert dict(current_constraints()) == {"persistent": False, "split_k": 1}  # a refused update changes nothing
        with pytest.raises(UnsupportedError, match="set_opt_flags"):
            opt_flags.set_opt_flags(None)
    finally:
        opt_flags.reset_opt_flags_constraints()
    assert current_constraints() == ()


def test_unsupported_arguments_are_refused_by_name(device):
    mo, ro, _, _ = _library("ogsgen.compat.triton_kernels")
    logits = torch.randn(8, 4, device=device)
    with pytest.raises(UnsupportedError, match="simulated_ep"):
        ro.routing(logits, 2, simulated_ep=2)
    with pytest.raises(UnsupportedError, match="n_rows"):
        ro.routing(logits, 2, n_rows=4)
    x = torch.randn(8, 16, device=device).bfloat16()
    with pytest.raises(SpecTypeError, match="fused_comm must be an ogsgen.FusedComm"):  # mo.FusedComm is that
        mo.matmul_ogs(x, x.mT.contiguous(), None, fused_comm=object())


@pytest.mark.gpu
def test_same_code_on_triton_kernels_and_ogsgen():
    pytest.importorskip("triton_kernels.routing", reason="triton_kernels is not importable: bench/fetch_peers.py")
    tensors = _weights("cuda", tokens=512, hidden=256, inter=128, experts=8)
    results = {prefix: gpt_oss_layer(prefix, *tensors, top_k=4)
               for prefix in ("triton_kernels", "ogsgen.compat.triton_kernels")}
    (tk_logits, tk_out), (our_logits, our_out) = results.values()
    assert_close(tk_logits.float(), our_logits.float(), what="router logits")
    # Routing ties aside, both take the same experts; each layer matches the torch reference of its own routing.
    assert_close(_torch_layer(*tensors, 4, tk_logits).float(), tk_out.float(), what="triton_kernels layer")
    assert_close(_torch_layer(*tensors, 4, our_logits).float(), our_out.float(), what="ogsgen layer")
    assert_close(tk_out.float(), our_out.float(), what="ogsgen against triton_kernels")
