"""Mixture of experts: routing metadata, ragged matmul with gather/scatter, top-k combine, split K."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ogsgen
from ogsgen.codegen import build
from ogsgen.runtime import loader
from ogsgen.moe import (gather_rows, make_ragged_tensor_metadata, make_ragged_tensor_metadata_torch, routing,
                        routing_from_topk, routing_from_topk_torch, routing_torch)
from ogsgen.spec import BF16, FP16, FP32, Catalog, KernelVariant, default_catalog, variant_product
from ogsgen.spec.catalog import _expand
from cases import run_moe_case
from ogsgen.testing import assert_close

DEFAULT = default_catalog().by_name()


@pytest.fixture(scope="module", autouse=True)
def moe_test_kernels(tmp_path_factory):
    """Every combination of the MoE features the tests use (more than the default catalog ships)."""
    variants = [
        *variant_product([(FP16, FP16, FP16), (BF16, BF16, BF16)], activations=(None, ogsgen.swiglu),
                         ragged=(True,), gather=(False, True), scatter=(False, True), bias=(False, True),
                         gammas=(False, True)),
        *variant_product([(FP16, FP16, FP16), (FP32, FP32, FP32)], ragged=(True,), gather=(False, True),
                         betas=(True,), bias=(True,), y_acc_in=(True,)),
        *variant_product([(FP16, FP16, FP32)], ragged=(True,), gather=(False, True), scatter=(False, True),
                         bias=(True,)),
    ]
    out = tmp_path_factory.mktemp("moe_kernels")
    build(Catalog("moe_tests", _expand(variants, "moe_tests")), out)
    ogsgen.add_search_path(out)


def _routing_equal(a, b):
    (rd_a, gi_a, si_a), (rd_b, gi_b, si_b) = a, b
    assert torch.equal(rd_a.expt_hist, rd_b.expt_hist)
    for field in ("slice_sizes", "slice_offs", "block_offs_data", "block_schedule_data"):
        assert torch.equal(getattr(rd_a.expt_data, field), getattr(rd_b.expt_data, field)), field
    for got, want in ((gi_a, gi_b), (si_a, si_b)):
        assert torch.equal(got.src_indx, want.src_indx) and torch.equal(got.dst_indx, want.dst_indx)
    torch.testing.assert_close(rd_a.gate_scal, rd_b.gate_scal, atol=0, rtol=0)


# ---------------------------------------------------------------- routing

@pytest.mark.parametrize("n_tokens,n_expts,k", [(1, 4, 1), (5, 8, 3), (7, 256, 8), (255, 128, 4), (256, 8, 2),
                                                (371, 128, 32), (1023, 64, 6),
                                                pytest.param(4096, 256, 8, marks=pytest.mark.slow),
                                                pytest.param(911, 1500, 8, marks=pytest.mark.slow)])  # (8 s on a CPU)
@pytest.mark.parametrize("sm_first", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_routing_matches_reference(n_tokens, n_expts, k, sm_first, device):
    logits = torch.randn(n_tokens, n_expts, device=device)
    _routing_equal(routing(logits, k, sm_first=sm_first), routing_torch(logits, k, sm_first=sm_first))


def test_routing_skewed_and_empty_experts(device):
    logits = torch.randn(300, 64, device=device)
    logits[:, :3] += 8.0           # three hot experts
    logits[:, 40:] -= 100.0        # experts nobody picks
    result = routing(logits, 4)
    _routing_equal(result, routing_torch(logits, 4))
    hist = result[0].expt_hist
    assert (hist[40:] == 0).all() and hist[:3].min() > 200 and int(hist.sum()) == 1200


def test_routing_given_expert_ids(device):
    logits = torch.randn(50, 16, device=device)
    ids = torch.stack([torch.randperm(16, device=device)[:3] for _ in range(50)])
    _routing_equal(routing(logits, 3, expt_indx=ids), routing_torch(logits, 3, expt_indx=ids))


@pytest.mark.parametrize("n_tokens,n_expts,k,drop", [(64, 16, 1, 0.3), (64, 16, 4, 0.5), (9, 128, 3, 0.2),
                                                     (200, 8, 8, 0.0), (33, 4, 2, 1.0)])
def test_routing_from_topk_with_dropped_gates(n_tokens, n_expts, k, drop, device):
    weights, ids = torch.topk(torch.rand(n_tokens, n_expts, device=device), k, dim=-1)
    ids = torch.where(torch.rand(ids.shape, device=device) < drop, -1, ids).int()
    result = routing_from_topk(ids, weights, n_expts)
    _routing_equal(result, routing_from_topk_torch(ids, weights, n_expts))
    n_kept = int((ids >= 0).sum())
    assert int(result[0].expt_hist.sum()) == n_kept
    assert (result[1].src_indx[n_kept:] == -1).all() and (result[2].src_indx[ids.reshape(-1) < 0] == -1).all()


def test_metadata_example(device):
    hist = torch.tensor([15, 17, 0, 127], dtype=torch.int32, device=device)
    meta = make_ragged_tensor_metadata(hist, 159)
    assert meta.slice_offs.tolist() == [0, 15, 32, 32, 159]
    assert meta.block_offs(16).tolist() == [0, 1, 3, 3, 11]
    schedule = meta.block_schedule(16).tolist()
    assert schedule[:11] == [0, 1, (1 << 16) | 1] + [(b << 16) | 3 for b in range(8)]
    assert set(schedule[11:]) == {-1}
    ref = make_ragged_tensor_metadata_torch(hist, 159)
    assert torch.equal(meta.block_schedule_data, ref.block_schedule_data)


@pytest.mark.parametrize("n_tokens,k_act,width,transposed", [(37, 4, 300, False), (5, 1, 16, False),
                                                                 (20, 3, 520, True)])
def test_gather_rows_copies_each_gates_token_row(n_tokens, k_act, width, transposed, device):
    # Row counts and widths with tails of the copy's tiles; a transposed x (K stride not 1); dropped gates.
    x = torch.randn(width, n_tokens, device=device).mT if transposed else torch.randn(n_tokens, width, device=device)
    gates = torch.randperm(2 * n_tokens * k_act, device=device).to(torch.int32)[::2] // 2  # strided
    gates[::7] = -1
    copied = gather_rows(x, gates, k_act)
    live = gates >= 0
    assert copied.shape == (gates.numel(), width)
    assert torch.equal(copied[live], x[gates[live].long() // k_act])


def test_gather_rows_errors(device):
    x, gates = torch.zeros(4, 8, device=device), torch.zeros(6, dtype=torch.int32, device=device)
    with pytest.raises(ogsgen.SpecError, match=r"x must be a \(n_tokens, K\) tensor, got \(4, 8, 1\)"):
        gather_rows(x[..., None], gates, 2)
    with pytest.raises(ogsgen.SpecError, match="gate_indx must be a 1-D int32 tensor .*torch.int64"):
        gather_rows(x, gates.long(), 2)
    with pytest.raises(ogsgen.SpecError, match="n_expts_act must be a positive int .*got 0"):
        gather_rows(x, gates, 0)


def test_routing_errors(device):
    with pytest.raises(ogsgen.SpecError, match=r"n_expts_act must be an int in \[1, n_expts_tot=4\]"):
        routing(torch.randn(3, 4, device=device), 5)
    with pytest.raises(ogsgen.SpecError, match="topk_weights must be a tensor of topk_ids' shape"):
        routing_from_topk(torch.zeros(3, 2, dtype=torch.int32), torch.zeros(3, 1), 4)
    with pytest.raises(ogsgen.SpecError, match="topk_ids must hold integer expert ids"):
        routing_from_topk(torch.zeros(3, 2), torch.zeros(3, 2), 4)


# ---------------------------------------------------------------- ragged matmul

def _variant(dtype=FP16, **features):
    return KernelVariant(dtype, dtype, dtype, ragged=True, **features)


# Upstream's non-mx ragged cases (matmul_ogs_semantics.md §5.2) at CPU-sized shapes:
# (tokens, n, k, E, k_act, split_k).
UPSTREAM = [(16, 64, 64, 128, 4, None), (16, 64, 64, 128, 4, 3), (16, 64, 64, 3, 1, None), (64, 64, 64, 4, 1, None),
            (64, 64, 64, 4, 1, 3), (75, 48, 40, 1, 1, None), (125, 48, 40, 3, 1, None), (60, 72, 70, 8, 2, None),
            (60, 72, 70, 8, 2, 9)]


@pytest.mark.slow
@pytest.mark.parametrize("tokens,n,k,n_expts,k_act,split_k", UPSTREAM)
@pytest.mark.parametrize("gather,scatter", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("gammas", [False, True])
def test_upstream_ragged_cases(tokens, n, k, n_expts, k_act, split_k, gather, scatter, gammas, device):
    if split_k and scatter and k_act == 1:
        pytest.skip("split K with a one-gate scatter is rejected (test_split_k_with_direct_scatter_is_rejected)")
    variant = _variant(gather=gather, scatter=scatter, bias=True, gammas=gammas)
    with ogsgen.opt_flags_constraints(block_m=16, block_k=16, block_n=32):
        run_moe_case(variant, tokens, n, k, n_expts, k_act, device, split_k=split_k)


@pytest.mark.parametrize("k_act", [pytest.param(1, marks=pytest.mark.slow), 2, pytest.param(4, marks=pytest.mark.slow),
                                   pytest.param(8, marks=pytest.mark.slow)])
@pytest.mark.parametrize("dtype", [pytest.param(FP16, marks=pytest.mark.slow), BF16])
def test_gather_swiglu_then_scatter(k_act, dtype, device):
    with ogsgen.opt_flags_constraints(block_m=16, block_n=32):
        run_moe_case(_variant(dtype, gather=True, bias=True, activation=ogsgen.swiglu), 40, 64, 48, 16, k_act,
                     device)
        run_moe_case(_variant(dtype, scatter=True, bias=True, gammas=True), 40, 48, 32, 16, k_act, device)


@pytest.mark.parametrize("drop", [0.25, 1.0])
@pytest.mark.parametrize("k_act", [1, 3])
def test_dropped_gates_contribute_nothing(drop, k_act, device):
    with ogsgen.opt_flags_constraints(block_m=16, block_n=32):
        run_moe_case(_variant(gather=True, bias=True), 30, 32, 32, 8, k_act, device, drop=drop)
        run_moe_case(_variant(scatter=True, gammas=True), 30, 32, 32, 8, k_act, device, drop=drop)
        run_moe_case(_variant(gather=True, scatter=True), 30, 32, 32, 8, k_act, device, drop=drop)


@pytest.mark.parametrize("split_k", [None, pytest.param(2, marks=pytest.mark.slow), 5])
def test_fused_activation_with_split_k(split_k, device):
    variant = _variant(BF16, gather=True, bias=True, gammas=True, activation=ogsgen.swiglu)
    with ogsgen.opt_flags_constraints(block_m=16, block_k=16, block_n=32):
        run_moe_case(variant, 48, 64, 96, 4, 2, device, split_k=split_k)


@pytest.mark.parametrize("alpha,limit", [(1.1, 1.4), pytest.param(1.0, 1.2, marks=pytest.mark.slow),
                                         pytest.param(0.7, 1.0, marks=pytest.mark.slow)])
@pytest.mark.parametrize("gather,scatter", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("split_k", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_fused_activation_equals_activation_after_matmul(alpha, limit, gather, scatter, split_k, device):
    # Upstream's test_fused_act: the fused SwiGLU against SwiGLU applied to the unfused fp32 result.
    if scatter and split_k > 1:
        pytest.skip("split K with a one-gate scatter or a scatter's fused activation is rejected")
    rd, gi, si = routing(torch.randn(30, 4, device=device), 1 if scatter else 2)
    n_rows = 30 if scatter else 60
    x = torch.randn(30 if gather else n_rows, 48, device=device, dtype=torch.float16)
    w = torch.randn(4, 48, 64, device=device, dtype=torch.float16)
    bias = torch.randn(4, 64, device=device)
    kwargs = dict(gather_indx=gi if gather else None, scatter_indx=si if scatter else None)
    with ogsgen.opt_flags_constraints(block_m=16, block_n=32, block_k=16, split_k=split_k):
        fused = ogsgen.matmul_ogs(x, w, bias, rd, fused_activation=ogsgen.FusedActivation(ogsgen.swiglu, (alpha, limit)),
                                  **kwargs)
        plain = ogsgen.matmul_ogs(x, w, bias, rd, precision_config=ogsgen.PrecisionConfig(out_dtype=torch.float32),
                                  **kwargs)
    from ogsgen.testing import assert_close
    assert_close(ogsgen.swiglu_torch(plain, alpha, limit), fused.float())


@pytest.mark.parametrize("dtype", [FP16, FP32])
@pytest.mark.parametrize("gather", [False, True])
def test_y_acc_in(dtype, gather, device):
    variant = _variant(dtype, gather=gather, bias=True, betas=True, y_acc_in=True)
    with ogsgen.opt_flags_constraints(block_m=16, block_n=32):
        run_moe_case(variant, 20, 32, 24, 4, 2, device)


def test_y_acc_in_same_tensor_as_y(device, monkeypatch, tmp_path):
    # No catalog here ships the dense y_acc_in variant: generate it on demand.
    monkeypatch.setattr(loader, "_on_demand", True)
    monkeypatch.setenv("OGSGEN_CACHE_DIR", str(tmp_path))
    x = torch.randn(6, 16, device=device, dtype=torch.float16)
    w = torch.randn(16, 32, device=device, dtype=torch.float16)
    acc = torch.randn(6, 32, device=device, dtype=torch.float16)
    expected = (x.float() @ w.float() + acc.float()).half()
    y = ogsgen.matmul_ogs(x, w, None, y=acc, y_acc_in=acc)
    assert y.data_ptr() == acc.data_ptr()
    torch.testing.assert_close(y, expected, atol=2e-2, rtol=1e-2)


def test_split_k_equals_unsplit_on_dense_and_batched(device):
    for batch in (None, 3):
        lead = (batch,) if batch else ()
        x = torch.randn(lead + (20, 256), device=device, dtype=torch.float16)
        w = torch.randn(lead + (256, 48), device=device, dtype=torch.float16)
        bias, gammas = torch.randn(lead + (48,), device=device), torch.rand(20, device=device)
        act = ogsgen.FusedActivation(ogsgen.swiglu, (1.0, 1.2))
        with ogsgen.opt_flags_constraints(block_k=16, block_m=16, block_n=32):
            unsplit = ogsgen.matmul_ogs(x, w, bias, gammas=gammas, fused_activation=act)
            with ogsgen.opt_flags_constraints(split_k=4):
                split = ogsgen.matmul_ogs(x, w, bias, gammas=gammas, fused_activation=act)
        torch.testing.assert_close(split.float(), unsplit.float(), atol=2e-2, rtol=1e-2)


@pytest.mark.parametrize("tokens,n,k", [(0, 5, 7), (5, 0, 7), (5, 8, 0)])
def test_ragged_zero_sizes(tokens, n, k, device):
    rd, gi, si = routing(torch.randn(tokens, 4, device=device), 2)
    x = torch.randn(tokens, k, device=device, dtype=torch.float16)
    w = torch.randn(4, k, n, device=device, dtype=torch.float16)
    bias = torch.randn(4, n, device=device)
    y = ogsgen.matmul_ogs(x, w, bias, rd, gather_indx=gi)
    assert y.shape == (tokens * 2, n)
    if k == 0 and tokens:
        ref = ogsgen.matmul_ogs_torch(x, w, bias, rd, gather_indx=gi)
        torch.testing.assert_close(y, ref)
    z = ogsgen.matmul_ogs(torch.randn(tokens * 2, k, device=device, dtype=torch.float16), w, None, rd,
                          scatter_indx=si)
    assert z.shape == (tokens, n)


@pytest.mark.parametrize("gammas", [False, True])
@pytest.mark.parametrize("split_k", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_split_k_through_the_topk_combine(split_k, gammas, device):
    # A top-k scatter's split partials are summed by its k-row combine: the same result as the unsplit call,
    # the bias added once, dropped gates adding nothing.
    variant = _variant(BF16, scatter=True, bias=True, gammas=gammas)
    with ogsgen.opt_flags_constraints(block_m=16, block_k=16, block_n=32):
        run_moe_case(variant, 24, 48, 80, 6, 3, device, split_k=split_k, drop=0.25)


def test_split_k_with_direct_scatter_is_rejected(device):
    # One gate per token (the matmul writes y itself) or an activation (between the two sums): no split K.
    x = torch.randn(16, 32, device=device, dtype=torch.float16)
    w = torch.randn(4, 32, 16, device=device, dtype=torch.float16)
    rd, _, si = routing(torch.randn(16, 4, device=device), 1)
    with ogsgen.opt_flags_constraints(split_k=2):
        with pytest.raises(ogsgen.InapplicableConstraintError, match="split_k=2 cannot be combined with y_acc_in, a "
                                                                "scatter of one expert per token"):
            ogsgen.matmul_ogs(x, w, None, rd, scatter_indx=si)
        rd, _, si = routing(torch.randn(8, 4, device=device), 2)
        with pytest.raises(ogsgen.InapplicableConstraintError, match="a scatter with a fused activation"):
            ogsgen.matmul_ogs(x, w, None, rd, scatter_indx=si,
                              fused_activation=ogsgen.FusedActivation(ogsgen.swiglu, (1.0, 1.0)))


# ---------------------------------------------------------------- bad MoE inputs

def _moe_inputs(device, tokens=8, n_expts=4, k_act=2):
    rd, gi, si = routing(torch.randn(tokens, n_expts, device=device), k_act)
    x = torch.randn(tokens, 32, device=device, dtype=torch.float16)
    w = torch.randn(n_expts, 32, 16, device=device, dtype=torch.float16)
    return rd, gi, si, x, w


def test_moe_bad_inputs(device):
    rd, gi, si, x, w = _moe_inputs(device)
    bad = ogsgen.GatherIndx(gi.src_indx.long(), gi.dst_indx)
    with pytest.raises(ogsgen.SpecError, match="gather_indx.src_indx must be torch.int32"):
        ogsgen.matmul_ogs(x, w, None, rd, gather_indx=bad)
    short = ogsgen.GatherIndx(gi.src_indx[:-1], gi.dst_indx)
    with pytest.raises(ogsgen.SpecError, match="gather_indx.src_indx must be a contiguous .* of length 16"):
        ogsgen.matmul_ogs(x, w, None, rd, gather_indx=short)
    on_meta = ogsgen.GatherIndx(torch.empty(16, dtype=torch.int32, device="meta"), gi.dst_indx)
    with pytest.raises(ogsgen.SpecError, match="gather_indx.src_indx is on meta"):
        ogsgen.matmul_ogs(x, w, None, rd, gather_indx=on_meta)
    with pytest.raises(ogsgen.SpecError, match=r"w must hold one \(K, N\) matrix per expert, shape \(4, K, N\)"):
        ogsgen.matmul_ogs(x, w[:3], None, rd, gather_indx=gi)
    with pytest.raises(ogsgen.SpecError, match="gather_indx is not supported in batched mode"):
        ogsgen.matmul_ogs(x[None], w[:1], None, gather_indx=gi)
    with pytest.raises(ogsgen.SpecError, match="scatter_indx is not supported in batched mode"):
        ogsgen.matmul_ogs(x[None], w[:1], None, scatter_indx=si)
    with pytest.raises(ogsgen.SpecError, match="need routing_data|pass routing_data"):
        ogsgen.matmul_ogs(x, w[0], None, gather_indx=gi)
    xs = torch.randn(16, 32, device=device, dtype=torch.float16)
    with pytest.raises(ogsgen.SpecError, match="y_acc_in cannot be combined with scatter_indx"):
        ogsgen.matmul_ogs(xs, w, None, rd, scatter_indx=si, y_acc_in=torch.zeros(8, 16, device=device).half())
    with pytest.raises(ogsgen.SpecError, match=r"y_acc_in must have shape \(16, 16\)"):
        ogsgen.matmul_ogs(x, w, None, rd, gather_indx=gi, y_acc_in=torch.zeros(8, 16, device=device).half())
    hist = ogsgen.RoutingData(rd.gate_scal, rd.expt_hist[:3], 4, 2)
    with pytest.raises(ogsgen.SpecError, match="routing_data.expt_hist must be a contiguous .* of length 4"):
        ogsgen.matmul_ogs(x, w, None, hist, gather_indx=gi)


def test_histogram_mismatch_is_caught(device, monkeypatch):
    # On the CPU the routing checks always run; on a GPU with OGSGEN_DEBUG=1 (what the flag sets at import).
    monkeypatch.setattr(ogsgen.moe.checks, "DEBUG", True)
    rd, gi, si, x, w = _moe_inputs(device)
    short = rd.expt_hist.clone()
    short[int(short.argmax())] -= 2
    wrong = ogsgen.RoutingData(rd.gate_scal, short, 4, 2)
    with pytest.raises(ogsgen.SpecError, match="16 routed rows but routing_data.expt_hist sums to 14; the histogram "
                                               "does not match the indices"):
        ogsgen.matmul_ogs(x, w, None, wrong, gather_indx=gi)
    swapped = ogsgen.GatherIndx(gi.src_indx, torch.roll(gi.dst_indx, 1))
    with pytest.raises(ogsgen.SpecError, match="not inverse permutations"):
        ogsgen.matmul_ogs(x, w, None, rd, gather_indx=swapped)


def _with(tensor, position, value):
    changed = tensor.clone()
    changed[position] = value
    return changed


@pytest.mark.parametrize("case,message", [
    ("gather index past the gates", r"gather_indx.src_indx\[3\] = 16 is outside \[-1, 16\)"),
    ("gather index below -1", r"gather_indx.src_indx\[0\] = -5 is outside"),
    ("gate position past the rows", r"gather_indx.dst_indx\[2\] = 99 is outside"),
    ("histogram past the rows", "expt_hist sums to 20 rows, more than the call's 16 sorted rows"),
    ("negative count", r"expt_hist\[1\] = -1: a histogram counts rows"),
    ("histogram short of the indices", "14 routed rows but routing_data.expt_hist sums to 16"),
    ("dropped gate among the routed rows", r"a dropped gate \(-1\) among the first 15 sorted rows"),
    ("metadata of another histogram", "expt_data does not hold the offsets and block schedule"),
])
def test_bad_routing_data_raises_instead_of_reading_out_of_bounds(case, message, device, monkeypatch):
    # Each of these used to read or write outside a tensor (a segfault on the CPU, an illegal memory access or a
    # wrong result on a GPU) or was silently accepted.
    monkeypatch.setattr(ogsgen.moe.checks, "DEBUG", True)
    rd, gi, si, x, w = _moe_inputs(device)
    hist = rd.expt_hist
    if case == "gather index past the gates":
        gi = ogsgen.GatherIndx(_with(gi.src_indx, 3, 16), gi.dst_indx)
    elif case == "gather index below -1":
        gi = ogsgen.GatherIndx(_with(gi.src_indx, 0, -5), gi.dst_indx)
    elif case == "gate position past the rows":
        gi = ogsgen.GatherIndx(gi.src_indx, _with(gi.dst_indx, 2, 99))
    elif case == "histogram past the rows":
        rd = ogsgen.RoutingData(rd.gate_scal, _with(hist, 0, int(hist[0]) + 4), 4, 2)
    elif case == "negative count":
        rd = ogsgen.RoutingData(rd.gate_scal, _with(hist, 1, -1), 4, 2)
    elif case == "histogram short of the indices":
        gi = ogsgen.GatherIndx(_with(_with(gi.src_indx, 14, -1), 15, -1), gi.dst_indx)
    elif case == "dropped gate among the routed rows":
        ids = torch.arange(16, device=device).view(8, 2) % 4
        ids[5, 1] = -1  # one dropped gate: 15 routed rows, then -1
        rd, gi, _ = routing_from_topk(ids, torch.rand(8, 2, device=device), 4)
        src = gi.src_indx.clone()
        src[0], src[15] = -1, int(src[0])
        gi = ogsgen.GatherIndx(src, gi.dst_indx)
    else:
        other = torch.tensor([16, 0, 0, 0], dtype=torch.int32, device=device)
        rd = ogsgen.RoutingData(rd.gate_scal, hist, 4, 2, make_ragged_tensor_metadata(other, 16))
        rd.expt_data.slice_sizes = hist
    with pytest.raises(ogsgen.SpecError, match=message):
        ogsgen.matmul_ogs(x, w, None, rd, gather_indx=gi)


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the checks run with OGSGEN_DEBUG=1 only")
def test_cpu_calls_check_routing_even_when_replayed():
    # A plan replay skips the argument checks, but on the CPU (the interpreter) a bad index would crash the process.
    rd, gi, si, x, w = _moe_inputs("cpu")
    ogsgen.matmul_ogs(x, w, None, rd, gather_indx=gi)  # records the plan
    bad = ogsgen.GatherIndx(_with(gi.src_indx, 3, 1 << 20), gi.dst_indx)
    with pytest.raises(ogsgen.SpecError, match="gather_indx.src_indx"):
        ogsgen.matmul_ogs(x, w, None, rd, gather_indx=bad)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_gate_weights_are_float32_whatever_the_logits(dtype, device):
    logits = torch.randn(8, 4, device=device).to(dtype)
    rd, gi, si = routing(logits, 2)
    assert rd.gate_scal.dtype == torch.float32
    # the documented pattern: the gate weights are the second matmul's gammas
    x = torch.randn(16, 32, device=device, dtype=torch.float16)
    w = torch.randn(4, 32, 16, device=device, dtype=torch.float16)
    y = ogsgen.matmul_ogs(x, w, None, rd, scatter_indx=si, gammas=rd.gate_scal)
    ref = ogsgen.matmul_ogs_torch(x, w, None, rd, scatter_indx=si, gammas=rd.gate_scal,
                                  precision_config=ogsgen.PrecisionConfig(out_dtype=torch.float32))
    assert_close(ref, y.float())
    weights = torch.rand(8, 2, device=device).to(dtype)
    assert routing_from_topk(gi.src_indx.view(8, 2) % 4, weights, 4)[0].gate_scal.dtype == torch.float32


@pytest.mark.parametrize("ids,dtype,message", [
    ([[0, 4]], torch.int32, r"topk_ids\[0, 1\] = 4 is not an expert id: ids must lie in \[-1, n_expts_tot=4\)"),
    ([[-2, 1]], torch.int32, r"topk_ids\[0, 0\] = -2 is not an expert id"),
    ([[1, (1 << 32) + 2]], torch.int64, r"topk_ids\[0, 1\] = 4294967298 is not an expert id"),  # wrapped to 2
    ([[3, -3]], torch.int16, r"topk_ids\[0, 1\] = -3"),
])
@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU checks ids by a device assert: test_gpu.py")
def test_routing_from_topk_refuses_ids_that_are_not_experts(ids, dtype, message):
    # These used to be dropped silently (ids >= E, < -1) or wrapped into valid experts (int64 >= 2**31).
    ids = torch.tensor(ids, dtype=dtype)
    with pytest.raises(ogsgen.SpecError, match=message):
        routing_from_topk(ids, torch.rand(ids.shape), 4)
    with pytest.raises(ogsgen.SpecError, match=message):
        routing_from_topk_torch(ids, torch.rand(ids.shape), 4)


def test_routing_given_expert_ids_refuses_dropped_and_foreign_ids(device, monkeypatch):
    monkeypatch.setattr(ogsgen.moe.checks, "DEBUG", True)
    logits = torch.randn(2, 4, device=device)
    for ids, message in (([[0, -1], [1, 2]], r"expt_indx\[0, 1\] = -1 is not an expert id: ids must lie in \[0,"),
                         ([[0, 1], [1, 7]], r"expt_indx\[1, 1\] = 7")):
        with pytest.raises(ogsgen.SpecError, match=message):
            routing(logits, 2, expt_indx=torch.tensor(ids, device=device))


@pytest.mark.slow
def test_metadata_beyond_the_old_15_bit_block_index(device):
    # One expert with 600,000 rows: 37,500 tiles of 16 rows, past the 2**15 block indices that int32 schedule
    # entries held (the limit was 524,288 gates per call, 65,540 tokens at top-8).
    hist = torch.tensor([600_000, 3, 0, 17], dtype=torch.int32, device=device)
    n_rows = 600_020
    meta, ref = make_ragged_tensor_metadata(hist, n_rows), make_ragged_tensor_metadata_torch(hist, n_rows)
    for field in ("slice_offs", "block_offs_data", "block_schedule_data"):
        assert torch.equal(getattr(meta, field), getattr(ref, field)), field
    assert int(meta.block_schedule(16)[37_499]) == (37_499 << 16) | 0


def _gather_swiglu_then_combine(rd, gi, si, hidden=16, inter=16, **constraints):
    """A gpt-oss-style pair of MoE calls on ``rd`` (w1 gathered with SwiGLU, w2 scattered with the gate weights and
    each token's k rows summed), each against matmul_ogs_torch."""
    device, n_expts = rd.expt_hist.device, rd.n_expts_tot
    x = torch.randn(gi.src_indx.shape[0] // rd.n_expts_act, hidden, device=device).bfloat16()
    w1 = (torch.randn(n_expts, hidden, 2 * inter, device=device) / 4).bfloat16()
    w2 = (torch.randn(n_expts, inter, hidden, device=device) / 4).bfloat16()
    act = ogsgen.FusedActivation(ogsgen.swiglu, (1.702, 7.0))
    with ogsgen.opt_flags_constraints(**constraints):
        h = ogsgen.matmul_ogs(x, w1, None, rd, gather_indx=gi, fused_activation=act)
        y = ogsgen.matmul_ogs(h, w2, None, rd, scatter_indx=si, gammas=rd.gate_scal)
    h_ref = ogsgen.matmul_ogs_torch(x, w1, None, rd, gi, fused_activation=act)
    assert_close(h_ref.float(), h.float(), what="gather + SwiGLU")
    y_ref = ogsgen.matmul_ogs_torch(h, w2, None, rd, scatter_indx=si, gammas=rd.gate_scal,
                                    round_y=lambda t: t.bfloat16().float())  # (the k rows pass through bf16)
    assert_close(y_ref.float(), y.float(), what="top-k combine")


@pytest.mark.parametrize("persistent", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_moe_with_more_experts_than_a_byte_holds(persistent, device):
    # 384 experts (Kimi-K2's count; DeepSeek-V3 has 256): expert ids past 255 in the block schedule's 16-bit field,
    # and one of them (300) with 40 rows, three row tiles. Gather with SwiGLU, then the top-k combine.
    n_expts, tokens = 384, 40
    ids = torch.stack([torch.arange(tokens, device=device) * 97 % n_expts, torch.full((tokens,), 300, device=device)],
                      dim=1)
    assert (ids >= 256).any() and (ids < 256).any()
    rd, gi, si = routing_from_topk(ids, torch.rand(tokens, 2, device=device), n_expts)
    _gather_swiglu_then_combine(rd, gi, si, block_m=16, persistent=persistent)


@pytest.mark.slow
def test_moe_at_the_largest_expert_count(device):
    # 65,536 experts, the most the block schedule's 16-bit expert field holds: the last ids' rows reach their
    # experts (reference: each gathered row times its expert's w); one more expert is refused.
    from ogsgen.moe.metadata import MAX_EXPERTS
    n_expts, tokens, k, n = MAX_EXPERTS, 24, 16, 16
    ids = torch.stack([n_expts - 1 - torch.arange(tokens, device=device) % 3,
                       torch.arange(tokens, device=device) * 2731 % n_expts], dim=1)
    rd, gi, _ = routing_from_topk(ids, torch.rand(tokens, 2, device=device), n_expts)
    ref_meta = make_ragged_tensor_metadata_torch(rd.expt_hist, tokens * 2)
    for field in ("slice_offs", "block_offs_data", "block_schedule_data"):
        assert torch.equal(getattr(rd.expt_data, field), getattr(ref_meta, field)), field
    x = torch.randn(tokens, k, device=device).bfloat16()
    w = (torch.randn(n_expts, k, n, device=device) / 4).bfloat16()
    y = ogsgen.matmul_ogs(x, w, None, rd, gather_indx=gi)
    gates = gi.src_indx.long()
    ref = torch.bmm(x[gates // 2].float()[:, None], w[ids.reshape(-1)[gates]].float())[:, 0]
    assert_close(ref, y.float())
    too_many = torch.zeros(n_expts + 1, dtype=torch.int32, device=device)
    with pytest.raises(ogsgen.SpecError, match="hist has 65537 experts; the packed block schedule holds at most 65536"):
        make_ragged_tensor_metadata(too_many, tokens)
    with pytest.raises(ogsgen.SpecError, match="n_expts_tot=65537 is more experts than ogsgen's block schedule holds"):
        routing_from_topk(ids, torch.rand(tokens, 2, device=device), n_expts + 1)


_METADATA_PTX_LINES = """
import sys, triton
from triton.backends.compiler import GPUTarget
from ogsgen.moe.metadata import _ragged_metadata, metadata_blocks
for n_expts_tot in map(int, sys.argv[1:]):
    constants = dict(**metadata_blocks(n_expts_tot), SMALLEST_BLOCK=16)
    signature = dict(Hist="*i32", SliceOffs="*i32", BlockOffs="*i32", BlockSchedule="*i64", n_expts_tot="i32",
                     n_tiles="i32", n_rows="i32", **{name: "constexpr" for name in constants})
    source = triton.compiler.ASTSource(fn=_ragged_metadata, signature=signature, constexprs=constants)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
    print(len(compiled.asm["ptx"].splitlines()))
"""


@pytest.mark.slow  # (two offline compiles in a subprocess)
def test_the_metadata_kernel_compiles_to_about_one_size_at_any_expert_count(tmp_path):
    # An offline sm_90 compile (Triton's own ptxas, no GPU needed; in a process without the interpreter, which
    # replaces @triton.jit): the kernel reads the experts a block at a time. When it held every expert in one tile,
    # 65,536 experts took minutes to compile on an H100 machine (2026-12-06).
    from ogsgen.moe.metadata import MAX_EXPERTS
    root = str(Path(__file__).resolve().parent.parent)
    env = {**{k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}, "TRITON_CACHE_DIR": str(tmp_path),
           "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", _METADATA_PTX_LINES, "16", str(MAX_EXPERTS)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    at_16, at_most = map(int, done.stdout.split())
    assert at_most < 8 * at_16  # (2x with Triton 3.6, 3.2x with 3.9; a tile of every expert: beyond compiling)


def test_top_k_at_the_largest_k(device):
    # routing takes k up to the expert count: every token to every expert, each token's 8 rows summed by the
    # combine (its top-k loop unrolled 8 times); k = 9 of 8 experts is refused.
    logits = torch.randn(12, 8, device=device)
    _gather_swiglu_then_combine(*routing(logits, 8))
    with pytest.raises(ogsgen.SpecError, match=r"n_expts_act must be an int in \[1, n_expts_tot=8\], got 9"):
        routing(logits, 9)


def test_row_count_limit_is_a_clear_error(device):
    with pytest.raises(ogsgen.SpecError, match=r"n_rows is 2147483648 rows \(gates\); ogsgen's routing holds at most"):
        make_ragged_tensor_metadata(torch.zeros(4, dtype=torch.int32, device=device), 1 << 31)


# ---------------------------------------------------------------- catalog

def test_default_catalog_has_the_moe_models_variants():
    for name in ["ogs_matmul_xbf16_wbf16_ybf16_ragged_gather_bias_act_swiglu",   # gpt-oss w1
                 "ogs_matmul_xbf16_wbf16_ybf16_ragged_scatter_bias_gammas",      # gpt-oss w2
                 "ogs_matmul_xbf16_wbf16_ybf16_ragged_gather_act_swiglu",        # DeepSeek/Qwen w1
                 "ogs_matmul_xbf16_wbf16_ybf16_ragged_scatter_gammas",           # DeepSeek/Qwen w2
                 "ogs_matmul_xbf16_wbf16_yfp32",                                 # router logits
                 "ogs_reduce_xbf16_ybf16_scatter_gammas",                        # top-k combine of w2
                 "ogs_matmul_xbf16_wbf16_yfp32_ragged_gather_bias",              # split-K partials of w1
                 "ogs_reduce_xfp32_ybf16_act_swiglu"]:                           # and their reduce
        assert name in DEFAULT, name


def _performance_warnings(call) -> tuple[list, list]:
    """(every warning ``call`` raised, the ogsgen.PerformanceWarnings among them)."""
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return caught, [c for c in caught if issubclass(c.category, ogsgen.PerformanceWarning)]


@pytest.mark.slow  # (5 s on a CPU)
def test_k_contiguous_weights_warn_once_at_prefill_sizes(device, monkeypatch):
    """A 16-bit MoE w stored K-contiguous ((E, N, K) viewed as w.mT) costs prefill-sized calls speed: one warning
    per process names the fix; N-contiguous weights and decode-sized calls get none."""
    from ogsgen.runtime import matmul
    monkeypatch.setattr(matmul, "_warned_k_contiguous", False)
    n_expts, width = 4, 16
    w = torch.randn(n_expts, width, width, device=device).bfloat16()
    w_k_major = w.mT.contiguous().mT
    for tokens, weight, warns in ((8, w_k_major, False), (4096, w, False), (4096, w_k_major, True),
                                  (4096, w_k_major, False)):
        rd, gi, _ = routing(torch.randn(tokens, n_expts, device=device), 2)
        x = torch.randn(tokens, width, device=device).bfloat16()
        caught, warned = _performance_warnings(lambda: ogsgen.matmul_ogs(x, weight, None, rd, gather_indx=gi))
        assert len(warned) == warns, (tokens, weight.stride(), [str(c.message) for c in caught])
        if warns:
            message = str(warned[0].message)
            assert "w is K-contiguous" in message and "prepare_expert_weights" in message
            assert warned[0].filename == __file__  # the caller's line, not one inside ogsgen


@pytest.mark.slow
def test_the_k_contiguous_warning_names_the_callers_line_under_autograd(device, monkeypatch):
    """A call that needs gradients goes through torch's autograd and custom-op frames: the warning still points at
    the caller's line."""
    from ogsgen.runtime import matmul
    monkeypatch.setattr(matmul, "_warned_k_contiguous", False)
    n_expts, width, tokens = 4, 16, 4096
    w = torch.randn(n_expts, width, width, device=device).bfloat16().mT.contiguous().mT.requires_grad_()
    rd, gi, _ = routing(torch.randn(tokens, n_expts, device=device), 2)
    x = torch.randn(tokens, width, device=device).bfloat16()
    _, warned = _performance_warnings(lambda: ogsgen.matmul_ogs(x, w, None, rd, gather_indx=gi))
    assert len(warned) == 1 and warned[0].filename == __file__, [(c.filename, c.lineno) for c in warned]
