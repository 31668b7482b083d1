"""ogsgen.compat.triton_kernels_v36 (triton_kernels 3.6): SGLang's compat shim and MoE forwards and vLLM's 3.6
branch of gpt_oss_triton_kernels_moe.py (topk -> SparseMatrix -> make_ragged_tensor_metadata, FnSpecs(...,
reduction_n=2)), written here from their call patterns, run on ogsgen against the torch reference. On a GPU with
triton_kernels 3.6 importable the same code runs on both libraries."""
import importlib

import pytest
import torch

import ogsgen
from compat_layers import (ALPHA, LIMIT, checkpoint_moe, library, pack_bitmatrix, reference_layer, vllm_fused_experts,
                           vllm_prepare)
from ogsgen.errors import SpecError, UnsupportedError
from ogsgen.testing import assert_close

OURS = "ogsgen.compat.triton_kernels_v36"


def gate_weights_routing(gating_output, top_k, dtype=torch.bfloat16):
    """ogsgen's routing with the gate weights rounded to ``dtype``, as a caller that stores them so passes them."""
    ids, scores = ogsgen.moe.select_experts(gating_output, top_k)
    return ogsgen.routing_from_topk(ids, torch.softmax(scores, -1).to(dtype).float(), gating_output.shape[1])


# ------------------------------------------------------------------ SGLang

def routing_from_sparse(prefix, sparse_logits, n_expts_tot, n_expts_act, histogram):
    """The routing both callers build from a SparseMatrix on 3.6 (SGLang's shim passes the metadata's
    ``slice_sizes`` as the histogram, vLLM its ``block_sizes``)."""
    mo, tensor = library(prefix, "matmul_ogs", "tensor")
    dispatch_indx = sparse_logits.mask_metadata.row_sorted_indx
    combine_indx = sparse_logits.mask_metadata.col_sorted_indx
    ragged_batch_metadata = tensor.make_ragged_tensor_metadata(sparse_logits.mask_metadata.col_sum,
                                                               dispatch_indx.shape[0])
    gate_scal = sparse_logits.vals.flatten()[combine_indx]
    routing_data = mo.RoutingData(gate_scal, getattr(ragged_batch_metadata, histogram), n_expts_tot, n_expts_act,
                                  ragged_batch_metadata)
    return routing_data, mo.GatherIndx(combine_indx, dispatch_indx), mo.ScatterIndx(dispatch_indx, combine_indx)


def sglang_routing(prefix):
    """SGLang's triton_kernels_compat.routing: triton_kernels.routing's where that module exists (<= 3.5), else
    rebuilt on 3.6's topk -> SparseMatrix -> make_ragged_tensor_metadata (the orders named as in 3.6)."""
    try:
        return importlib.import_module(f"{prefix}.routing").routing
    except ImportError:
        pass
    topk_module, tensor = library(prefix, "topk", "tensor")

    def routing_from_bitmatrix(bitmatrix, expt_scal, expt_indx, n_expts_tot, n_expts_act):
        sparse_logits = tensor.SparseMatrix(indx=expt_indx, vals=expt_scal, mask=bitmatrix)
        return routing_from_sparse(prefix, sparse_logits, n_expts_tot, n_expts_act, "slice_sizes")

    def routing(logits, n_expts_act, sm_first=False, expt_indx=None, n_rows=None):
        if sm_first:
            logits = torch.softmax(logits, dim=-1)
        sparse_logits = topk_module.topk(logits, n_expts_act, apply_softmax=not sm_first, y_indx=expt_indx,
                                         n_rows=n_rows)
        return routing_from_bitmatrix(sparse_logits.mask, sparse_logits.vals, sparse_logits.indx, logits.shape[-1],
                                      n_expts_act)
    return routing


