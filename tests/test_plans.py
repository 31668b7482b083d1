"""Launch plans: a call with the signature of an earlier one replays its plan, on its own tensors."""
import re

import pytest
import torch

import ogsgen
from ogsgen.runtime import matmul as matmul_module
from ogsgen.runtime import plans

SWIGLU = ogsgen.FusedActivation(ogsgen.swiglu, (1.702, 7.0))


@pytest.fixture
def checked_calls(monkeypatch):
    """How many calls took the checked path (the rest replayed a plan)."""
    calls = []
    checked = matmul_module._checked_matmul_ogs
    monkeypatch.setattr(matmul_module, "_checked_matmul_ogs", lambda *args: calls.append(1) or checked(*args))
    return calls


def _moe(device, tokens, n_expts=4, k_act=2, k=32, n=32):
    """Fresh routing, tokens, fp16 expert weights and bias."""
    rd, gi, si = ogsgen.routing(torch.randn(tokens, n_expts, device=device), k_act)
    x = torch.randn(tokens, k, device=device).half()
    w = torch.randn(n_expts, k, n, device=device).half() / k ** 0.5
    bias = torch.randn(n_expts, n, device=device)
    return rd, gi, si, x, w, bias


def _w1(rd, gi, x, w, bias, y=None, **kwargs):
    """gpt-oss's first MoE matmul: gather, bias, SwiGLU (and whatever else ``kwargs`` passes)."""
    args = dict(gather_indx=gi, fused_activation=SWIGLU, **kwargs)
    got = ogsgen.matmul_ogs(x, w, bias, rd, y=y, **args)
    want = ogsgen.matmul_ogs_torch(x.float(), w.float(), bias, rd, **args)
    return got, want


def _w2(rd, si, x_sorted, w, bias, gammas):
    """gpt-oss's second: scatter back to tokens (summing the k gates), bias, gammas."""
    got = ogsgen.matmul_ogs(x_sorted, w, bias, rd, scatter_indx=si, gammas=gammas)
    want = ogsgen.matmul_ogs_torch(x_sorted.float(), w.float(), bias, rd, scatter_indx=si, gammas=gammas)
    return got, want


def _close(got, want):
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)


def test_a_repeated_signature_replays_its_plan_on_new_tensors(device, checked_calls):
    for step in range(4):  # new routing, tokens, weights: the same shapes
        rd, gi, _, x, w, bias = _moe(device, tokens=5)
        got, want = _w1(rd, gi, x, w, bias)
        _close(got, want)
    assert len(checked_calls) == 1
    assert len(plans._plans) == 1


def _top_k_scatter_steps(device) -> list:
    """Three w2 calls of one signature (6 tokens, top-2) on fresh inputs, checked; the steps of their one plan."""
    for step in range(3):
        rd, _, si, _, w, bias = _moe(device, tokens=6, k_act=2)
        x_sorted = torch.randn(12, 32, device=device).half()
        gammas = torch.rand(12, device=device) + 0.5
        got, want = _w2(rd, si, x_sorted, w, bias, gammas)
        _close(got, want)
    (plan,) = plans._plans.values()
    return plan.steps


def test_top_k_scatter_replays_its_buffer_and_both_kernels(device, checked_calls):
    steps = _top_k_scatter_steps(device)
    assert len(checked_calls) == 1
    assert [type(step).__name__ for step in steps] == ["_Buffer", "_Buffer", "_Launch", "_Launch"]


def test_a_single_gate_scatter_replays_the_zeroing(device, checked_calls):
    """With one gate per token the matmul scatters straight into y, zeroed first for the dropped tokens."""
    for step in range(3):
        _, _, _, x, w, bias = _moe(device, tokens=6, k_act=1)
        ids = torch.randint(0, 4, (6, 1), device=device, dtype=torch.int32)
        ids[torch.randperm(6, device=device)[:2]] = -1  # two tokens' gates routed to no local expert
        rd, _, si = ogsgen.moe.routing_from_topk(ids, torch.rand(6, 1, device=device), 4)
        y = torch.full((6, 32), float("nan"), device=device).half()
        got = ogsgen.matmul_ogs(x, w, bias, rd, scatter_indx=si, y=y)
        want = ogsgen.matmul_ogs_torch(x.float(), w.float(), bias, rd, scatter_indx=si)
        _close(got, want)
    assert len(checked_calls) == 1


