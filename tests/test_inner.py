"""Ragged K (``inner_routing_data``): each expert's product over its own segment of K, the expert weights' gradient,
against the float32 reference; padded and unpadded operands, gathered columns, in-place accumulation, bad inputs."""
import pytest
import torch

import ogsgen
from ogsgen import GatherIndx, InnerRoutingData, PrecisionConfig, RoutingData, matmul_ogs, matmul_ogs_torch
from ogsgen.errors import InapplicableConstraintError, SpecError, SpecTypeError
from ogsgen.moe import checks as routing_checks

HIST = [5, 0, 33, 17, 64]  # an empty expert, segments shorter and longer than a K tile, one of two whole tiles


def _segments(hist, block_k, padded, length, device, dtype, rows_first):
    """An operand of ``length`` entries along K holding the segments (padded or not) and NaN everywhere else: the
    kernel must read nothing outside its segments."""
    m = 24
    data = torch.full((length, m) if rows_first else (m, length), float("nan"), dtype=dtype, device=device)
    start = 0
    for count in hist:
        values = torch.randn(count, m, device=device).to(dtype)
        if rows_first:
            data[start:start + count] = values
        else:
            data[:, start:start + count] = values.T
        start += -(-count // block_k) * block_k if padded else count
    return data


@pytest.mark.parametrize("x_padded,w_padded", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("dtype,out_dtype", [(torch.bfloat16, torch.float32), (torch.float16, torch.float16),
                                             (torch.float32, torch.float32)])
@pytest.mark.parametrize("block_k", [16, pytest.param(32, marks=pytest.mark.slow)])
def test_inner_matches_reference(x_padded, w_padded, dtype, out_dtype, block_k, device):
    hist = torch.tensor(HIST, dtype=torch.int32, device=device)
    length = sum(-(-c // block_k) * block_k for c in HIST) + 7  # a tail past the last segment
    x = _segments(HIST, block_k, x_padded, length, device, dtype, rows_first=False)
    w = _segments(HIST, block_k, w_padded, length, device, dtype, rows_first=True)[:, :20]
    inner = InnerRoutingData(RoutingData(None, hist, len(HIST), 1), block_k, x_padded, w_padded)
    pc = PrecisionConfig(out_dtype=out_dtype, allow_tf32=False)  # fp32 dots as fp32 on the GPU too
    y = matmul_ogs(x, w, None, inner_routing_data=inner, precision_config=pc)
    ref = matmul_ogs_torch(x, w, None, inner_routing_data=inner, precision_config=pc)
    assert y.shape == (len(HIST), 24, 20) and y.dtype == out_dtype
    assert not y.isnan().any()
    assert torch.count_nonzero(y[1]) == 0  # the empty expert's product is zero, not left unwritten
    torch.testing.assert_close(y.float(), ref.float(), atol=2e-2 if out_dtype == torch.float16 else 1e-3,
                               rtol=1e-2 if out_dtype == torch.float16 else 1e-4)


@pytest.mark.parametrize("k_act", [1, 2, 4])
def test_inner_gathers_the_tokens_of_a_routing(k_act, device):
    """dW of the first MoE matmul: x^T's columns are tokens, read in expert-sorted order through its gather."""
    tokens, e, width, n = 33, 6, 24, 40
    rd, gi, _ = ogsgen.routing(torch.randn(tokens, e, device=device), k_act)
    x_tokens = torch.randn(tokens, width, device=device).bfloat16()
    dy = torch.randn(tokens * k_act, n, device=device).bfloat16()
    inner = InnerRoutingData(rd, block_k=32)
    pc = PrecisionConfig(out_dtype=torch.float32)
    y = matmul_ogs(x_tokens.mT, dy, None, gather_indx=gi, inner_routing_data=inner, precision_config=pc)
    x_sorted = x_tokens[gi.src_indx.long() // k_act]
    ref = matmul_ogs_torch(x_sorted.mT, dy, None, inner_routing_data=inner, precision_config=pc)
    torch.testing.assert_close(y, ref, atol=1e-3, rtol=1e-4)
    # the same as the gather written out: per expert, its rows' x^T @ dy
    ends = torch.cumsum(rd.expt_hist.long(), 0).tolist()
    for expert, (lo, hi) in enumerate(zip([0] + ends[:-1], ends)):
        torch.testing.assert_close(y[expert], x_sorted[lo:hi].float().T @ dy[lo:hi].float(), atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize("persistent", [pytest.param(False, marks=pytest.mark.slow), True])
def test_inner_programs_loop_over_tiles(persistent, monkeypatch, device):
    """The kernel's programs loop over (expert, tile) pairs: one per tile, or (persistent) one per SM, three on the
    CPU, each then taking tiles of several experts in turn, segments of different lengths (an empty one among
    them) and a gather. Every tile matches the reference, y_acc_in added once."""
    from ogsgen.runtime import launcher
    grids = []
    launch = launcher.launch
    monkeypatch.setattr(launcher, "launch", lambda kernel, grid, args, **options: grids.append(
        (grid, args["n_programs"])) or launch(kernel, grid, args, **options))
    tokens, k_act, width, n = 40, 2, 48, 40
    logits = torch.randn(tokens, 5, device=device)
    logits[:, 1] = -100.0  # expert 1 gets no tokens
    rd, gi, _ = ogsgen.routing(logits, k_act)
    assert rd.expt_hist[1] == 0 and rd.expt_hist.max() > 16
    x_tokens = torch.randn(tokens, width, device=device).bfloat16()
    dy = torch.randn(tokens * k_act, n, device=device).bfloat16()
    inner = InnerRoutingData(rd, block_k=16)
    pc = PrecisionConfig(out_dtype=torch.float32)
    grad = torch.randn(5, width, n, device=device)
    x_sorted = x_tokens[gi.src_indx.long() // k_act]
    expected = matmul_ogs_torch(x_sorted.mT, dy, None, inner_routing_data=inner, precision_config=pc) + grad
    with ogsgen.opt_flags_constraints(block_m=16, block_n=16, persistent=persistent):
        matmul_ogs(x_tokens.mT, dy, None, gather_indx=gi, inner_routing_data=inner, precision_config=pc, y=grad,
                   y_acc_in=grad)
    tiles = 5 * 3 * 3
    programs = (ogsgen.devices.target().sm_count if device == "cuda" else 3) if persistent else tiles
    assert grids == [((min(programs, tiles), 1, 1), min(programs, tiles))]
    torch.testing.assert_close(grad, expected, atol=1e-3, rtol=1e-4)


def test_inner_accumulates_in_place(device):
    hist = torch.tensor([3, 20, 0, 9], dtype=torch.int32, device=device)
    x = torch.randn(16, 32, device=device).bfloat16()
    w = torch.randn(32, 24, device=device).bfloat16()
    inner = InnerRoutingData(RoutingData(None, hist, 4, 1), block_k=16)
    pc = PrecisionConfig(out_dtype=torch.float32)
    grad = torch.randn(4, 16, 24, device=device)
    expected = matmul_ogs_torch(x, w, None, inner_routing_data=inner, precision_config=pc) + grad
    out = matmul_ogs(x, w, None, inner_routing_data=inner, precision_config=pc, y=grad, y_acc_in=grad)
    assert out.data_ptr() == grad.data_ptr()
    torch.testing.assert_close(grad, expected, atol=1e-3, rtol=1e-4)


def test_inner_bad_inputs(device):
    hist = torch.tensor([3, 5], dtype=torch.int32, device=device)
    x = torch.randn(8, 8, device=device)
    w = torch.randn(8, 4, device=device)
    inner = InnerRoutingData(RoutingData(None, hist, 2, 1), block_k=16)

    def call(**kwargs):
        args = dict(x=x, w=w, bias=None, inner_routing_data=inner)
        args.update(kwargs)
        return matmul_ogs(**args)
    with pytest.raises(SpecError, match="leave bias None"):
        call(bias=torch.zeros(4, device=device))
    with pytest.raises(SpecError, match="block_k must be one of"):
        call(inner_routing_data=InnerRoutingData(inner.base, block_k=24))
    with pytest.raises(SpecTypeError, match="must be an ogsgen.InnerRoutingData"):
        call(inner_routing_data=inner.base)
    if routing_checks.host_checks_apply(x):  # they read the histogram: on a GPU only with OGSGEN_DEBUG=1
        with pytest.raises(SpecError, match="need 21 entries of w's rows"):  # padded: the second starts at 16
            call(w=torch.randn(20, 4, device=device), x=torch.randn(8, 32, device=device),
                 inner_routing_data=InnerRoutingData(inner.base, 16, w_is_padded=True))
        with pytest.raises(SpecError, match="need 8 entries of x's columns"):
            call(x=torch.randn(8, 7, device=device))
    with pytest.raises(SpecError, match="one dtype"):
        call(w=w.bfloat16())
    with pytest.raises(SpecError, match=r"y must have shape \(experts, x rows, w columns\) = \(2, 8, 4\)"):
        call(y=torch.empty(8, 4, 2, device=device))
    gather = GatherIndx(torch.arange(8, dtype=torch.int32, device=device), torch.arange(8, dtype=torch.int32,
                                                                                         device=device))
    with pytest.raises(SpecError, match="x_is_padded with gather_indx"):
        call(gather_indx=gather, inner_routing_data=InnerRoutingData(inner.base, 16, x_is_padded=True))
    with pytest.raises(InapplicableConstraintError, match="block_k=32: a ragged-K call takes block_k=16"):
        with ogsgen.opt_flags_constraints(block_k=32):
            call()
