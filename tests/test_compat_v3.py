"""ogsgen.compat.triton_kernels_v3 (triton_kernels' ``matmul`` generation): upstream's bench_mlp layer (on one GPU)
and a tokenspeed-style layer (gather and scatter index tensors, then the top-k sum), written here from their call
patterns, run on ogsgen against the torch reference; results as this generation gives them (a row per (token,
expert) pair, then ``reduce``), and the fused top-k sum of ``n_expts_act=k``. On a GPU with the ``matmul``
generation of triton_kernels importable the same code runs on both libraries."""
import pytest
import torch

import ogsgen
from compat_layers import ALPHA, LIMIT, checkpoint_moe, library, reference_layer, vllm_prepare
from ogsgen.errors import SpecError, UnsupportedError
from ogsgen.numerics import dequantize_mx_torch, quantize_mx_torch
from ogsgen.testing import assert_close

OURS = "ogsgen.compat.triton_kernels_v3"
FP32 = ogsgen.PrecisionConfig(out_dtype=torch.float32)


# ------------------------------------------------------------------ upstream's bench/bench_mlp.py, on one GPU

def bench_quantize_weight(prefix, w, mx4, **opt):
    """bench_mlp's quantize_weight: bf16 stored K-contiguous, or mxfp4 along K in the given layouts."""
    mxfp, tensor, numerics = library(prefix, "numerics_details.mxfp", "tensor", "numerics")
    if not mx4:
        return w.to(torch.bfloat16).transpose(-1, -2).contiguous().transpose(-1, -2), numerics.InFlexData(), None
    w, w_scale = mxfp.downcast_to_mxfp(w.to(torch.bfloat16), torch.uint8, axis=1)
    if opt:
        w = tensor.convert_layout(tensor.wrap_torch_tensor(w, dtype=tensor.FP4), opt["value_layout"],
                                  **opt["value_layout_opts"])
        w_scale = tensor.convert_layout(tensor.wrap_torch_tensor(w_scale), opt["scale_layout"],
                                        **opt["scale_layout_opts"])
    return w, numerics.InFlexData(), w_scale