def test_a_given_output_is_written_and_returned(device, checked_calls):
    for step in range(3):
        rd, gi, _, x, w, bias = _moe(device, tokens=5)
        y = torch.full((10, 16), float("nan"), device=device).half()
        got, want = _w1(rd, gi, x, w, bias, y=y)
        assert got is y
        _close(got, want)
    assert len(checked_calls) == 1


def test_split_k_partials_replay(device, checked_calls):
    with ogsgen.opt_flags_constraints(split_k=2):
        for step in range(3):
            rd, gi, _, x, w, bias = _moe(device, tokens=5)
            got, want = _w1(rd, gi, x, w, bias)
            _close(got, want)
    assert len(checked_calls) == 1


def test_top_k_scatter_split_k_replays_its_partials_and_their_combine(device, checked_calls):
    with ogsgen.opt_flags_constraints(split_k=2):
        steps = _top_k_scatter_steps(device)
    assert len(checked_calls) == 1
    # y and the fp32 partials (split, rows, N), the split matmul, the combine of splits and gates
    assert [type(step).__name__ for step in steps] == ["_Buffer", "_Buffer", "_Launch", "_Launch"]
    assert steps[1].shape == (2, 12, 32) and steps[1].dtype == torch.float32


@pytest.mark.parametrize("batched", [False, True])
def test_persistent_calls_replay_with_descriptors_of_their_own_tensors(device, checked_calls, batched):
    """The persistent kernel takes TMA descriptors, which hold an address: a replay describes its own tensors."""
    shape = (2, 20) if batched else (20,)
    with ogsgen.opt_flags_constraints(persistent=True, block_m=16, block_n=32, block_k=16):
        for step in range(3):
            x = torch.randn(*shape, 48, device=device).half()
            w = torch.randn(*shape[:-1], 48, 64, device=device).half() / 48 ** 0.5
            bias = torch.randn(64, device=device)
            _close(ogsgen.matmul_ogs(x, w, bias), ogsgen.matmul_ogs_torch(x.float(), w.float(), bias))
    assert len(checked_calls) == 1


def test_a_plan_does_not_keep_the_tensors_of_the_call_it_was_recorded_from(device, checked_calls):
    """Plans live for the process; the tensors of the call a plan was recorded from must not: a TMA descriptor it
    keeps would hold its tensor (a model's weights, 15 GB for DeepSeek-V3's w1, stayed on the GPU after the
    caller dropped them: the training bench ran out of memory)."""
    import gc
    import weakref

    rd, gi, si, x, w, bias = _moe(device, 24)
    with ogsgen.opt_flags_constraints(persistent=True, block_m=16, block_n=32, block_k=16):
        got = ogsgen.matmul_ogs(x, w, bias, rd, gather_indx=gi)
    assert len(checked_calls) == 1 and len(plans._plans) > 0
    refs = [weakref.ref(t) for t in (x, w, bias, got)]
    del x, w, bias, got
    gc.collect()
    assert [ref() is None for ref in refs] == [True] * 4


def test_ragged_persistent_calls_replay_on_their_own_metadata(device, checked_calls):
    """Their kernel reads the metadata's block offsets too (a view per block size, as the block schedule)."""
    with ogsgen.opt_flags_constraints(persistent=True, block_m=16, block_n=32, block_k=16):
        for step in range(3):
            rd, _, si, _, w, bias = _moe(device, tokens=6, k_act=2)
            x_sorted = torch.randn(12, 32, device=device).half()
            _close(*_w2(rd, si, x_sorted, w, bias, rd.gate_scal))
    assert len(checked_calls) == 1


def test_gathered_persistent_calls_replay_one_launch_reading_their_own_rows(device, checked_calls):
    """Their kernel gathers the call's own x rows by pointers, no copy first (fresh tokens, routing and weights each
    step)."""
    with ogsgen.opt_flags_constraints(persistent=True, block_m=16, block_n=32, block_k=16):
        for step in range(3):
            rd, gi, _, x, w, bias = _moe(device, tokens=5)
            _close(*_w1(rd, gi, x, w, bias))
    assert len(checked_calls) == 1
    (plan,) = plans._plans.values()
    kernels = [step.kernel for step in plan.steps if isinstance(step, plans._Launch)]
    assert len(kernels) == 1 and re.fullmatch(r"ogs_matmul_.*_ragged_gather_.*_persistent", kernels[0].fn.__name__)