def sglang_fused_experts(prefix, hidden_states, w1, w2, routing_data, gather_indx, scatter_indx):
    """SGLang's triton_kernel_fused_experts: bf16 weights, the gated activation (silu_and_mul: [gate | up]) between
    the two matmuls."""
    (mo,) = library(prefix, "matmul_ogs")
    N = w1.shape[-1]
    intermediate_cache1 = mo.matmul_ogs(hidden_states, w1, None, routing_data, gather_indx=gather_indx, gammas=None)
    gate, up = intermediate_cache1.view(-1, N).float().chunk(2, dim=-1)
    intermediate_cache2 = (torch.nn.functional.silu(gate) * up).to(hidden_states.dtype)
    return mo.matmul_ogs(intermediate_cache2, w2, None, routing_data, scatter_indx=scatter_indx,
                         gammas=routing_data.gate_scal)


def sglang_fused_experts_with_bias(prefix, hidden_states, w1, w1_pcg, b1, w2, w2_pcg, b2, routing_data, gather_indx,
                                   scatter_indx):
    """SGLang's triton_kernel_fused_experts_with_bias (gpt-oss): the fused SwiGLU with reduction_n in FnSpecs."""
    mo, swiglu = library(prefix, "matmul_ogs", "swiglu")
    M, K = hidden_states.shape
    N, n_expts_act = w1.shape[-1], routing_data.n_expts_act
    act = mo.FusedActivation(mo.FnSpecs("swiglu", swiglu.swiglu_fn, ("alpha", "limit"), reduction_n=2),
                             (ALPHA, LIMIT))
    intermediate_cache = torch.empty((1, M * n_expts_act, N // 2), device=hidden_states.device,
                                     dtype=hidden_states.dtype)
    output = torch.empty((1, M, K), device=hidden_states.device, dtype=hidden_states.dtype)
    mo.matmul_ogs(hidden_states, w1, b1, routing_data, gather_indx=gather_indx, precision_config=w1_pcg,
                  gammas=None, fused_activation=act, y=intermediate_cache)
    mo.matmul_ogs(intermediate_cache.view(M * n_expts_act, N // 2), w2, b2, routing_data, scatter_indx=scatter_indx,
                  precision_config=w2_pcg, gammas=routing_data.gate_scal, y=output)
    return output.view(M, K)


def test_the_generation_is_told_apart_as_callers_do():
    with pytest.raises(ImportError):
        importlib.import_module(f"{OURS}.routing")  # removed in 3.6: SGLang's shim takes its 3.6 branch
    assert hasattr(importlib.import_module(f"{OURS}.tensor"), "SparseMatrix")  # vLLM's test for 3.6
    assert not hasattr(importlib.import_module("ogsgen.compat.triton_kernels.tensor"), "SparseMatrix")


def test_sglang_shim_and_bf16_moe(device):
    tokens, hidden, inter, experts, top_k = 16, 64, 32, 4, 2
    x = torch.randn(tokens, hidden, device=device).bfloat16()
    w1 = (torch.randn(experts, hidden, 2 * inter, device=device) * hidden ** -0.5).bfloat16()
    w2 = (torch.randn(experts, inter, hidden, device=device) * inter ** -0.5).bfloat16()
    logits = torch.randn(tokens, experts, device=device)
    routing = sglang_routing(OURS)(logits, top_k, sm_first=False)
    routing_data = routing[0]
    assert routing_data.expt_hist.shape == (experts,) and routing_data.gate_scal.dtype == torch.float32
    out = sglang_fused_experts(OURS, x, w1, w2, *routing)
    reference_data, gather, scatter = ogsgen.routing(logits, top_k)
    assert torch.equal(routing[1].src_indx, gather.src_indx) and torch.equal(routing[2].src_indx, scatter.src_indx)
    h = ogsgen.matmul_ogs_torch(x, w1, None, reference_data, gather).float()
    gate, up = h.chunk(2, dim=-1)
    y = ogsgen.matmul_ogs_torch(torch.nn.functional.silu(gate) * up, w2, None, reference_data, scatter_indx=scatter,
                                gammas=reference_data.gate_scal, precision_config=ogsgen.PrecisionConfig(
                                    out_dtype=torch.float32), round_y=lambda rows: rows.bfloat16().float())
    assert_close(y, out.float(), maxtol=3e-2)


def test_sglang_gpt_oss_mxfp4_moe_with_bias(device):
    t = checkpoint_moe(device)
    w13, w2, quant = vllm_prepare(OURS, t)  # SGLang's mxfp4 loading swizzles as vLLM's does
    w1_pcg, w2_pcg = quant["w1_precision"], quant["w2_precision"]
    router_logits = (t["x"] @ t["wg"]).float() + t["bg"]
    routing = sglang_routing(OURS)(router_logits, 2)
    out = sglang_fused_experts_with_bias(OURS, t["x"], w13, w1_pcg, t["w13_bias"], w2, w2_pcg, t["w2_bias"],
                                         *routing)
    assert_close(reference_layer(t, ogsgen.routing(router_logits, 2)), out.float(), maxtol=3e-2)


# ------------------------------------------------------------------ vLLM's 3.6 branch

def vllm_make_routing_data(prefix, topk_ids, topk_weights, num_local_experts):
    """vLLM's make_routing_data on triton_kernels >= 3.6: a packed Bitmatrix(dtype=BIT), a SparseMatrix and its
    metadata; the histogram passed as the metadata's ``block_sizes``, as vLLM does."""
    (tensor,) = library(prefix, "tensor")
    topk_ids, topk_weights = topk_ids.to(torch.int16), topk_weights.to(torch.bfloat16)
    n_rows, num_topk = topk_ids.size()
    words = pack_bitmatrix(topk_ids, num_local_experts)
    bitmatrix = tensor.Bitmatrix(words, dtype=tensor.BIT, shape=[n_rows, words.shape[1] * 32],
                                 shape_max=[n_rows, None])
    topk_weights = torch.where(topk_ids == -1, -1.0, topk_weights)
    sparse_logits = tensor.SparseMatrix(indx=topk_ids, vals=topk_weights, mask=bitmatrix)
    return routing_from_sparse(prefix, sparse_logits, num_local_experts, num_topk, "block_sizes")


def vllm_moe_forward(prefix, hidden_states, w1, w2, gating_output, topk, quant):
    """vLLM's triton_kernel_moe_forward on 3.6 (renormalize=True): topk's SparseMatrix, make_routing_data, and
    triton_kernel_fused_experts."""
    (topk_module,) = library(prefix, "topk")
    topk_result = topk_module.topk(gating_output, topk, apply_softmax=True)
    topk_ids = topk_result.indx.to(torch.long)
    routing_data, gather_indx, scatter_indx = vllm_make_routing_data(prefix, topk_ids, topk_result.vals,
                                                                     gating_output.shape[-1])
    return vllm_fused_experts(prefix, hidden_states, w1, w2, routing_data, gather_indx, scatter_indx, topk, quant)


def test_vllm_v36_gpt_oss_mxfp4_path(default_layout, device):
    t = checkpoint_moe(device)
    w13, w2, quant = vllm_prepare(OURS, t, sm90=default_layout == "hopper")  # on Hopper: padded scales
    gating_output = (t["x"] @ t["wg"]).float() + t["bg"]
    out = vllm_moe_forward(OURS, t["x"], w13, w2, gating_output, 2, quant)
    assert_close(reference_layer(t, gate_weights_routing(gating_output, 2)), out.float(), maxtol=3e-2)


def test_sparse_matrix_metadata_and_ragged_metadata(device):
    topk_module, tensor, ragged = library(OURS, "topk", "tensor", "tensor_details.ragged_tensor")
    logits = torch.randn(6, 5, device=device)
    sparse = topk_module.topk(logits, 2)
    ids, scores = ogsgen.moe.select_experts(logits, 2)
    assert sparse.indx.dtype == torch.int16 and torch.equal(sparse.indx.int(), ids)
    assert_close(torch.softmax(scores, -1), sparse.vals)
    assert sparse.mask.shape == [6, 32] and sparse.mask.storage.data.dtype == torch.uint32
    routing_data, gather, scatter = ogsgen.routing(logits, 2)
    meta = sparse.mask_metadata
    assert meta.col_sum.tolist() == routing_data.expt_hist.tolist() + [0] * 27  # 32 experts: one bitmatrix word
    assert torch.equal(meta.col_sorted_indx, gather.src_indx) and torch.equal(meta.row_sorted_indx, scatter.src_indx)
    ragged_meta = ragged.make_ragged_tensor_metadata(meta.col_sum, 12)
    assert ragged_meta.n_slices == 32 and ragged_meta.block_sizes() == [16, 32, 64, 128]
    expected = ogsgen.moe.make_ragged_tensor_metadata_torch(meta.col_sum, 12)
    assert torch.equal(ragged_meta.block_schedule_data, expected.block_schedule_data)
    # without softmax: the chosen logits themselves
    assert_close(scores, topk_module.topk(logits, 2, apply_softmax=False).vals)


@pytest.mark.usefixtures("host_checks")
def test_routing_data_rebuilt_from_the_metadata(device):
    mo, tensor = library(OURS, "matmul_ogs", "tensor")
    hist = torch.tensor([3, 0, 2, 1] + [0] * 28, dtype=torch.int32, device=device)
    meta = tensor.make_ragged_tensor_metadata(hist, 6)
    gate_scal = torch.rand(6, device=device).bfloat16()
    routing_data = mo.RoutingData(gate_scal, meta.block_sizes, 4, 1, meta)
    assert routing_data.expt_hist.tolist() == [3, 0, 2, 1] and routing_data.expt_data.n_slices == 4
    assert routing_data.gate_scal.dtype == torch.float32 and torch.equal(routing_data.gate_scal, gate_scal.float())
    assert mo.RoutingData(gate_scal, meta.slice_sizes, 4, 1, meta).expt_data is routing_data.expt_data  # made once
    hist[5] = 1  # a row routed to an expert past the weights'
    with pytest.raises(SpecError, match=r"routes rows to experts past the weights' 4: slice_sizes\[4:\]"):
        mo.RoutingData(gate_scal, None, 4, 1, tensor.make_ragged_tensor_metadata(hist, 7))


@pytest.mark.usefixtures("host_checks")
def test_unsupported_and_wrong_arguments_are_refused_by_name(device):
    mo, topk_module, swiglu, tensor = library(OURS, "matmul_ogs", "topk", "swiglu", "tensor")
    with pytest.raises(SpecError, match=r"folds 2 columns into one \(reduction_n=2\); pass reduction_n=2"):
        mo.FnSpecs("swiglu", swiglu.swiglu_fn, ("alpha", "limit"))  # the default reduction_n=1
    logits = torch.randn(8, 4, device=device)
    for kwargs, name in (({"n_rows": 4}, "n_rows"), ({"all_gather": True}, "all_gather"),
                         ({"symm_mem_pool": object()}, "symm_mem_pool")):
        with pytest.raises(UnsupportedError, match=name):
            topk_module.topk(logits, 2, **kwargs)
    with pytest.raises(SpecError, match="topk: dim=0; the experts are x's columns, dim=1"):
        topk_module.topk(logits, 2, dim=0)
    sparse = topk_module.topk(logits, 2)
    with pytest.raises(SpecError, match="SparseMatrix.mask does not hold the experts of the ids"):
        tensor.SparseMatrix(indx=sparse.indx.flip(0), vals=sparse.vals, mask=sparse.mask)


@pytest.mark.gpu
def test_same_code_on_triton_kernels_36_and_ogsgen():
    tensor = pytest.importorskip("triton_kernels.tensor", reason="triton_kernels is not importable")
    if not hasattr(tensor, "SparseMatrix") or importlib.util.find_spec("triton_kernels.matmul_ogs") is None:
        pytest.skip("the importable triton_kernels is not 3.6 (SparseMatrix and matmul_ogs)")
    t = checkpoint_moe("cuda", tokens=256, hidden=512, inter=256, experts=8)
    gating_output = (t["x"] @ t["wg"]).float() + t["bg"]
    reference = reference_layer(t, gate_weights_routing(gating_output, 4))
    for prefix in ("triton_kernels", OURS):
        w13, w2, quant = vllm_prepare(prefix, t)
        out = vllm_moe_forward(prefix, t["x"], w13, w2, gating_output, 4, quant)
        assert_close(reference, out.float(), maxtol=3e-2, what=prefix)