def bench_run_mlp(prefix, x, wg, bg, pcg, w1, b1, pc1, act1, w2, b2, pc2, n_expts_act):
    """bench_mlp's run_mlp with one rank: convert_dp_to_ep / convert_ep_to_dp (NVLink all-to-alls there) are the
    dispatch and combine row gathers here."""
    mm, reduce_module, topk_module, tensor = library(prefix, "matmul", "reduce", "topk", "tensor")
    logits = mm.matmul(x, wg, bg, precision_config=pcg)
    active = topk_module.topk(logits, n_expts_act, apply_softmax=True)
    expt_sizes = active.mask_metadata.col_sum
    dispatch_indx = active.mask_metadata.row_sorted_indx
    combine_indx = active.mask_metadata.col_sorted_indx
    x_metadata = tensor.make_ragged_tensor_metadata(expt_sizes, dispatch_indx.shape[0])
    y = x[combine_indx.long() // n_expts_act]  # expert-sorted rows
    y = mm.matmul(y, w1, b1, a_ragged_metadata=x_metadata, precision_config=pc1, fused_activation=act1)
    y = mm.matmul(y, w2, b2, a_ragged_metadata=x_metadata, precision_config=pc2)
    y = y[dispatch_indx.long()]  # token-major rows
    y = y.view(-1, n_expts_act, y.shape[-1])
    z, _ = reduce_module.reduce(y, dim=1)
    return logits, z


def test_bench_mlp_layer(device):
    check_bench_mlp_layer(False, device)


def check_bench_mlp_layer(mx4, device):
    mm, layout, swiglu = library(OURS, "matmul", "tensor_details.layout", "swiglu")
    tokens, dim1, dim2, experts, k = 16, 64, 64, 4, 2
    x = torch.randn(tokens, dim1, device=device).bfloat16()
    wg_dense, bg = torch.randn(dim1, experts, device=device) * dim1 ** -0.5, torch.randn(experts, device=device)
    w1_dense = torch.randn(experts, dim1, dim2, device=device) * dim1 ** -0.5
    w2_dense = torch.randn(experts, dim2 // 2, dim1, device=device) * (dim2 // 2) ** -0.5
    b1, b2 = torch.randn(experts, dim2, device=device), torch.randn(experts, dim1, device=device)
    opt = {}
    if mx4:
        value_layout, value_layout_opts = layout.make_default_matmul_mxfp4_w_layout(mx_axis=1)
        scale_layout, scale_layout_opts = layout.make_default_matmul_mxfp4_w_scale_layout(mx_axis=1, num_warps=4)
        opt = {"value_layout": value_layout, "value_layout_opts": value_layout_opts, "scale_layout": scale_layout,
               "scale_layout_opts": scale_layout_opts}
    wg, wg_flex, wg_scale = bench_quantize_weight(OURS, wg_dense, False)
    w1, w1_flex, w1_scale = bench_quantize_weight(OURS, w1_dense, mx4, **opt)
    w2, w2_flex, w2_scale = bench_quantize_weight(OURS, w2_dense, mx4, **opt)
    pcg = mm.PrecisionConfig(flex_ctx=mm.FlexCtx(rhs_data=wg_flex), b_mx_scale=wg_scale)
    pc1 = mm.PrecisionConfig(flex_ctx=mm.FlexCtx(rhs_data=w1_flex), b_mx_scale=w1_scale)
    pc2 = mm.PrecisionConfig(flex_ctx=mm.FlexCtx(rhs_data=w2_flex), b_mx_scale=w2_scale)
    act1 = mm.FusedActivation(mm.FnSpecs("swiglu", swiglu.swiglu_fn, ("alpha", "limit"), reduction_n=2), (1.0, 1.0))
    logits, z = bench_run_mlp(OURS, x, wg, bg, pcg, w1, b1, pc1, act1, w2, b2, pc2, k)
    assert_close(x.float() @ wg.float() + bg, logits.float(), what="router logits")

    def decoded(w):
        return dequantize_mx_torch(*quantize_mx_torch(w.bfloat16(), "e2m1", axis=1), "e2m1", axis=1) if mx4 \
            else w.bfloat16().float()
    routing_data, gather, scatter = ogsgen.routing(logits.float(), k)
    h = ogsgen.matmul_ogs_torch(x, decoded(w1_dense), b1, routing_data, gather,
                                fused_activation=ogsgen.FusedActivation(ogsgen.swiglu, (1.0, 1.0)))
    reference = ogsgen.matmul_ogs_torch(h, decoded(w2_dense), b2, routing_data, scatter_indx=scatter,
                                        precision_config=FP32, round_y=lambda rows: rows.bfloat16().float())
    assert z.shape == (tokens, dim1) and z.dtype == torch.bfloat16
    assert_close(reference, z.float(), maxtol=3e-2)


# ------------------------------------------------------------------ a tokenspeed-style layer: index tensors

def mxfp4_weights(prefix, quant_tensor, scale):
    """Checkpoint (E, out, in // 2) mxfp4 values and scales wrapped in the newest triton_kernels' form: layouts as
    instances, convert_layout without options."""
    tensor, layout, numerics = library(prefix, "tensor", "tensor_details.layout", "numerics")
    value_layout = layout.make_default_matmul_mxfp4_w_layout(mx_axis=-2)
    scale_layout = layout.make_default_matmul_mxfp4_w_scale_layout(mx_axis=-2, num_warps=8)
    w = tensor.convert_layout(tensor.wrap_torch_tensor(quant_tensor.transpose(-2, -1), dtype=tensor.FP4),
                              value_layout)
    return w, numerics.InFlexData(), tensor.convert_layout(tensor.wrap_torch_tensor(scale.transpose(-2, -1)),
                                                           scale_layout)


def index_routing(prefix, logits, top_k):
    """Routing as plain index tensors: x's row and the output row (the gate) of each expert-sorted row."""
    topk_module, tensor = library(prefix, "topk", "tensor")
    sparse = topk_module.topk(logits, top_k, apply_softmax=True)
    col_sorted = sparse.mask_metadata.col_sorted_indx
    metadata = tensor.make_ragged_tensor_metadata(sparse.mask_metadata.col_sum, logits.shape[0] * top_k)
    return metadata, col_sorted // top_k, col_sorted, sparse.vals.reshape(-1)[col_sorted]


def index_layer(prefix, t, logits, top_k, fused_sum=False):
    mm, swiglu, reduce_module = library(prefix, "matmul", "swiglu", "reduce")
    w13, w13_flex, w13_scale = mxfp4_weights(prefix, t["w13"], t["w13_scale"])
    w2, w2_flex, w2_scale = mxfp4_weights(prefix, t["w2"], t["w2_scale"])
    pc1 = mm.PrecisionConfig(flex_ctx=mm.FlexCtx(rhs_data=w13_flex), b_mx_scale=w13_scale, b_microblock_size=32)
    pc2 = mm.PrecisionConfig(flex_ctx=mm.FlexCtx(rhs_data=w2_flex), b_mx_scale=w2_scale, b_microblock_size=32)
    metadata, gather_indx, scatter_indx, gate_scal = index_routing(prefix, logits, top_k)
    act = mm.FusedActivation(mm.FnSpecs("swiglu", swiglu.swiglu_fn, ("alpha", "limit"), reduction_n=2),
                             (1.702, 7.0))
    h = mm.matmul(t["x"], w13, t["w13_bias"], a_ragged_metadata=metadata, gather_indx=gather_indx,
                  precision_config=pc1, fused_activation=act)
    if fused_sum:  # the one-line change to ogsgen's fused top-k sum
        return mm.matmul(h, w2, t["w2_bias"], a_ragged_metadata=metadata, precision_config=pc2,
                         scatter_indx=scatter_indx, gammas=gate_scal, n_expts_act=top_k)
    y = mm.matmul(h, w2, t["w2_bias"], a_ragged_metadata=metadata, precision_config=pc2, scatter_indx=scatter_indx,
                  gammas=gate_scal)
    assert y.shape == (t["x"].shape[0] * top_k, t["x"].shape[1])  # a row per (token, expert) pair
    return reduce_module.reduce(y.view(-1, top_k, y.shape[-1]), dim=1)[0]


@pytest.mark.parametrize("fused_sum", [False, True])
def test_index_tensor_layer(fused_sum, device):
    t = checkpoint_moe(device)
    logits = (t["x"] @ t["wg"]).float() + t["bg"]
    out = index_layer(OURS, t, logits, 2, fused_sum)
    assert out.shape == t["x"].shape and out.dtype == torch.bfloat16
    assert_close(reference_layer(t, ogsgen.routing(logits, 2)), out.float(), maxtol=3e-2)


def test_gathers_ogsgen_cannot_read_in_place_are_copied(device):
    # One call with a gather of top-k rows and a scatter of one row each: the kernel reads a gather whose rows
    # repeat k times as gates of k slots, and this scatter has one slot; the rows are gathered first.
    mm, = library(OURS, "matmul")
    t = checkpoint_moe(device, tokens=8)
    w13 = t["w13_ref"].bfloat16()  # bf16 weights (E, K, N)
    logits = torch.randn(8, 4, device=device)
    metadata, gather_indx, scatter_indx, _ = index_routing(OURS, logits, 2)
    y = mm.matmul(t["x"], w13, None, a_ragged_metadata=metadata, gather_indx=gather_indx, scatter_indx=scatter_indx)
    routing_data, gather, scatter = ogsgen.routing(logits, 2)
    sorted_rows = ogsgen.matmul_ogs_torch(t["x"], w13, None, routing_data, gather, precision_config=FP32)
    assert_close(sorted_rows[scatter.src_indx.long()], y.float())  # row g: gate g's product
    # a gather of another length than a multiple of x's rows, every row to expert 0
    rows = gather_indx[:10]
    few = ogsgen.moe.make_ragged_tensor_metadata(torch.tensor([10, 0, 0, 0], dtype=torch.int32, device=device), 10)
    y = mm.matmul(t["x"], w13, None, a_ragged_metadata=few, gather_indx=rows)
    assert_close(t["x"][rows.long()].float() @ w13[0].float(), y.float())


@pytest.mark.parametrize("n_expts_act", [1, 2], ids=["direct-scatter", "fused-sum"])
def test_a_scatter_writes_rows_of_minus_one_nowhere(n_expts_act, device):
    """scatter_indx[p] = -1 ("-1: none" in matmul's docstring): sorted row p is written nowhere. Its kernel store is
    masked (row -1 of c is the guard row before it in the buffer here, which must stay as it was)."""
    mm, tensor = library(OURS, "matmul", "tensor")
    hist = torch.tensor([3, 0, 2, 3], dtype=torch.int32, device=device)
    metadata = tensor.make_ragged_tensor_metadata(hist, 8)
    a, w = torch.randn(8, 32, device=device).bfloat16(), torch.randn(4, 32, 16, device=device).bfloat16()
    rows_out = torch.tensor([3, -1, 0, 7, -1, 5, 1, 2], device=device)
    experts = torch.repeat_interleave(torch.arange(4, device=device), hist.long())
    products = torch.einsum("pk,pkn->pn", a.double(), w[experts].double())
    want = torch.zeros(8 // n_expts_act, 16, dtype=torch.float64, device=device)
    kept = rows_out >= 0
    want.index_add_(0, rows_out[kept] // n_expts_act, products[kept])
    buffer = torch.full((8 // n_expts_act + 2, 16), 7.0, device=device).bfloat16()  # a guard row either side of c
    c = buffer[1:-1]
    y = mm.matmul(a, w, None, a_ragged_metadata=metadata, scatter_indx=rows_out, c=c, n_expts_act=n_expts_act)
    assert y.data_ptr() == c.data_ptr()
    assert_close(want, y.float())
    assert (buffer[0] == 7).all() and (buffer[-1] == 7).all()


def test_dense_batched_and_ragged_k_calls(device):
    mm, tensor = library(OURS, "matmul", "tensor")
    a, b = torch.randn(12, 32, device=device).bfloat16(), torch.randn(32, 48, device=device).bfloat16()
    gammas = torch.rand(12, device=device).bfloat16()  # any float dtype, as triton_kernels' kernels read
    assert_close((a.float() @ b.float()) * gammas.float()[:, None], mm.matmul(a, b, None, gammas=gammas).float())
    a3, b3 = torch.randn(2, 12, 32, device=device).bfloat16(), torch.randn(2, 32, 48, device=device).bfloat16()
    assert_close(a3.float() @ b3.float(), mm.matmul(a3, b3, None).float())
    # ragged K: per-expert weight gradients, dW[e] = X[:, slice e] @ dY[slice e]
    hist = torch.tensor([5, 0, 11, 16], dtype=torch.int32, device=device)
    metadata = tensor.make_ragged_tensor_metadata(hist, 32)
    x, dy = torch.randn(24, 32, device=device).bfloat16(), torch.randn(32, 40, device=device).bfloat16()
    dw = mm.matmul(x, dy, None, a_ragged_metadata=metadata, b_ragged_metadata=metadata)
    starts = [0, 5, 5, 16, 32]
    expected = torch.stack([x[:, lo:hi].float() @ dy[lo:hi].float() for lo, hi in zip(starts, starts[1:])])
    assert dw.shape == (4, 24, 40)
    assert_close(expected, dw.float())


def test_mxfp8_activations_through_a_mx_scale(device):
    """Generation 3's microscaled activations: a in e4m3 with its e8m0 scales as a_mx_scale, as ogsgen's act_scale."""
    mm, = library(OURS, "matmul")
    x, b = torch.randn(12, 64, device=device), torch.randn(64, 48, device=device).bfloat16()
    values, scales = quantize_mx_torch(x, "e4m3", axis=-1)
    y = mm.matmul(values, b, None, precision_config=mm.PrecisionConfig(a_mx_scale=scales))
    assert_close(dequantize_mx_torch(values, scales, "e4m3").double() @ b.double(), y.float())


def test_reduce(device):
    reduce_module, = library(OURS, "reduce")
    x = torch.randn(5, 3, 8, device=device).bfloat16()
    mask = torch.randint(0, 2, (5, 3, 1), device=device)
    scale = torch.rand(5, 3, 1, device=device)
    y, mx = reduce_module.reduce(x, dim=1, mask=mask, scale=scale)
    assert mx is None and y.dtype == torch.bfloat16
    assert_close((x.float() * scale * mask).sum(1), y.float())
    out = torch.empty(3, 8, device=device)
    assert reduce_module.reduce(x, 0, y=out)[0] is out
    assert_close(x.float().sum(0), out)
    with pytest.raises(UnsupportedError, match="reduce: x_mxscale"):
        reduce_module.reduce(x, 1, x_mxscale=torch.zeros(5, 3, 1, dtype=torch.uint8, device=device))
    with pytest.raises(SpecError, match="reduce: x must be a 3-D tensor"):
        reduce_module.reduce(x[0], 1)


@pytest.mark.usefixtures("host_checks")
def test_unsupported_and_wrong_arguments_are_refused_by_name(device):
    mm, tensor = library(OURS, "matmul", "tensor")
    with pytest.raises(UnsupportedError, match="pass an ogsgen.FusedComm"):
        mm.FusedComm(None, None, None)
    with pytest.raises(UnsupportedError, match="remap_ragged_tensor_metadata"):
        tensor.remap_ragged_tensor_metadata(None, None)
    a, w = torch.randn(8, 32, device=device).bfloat16(), torch.randn(4, 32, 16, device=device).bfloat16()
    rows = torch.arange(8, device=device)
    with pytest.raises(UnsupportedError, match="gather_indx, scatter_indx and n_expts_act go with a_ragged_metadata"):
        mm.matmul(a, w[0], None, gather_indx=rows)
    metadata = tensor.make_ragged_tensor_metadata(torch.tensor([2, 2, 2, 2], dtype=torch.int32, device=device), 8)
    with pytest.raises(SpecError, match="n_expts_act=2 sums the scattered rows of each token: it needs scatter_indx"):
        mm.matmul(a, w, None, a_ragged_metadata=metadata, n_expts_act=2)
    with pytest.raises(SpecError, match="gather_indx names an x row more than 2 times"):
        mm.matmul(a[:4], w, None, a_ragged_metadata=metadata, gather_indx=torch.tensor([0, 0, 0, 1, 1, 2, 2, 3],
                                                                                       device=device))
    with pytest.raises(SpecError, match=r"scatter_indx must hold output rows in \[0, 8\)"):
        mm.matmul(a, w, None, a_ragged_metadata=metadata, scatter_indx=rows + 1)
    with pytest.raises(SpecError, match="scatter_indx must name the output row of each of the call's 8 rows"):
        mm.matmul(a, w, None, a_ragged_metadata=metadata, scatter_indx=rows[:4])
    other = tensor.make_ragged_tensor_metadata(torch.tensor([2, 2, 2, 2], dtype=torch.int32, device=device), 8)
    with pytest.raises(UnsupportedError, match="a_ragged_metadata and b_ragged_metadata are two metadata"):
        mm.matmul(a.mT, a, None, a_ragged_metadata=metadata, b_ragged_metadata=other)
    for kwargs, name in (({"b_microblock_size": 16}, "b_microblock_size=16"),
                         ({"c_value_pack_factor": 2}, "c_value_pack_factor=2")):
        with pytest.raises(UnsupportedError, match=name):
            mm.matmul(a, w[0], None, precision_config=mm.PrecisionConfig(**kwargs))


@pytest.mark.gpu
def test_same_code_on_triton_kernels_matmul_and_ogsgen():
    pytest.importorskip("triton_kernels.matmul", reason="the matmul generation of triton_kernels is not importable")
    t = checkpoint_moe("cuda", tokens=256, hidden=512, inter=256, experts=8)
    logits = (t["x"] @ t["wg"]).float() + t["bg"]
    reference = reference_layer(t, ogsgen.routing(logits, 4))
    for prefix in ("triton_kernels", OURS):
        assert_close(reference, index_layer(prefix, t, logits, 4).float(), maxtol=3e-2, what=prefix)


def test_bench_mlp_layer_mxfp4(kernels_on_demand, device):
    # mxfp4 rows sorted before the matmul (no gather), with SwiGLU: variants outside the default catalog, rendered on
    # demand (the module's last tests: the fixture keeps them on for the module)
    check_bench_mlp_layer(True, device)


# ------------------------------------------------------------------ vLLM's "3.8" branch of gpt_oss_triton_kernels_moe.py

def vllm38_moe_forward(prefix, hidden_states, w1, w2, gating_output, topk, quant):
    """vLLM's triton_kernel_moe_forward on this generation (renormalize=True): topk, the ragged metadata of its
    column sums, x's rows gathered in expert order (order // topk), the two matmuls (the gate weights applied by the
    second), then the top-k combine by index_add."""
    mm, swiglu, topk_module, tensor = library(prefix, "matmul", "swiglu", "topk", "tensor")
    sparse = topk_module.topk(gating_output, topk, apply_softmax=True)
    order = sparse.mask_metadata.col_sorted_indx
    ragged = tensor.make_ragged_tensor_metadata(sparse.mask_metadata.col_sum, order.shape[0])
    gather_tok = (order // topk).to(torch.int32)
    gammas = sparse.vals.reshape(-1).to(torch.float32)[order]
    act = mm.FusedActivation(mm.FnSpecs("swiglu", swiglu.swiglu_fn, ("alpha", "limit"), reduction_n=2),
                             (ALPHA, LIMIT))
    inter = mm.matmul(hidden_states, w1, quant["w1_bias"], ragged, None, gather_tok, None, quant["w1_precision"],
                      fused_activation=act)
    y = mm.matmul(inter, w2, quant["w2_bias"], ragged, None, None, None, quant["w2_precision"], gammas=gammas)
    acc = torch.zeros(hidden_states.shape, dtype=torch.float32, device=hidden_states.device)
    acc.index_add_(0, gather_tok.to(torch.int64), y.to(torch.float32))
    return acc.to(hidden_states.dtype)


def test_vllm_38_gpt_oss_mxfp4_path(default_layout, kernels_on_demand, device):
    # Its mxfp4 second matmul (ragged, gate weights, no scatter) is outside the default catalog: rendered on demand
    t = checkpoint_moe(device)
    w13, w2, quant = vllm_prepare(OURS, t, sm90=default_layout == "hopper")  # on Hopper: padded scales
    gating_output = (t["x"] @ t["wg"]).float() + t["bg"]
    out = vllm38_moe_forward(OURS, t["x"], w13, w2, gating_output, 2, quant)
    assert out.shape == t["x"].shape and out.dtype == torch.bfloat16
    assert_close(reference_layer(t, ogsgen.routing(gating_output, 2)), out.float(), maxtol=3e-2)