@pytest.mark.parametrize("change", ["tokens", "x strides", "bias", "out_alpha", "activation argument",
                                    "constraints", "alignment"])
def test_a_different_signature_takes_the_checked_path(device, checked_calls, change):
    rd, gi, _, x, w, bias = _moe(device, tokens=5)
    _close(*_w1(rd, gi, x, w, bias))
    kwargs = {}
    if change == "tokens":
        rd, gi, _, x, w, bias = _moe(device, tokens=6)
    elif change == "x strides":
        x = x.t().contiguous().t()
    elif change == "bias":
        bias = None
    elif change == "out_alpha":
        kwargs["out_alpha"] = 0.5
    elif change == "activation argument":
        kwargs["fused_activation"] = ogsgen.FusedActivation(ogsgen.swiglu, (1.0, 7.0))
    elif change == "alignment":  # the same shape 2 bytes past a 16-byte boundary: Triton compiles another binary
        x = torch.randn(5 * 32 + 1, device=device).half()[1:].view(5, 32)
    context = ogsgen.opt_flags_constraints(block_m=32) if change == "constraints" else torch.no_grad()
    with context:
        args = dict(gather_indx=gi, fused_activation=SWIGLU) | kwargs
        got = ogsgen.matmul_ogs(x, w, bias, rd, **args)
        want = ogsgen.matmul_ogs_torch(x.float(), w.float(), bias, rd, **args)
    _close(got, want)
    assert len(checked_calls) == 2
    assert len(plans._plans) == 2


def test_bad_arguments_are_still_caught_after_a_plan(device):
    rd, gi, _, x, w, bias = _moe(device, tokens=5)
    _close(*_w1(rd, gi, x, w, bias))
    with pytest.raises(ogsgen.SpecError, match="gather_indx.src_indx must be torch.int32"):
        ogsgen.matmul_ogs(x, w, bias, rd, gather_indx=ogsgen.GatherIndx(gi.src_indx.long(), gi.dst_indx),
                          fused_activation=SWIGLU)
    with pytest.raises(ogsgen.SpecError, match="x has K=16 columns"):
        ogsgen.matmul_ogs(x[:, :16], w, bias, rd, gather_indx=gi, fused_activation=SWIGLU)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        ogsgen.matmul_ogs(x.tolist(), w, bias, rd, gather_indx=gi, fused_activation=SWIGLU)


def test_a_plan_needs_the_aliasing_it_was_recorded_with(device, checked_calls):
    """ogsgen.routing's histogram is its metadata's slice sizes (one tensor); the plan reads both from the
    histogram's position, so a call whose two are distinct tensors does not replay it."""
    rd, gi, _, x, w, bias = _moe(device, tokens=5)
    assert rd.expt_hist is rd.expt_data.slice_sizes
    _close(*_w1(rd, gi, x, w, bias))
    meta = rd.expt_data
    distinct = ogsgen.RoutingData(rd.gate_scal, rd.expt_hist.clone(), 4, 2,
                                  type(meta)(meta.slice_sizes.clone(), meta.slice_offs, meta.block_offs_data,
                                             meta.block_schedule_data))
    _close(*_w1(distinct, gi, x, w, bias))
    assert len(checked_calls) == 2


def test_calls_whose_launches_a_plan_cannot_replay_are_not_planned(device, checked_calls):
    """Metadata built inside the call (a routing without it) is not one of the call's tensors."""
    for step in range(2):
        rd, gi, _, x, w, bias = _moe(device, tokens=5)
        bare = ogsgen.RoutingData(rd.gate_scal, rd.expt_hist, 4, 2)
        _close(*_w1(bare, gi, x, w, bias))
    assert len(checked_calls) == 2 and not plans._plans


def test_adding_a_kernel_folder_forgets_the_plans(device, tmp_path, monkeypatch):
    monkeypatch.setattr(ogsgen.runtime.loader, "_extra_dirs", list(ogsgen.runtime.loader._extra_dirs))
    rd, gi, _, x, w, bias = _moe(device, tokens=5)
    _close(*_w1(rd, gi, x, w, bias))
    assert plans._plans
    ogsgen.add_search_path(tmp_path)
    assert not plans._plans
