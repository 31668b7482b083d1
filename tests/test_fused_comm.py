"""Fused communication (FusedComm): each rank's matmul writes its output rows into every destination rank's buffer.

One process plays every rank (the buffers are separate tensors, their addresses the out_handles), which runs the
kernels' addressing on the CPU interpreter and on one GPU; the results equal ``fused_comm_reference`` of the ranks'
local results. ``post_matmul_comm_torch`` (the reference through torch.distributed) is checked against it with gloo
processes on the CPU. Two GPUs (symmetric memory across processes) have not run yet (2026-12-06).
"""
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import ogsgen
from ogsgen import FusedComm, fused_comm_reference, matmul_ogs, matmul_ogs_torch
from ogsgen.errors import SpecError, SpecTypeError, UnsupportedError
from ogsgen.moe import checks as routing_checks
from ogsgen.testing import assert_close


def _run_ranks(world, n_reduce_shards, local_call, rows, n, device, shards=None):
    """Every rank's call (``local_call(rank, y=..., fused_comm=...)``) into its own buffer, the buffers' addresses
    as out_handles; returns the buffers."""
    buffers = [torch.zeros(rows * n_reduce_shards, n, device=device).bfloat16() for _ in range(world)]
    handles = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.int64, device=device)
    for rank in range(world):
        comm = FusedComm(handles, None if shards is None else shards[rank], rank % n_reduce_shards, n_reduce_shards)
        out = local_call(rank, y=buffers[rank], fused_comm=comm)
        assert out.data_ptr() == buffers[rank].data_ptr()
    return buffers


@pytest.mark.parametrize("world", [1, 2, 4])
def test_dense_all_gather(world, device):
    m, k, n = 24, 32, 40
    xs = [torch.randn(m, k, device=device).bfloat16() for _ in range(world)]
    w, bias = torch.randn(k, n, device=device).bfloat16(), torch.randn(n, device=device)
    buffers = _run_ranks(world, world, lambda r, **kw: matmul_ogs(xs[r], w, bias, **kw), m, n, device)
    local = [matmul_ogs(x, w, bias) for x in xs]
    for rank, buffer in enumerate(buffers):
        torch.testing.assert_close(buffer, fused_comm_reference(local, rank, world), atol=0, rtol=0)
    assert_close(torch.stack([matmul_ogs_torch(x.float(), w.float(), bias) for x in xs], 1).reshape(-1, n),
                 buffers[0].float())


@pytest.mark.parametrize("world,n_reduce_shards", [(2, 1), (4, 2), pytest.param(4, 1, marks=pytest.mark.slow)])
@pytest.mark.parametrize("k_act", [pytest.param(1, marks=pytest.mark.slow), 2, pytest.param(8, marks=pytest.mark.slow)])
def test_moe_rows_scattered_to_shards(world, n_reduce_shards, k_act, device):
    """Expert parallelism's combine: each rank's expert-sorted rows (gathered tokens, weighted by their gates) go to
    the rank group owning each row's token; shards of uneven size, dropped gates' rows written nowhere."""
    tokens, n_expts, width, n = 19, 8, 32, 24
    calls, local, shards = [], [], []
    for rank in range(world):
        ids = torch.randint(0, n_expts, (tokens, k_act), device=device)
        ids[::4, -1] = -1
        rd, gi, _ = ogsgen.routing_from_topk(ids, torch.rand(tokens, k_act, device=device), n_expts)
        x = torch.randn(tokens, width, device=device).bfloat16()
        w = torch.randn(n_expts, width, n, device=device).bfloat16()
        args = (x, w, None, rd)
        kwargs = dict(gather_indx=gi, gammas=rd.gate_scal)
        calls.append((args, kwargs))
        out = matmul_ogs_torch(x.float(), w.float(), None, rd, **kwargs).bfloat16()
        routed = int(rd.expt_hist.sum())
        out[routed:] = 0  # rows of dropped gates: left unwritten, locally and on the peers
        local.append(out)
        n_shards = world // n_reduce_shards
        shard = torch.randint(0, n_shards, (tokens * k_act,), device=device, dtype=torch.int32)
        shard[: tokens * k_act // 2] = 0  # shard 0 gets more rows than the others
        shards.append(shard)
    buffers = _run_ranks(world, n_reduce_shards, lambda r, **kw: matmul_ogs(*calls[r][0], **calls[r][1], **kw),
                         tokens * k_act, n, device, shards)
    for rank, buffer in enumerate(buffers):
        assert_close(fused_comm_reference(local, rank, n_reduce_shards, shards).float(), buffer.float())
        written = fused_comm_reference([torch.ones_like(y) for y in local], rank, n_reduce_shards, shards)
        assert torch.equal(buffer != 0, (written != 0) & (buffer != 0)), "a row went where it should not"


def _gloo_rank(rank, world, port, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.manual_seed(rank)
        y = torch.randn(6, 4)
        shard = torch.tensor([0, 1, 1, 0, 1, 0], dtype=torch.int32) if rank % 2 == 0 else \
            torch.tensor([1, 0, 0, 1, 0, 1], dtype=torch.int32)
        gathered = ogsgen.post_matmul_comm_torch(y, rank, world, world)
        scattered = ogsgen.post_matmul_comm_torch(y, rank, 1, world, shard)
        results[rank] = (gathered, scattered)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # (processes: 5 s)
def test_post_matmul_comm_torch_with_gloo_processes():
    """The torch.distributed reference on two CPU processes equals fused_comm_reference of both ranks' outputs."""
    world, port = 2, 29500 + os.getpid() % 1000
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_gloo_rank, args=(world, port, results), nprocs=world, join=True)
        results = dict(results)
    ys, shards = [], []
    for rank in range(world):
        torch.manual_seed(rank)
        ys.append(torch.randn(6, 4))
        shards.append(torch.tensor([0, 1, 1, 0, 1, 0] if rank % 2 == 0 else [1, 0, 0, 1, 0, 1], dtype=torch.int32))
    for rank in range(world):
        gathered, scattered = results[rank]
        torch.testing.assert_close(gathered, fused_comm_reference(ys, rank, world))
        torch.testing.assert_close(scattered, fused_comm_reference(ys, rank, 1, shards))
        assert gathered.shape == (12, 4)


def test_fused_comm_bad_inputs(device):
    x, w = torch.randn(8, 16, device=device).bfloat16(), torch.randn(16, 8, device=device).bfloat16()
    y = torch.zeros(16, 8, device=device).bfloat16()
    handles = torch.tensor([y.data_ptr(), y.data_ptr() + 256], dtype=torch.int64, device=device)

    def call(comm, **kwargs):
        return matmul_ogs(x, w, None, y=kwargs.pop("y", y), fused_comm=comm, **kwargs)
    with pytest.raises(SpecTypeError, match="must be an ogsgen.FusedComm"):
        call(object())
    with pytest.raises(SpecError, match="int64 addresses"):
        call(FusedComm(handles.int(), n_reduce_shards=2))
    with pytest.raises(SpecError, match="n_reduce_shards must be a positive int dividing the 2 ranks"):
        call(FusedComm(handles, n_reduce_shards=3))
    with pytest.raises(SpecError, match=r"reduce_rank must be an int in \[0, n_reduce_shards=2\)"):
        call(FusedComm(handles, reduce_rank=2, n_reduce_shards=2))
    with pytest.raises(SpecError, match="all-gathers the rows over n_reduce_shards ranks, but out_handles has 2"):
        call(FusedComm(handles, n_reduce_shards=1), y=torch.zeros(8, 8, device=device).bfloat16())
    with pytest.raises(SpecError, match=r"y must have shape \(16, 8\)"):
        call(FusedComm(handles, n_reduce_shards=2), y=y[:8])
    with pytest.raises(SpecError, match="needs y, this rank's own buffer"):
        matmul_ogs(x, w, None, fused_comm=FusedComm(handles, n_reduce_shards=2))
    with pytest.raises(SpecError, match="scatter_shard_indx must be a contiguous torch.int32 vector of length 8"):
        call(FusedComm(handles, torch.zeros(7, dtype=torch.int32, device=device)), y=y[:8])
    with pytest.raises(UnsupportedError, match="not with batched x"):
        matmul_ogs(x[None], w[None], None, y=y[None], fused_comm=FusedComm(handles, n_reduce_shards=2))
    if routing_checks.host_checks_apply(x):  # they read the addresses and shards: free on the host only
        with pytest.raises(SpecError, match="y must be this rank's own buffer"):
            call(FusedComm(handles + 64, n_reduce_shards=2))
        with pytest.raises(SpecError, match=r"scatter_shard_indx must name shards in \[0, 2\)"):
            call(FusedComm(handles, torch.full((8,), 2, dtype=torch.int32, device=device)), y=y[:8])
    with pytest.raises(UnsupportedError, match="fused_comm"):
        matmul_ogs(x.float().requires_grad_(), w.float(), None, y=y.float(), fused_comm=FusedComm(handles))


@pytest.mark.parametrize("world", [pytest.param(1, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.slow), 4])
def test_expert_parallel_layer_sums_to_the_whole(world, device):
    """Each rank runs the MoE layer over its share of the experts (expert_parallel_routing: other experts' gates
    -1); the ranks' outputs sum to the layer over all experts."""
    tokens, n_expts, k_act, width, hidden = 13, 8, 2, 32, 16
    ids = torch.topk(torch.randn(tokens, n_expts, device=device), k_act).indices
    weights = torch.rand(tokens, k_act, device=device)
    x = torch.randn(tokens, width, device=device).bfloat16()
    w1 = (torch.randn(n_expts, width, 2 * hidden, device=device) / 4).bfloat16()
    w2 = (torch.randn(n_expts, hidden, width, device=device) / 4).bfloat16()
    swiglu = ogsgen.FusedActivation(ogsgen.swiglu, (1.702, 7.0))

    def layer(rd, gi, si, w1, w2):
        h = matmul_ogs(x, w1, None, rd, gather_indx=gi, fused_activation=swiglu)
        return matmul_ogs(h, w2, None, rd, scatter_indx=si, gammas=rd.gate_scal)
    whole = layer(*ogsgen.routing_from_topk(ids, weights, n_expts), w1, w2).float()
    local = n_expts // world
    parts = [layer(*ogsgen.expert_parallel_routing(ids, weights, n_expts, rank, world),
                   w1[rank * local:(rank + 1) * local], w2[rank * local:(rank + 1) * local]).float()
             for rank in range(world)]
    assert_close(whole, sum(parts))
    with pytest.raises(SpecError, match="world_size must divide it"):
        ogsgen.expert_parallel_routing(ids, weights, n_expts, 0, 3)


def _init_gpu_rank(rank, world, port):
    """This process as NCCL rank ``rank`` on GPU ``rank``, NVLink multicast off (point-to-point stores only; a
    program that uses multicast can take a shared host's GPUs out of service); returns torch's symmetric memory."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NCCL_NVLS_ENABLE="0",
                      TORCH_SYMM_MEM_DISABLE_MULTICAST="1")
    import torch.distributed._symmetric_memory as symm_mem
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    return symm_mem


def _symmetric_memory_rank(rank, world, port, n_reduce_shards, results):
    """One GPU rank: its rows written through symmetric memory, against post_matmul_comm_torch over NCCL."""
    symm_mem = _init_gpu_rank(rank, world, port)
    try:
        torch.manual_seed(rank)
        tokens, n_expts, k_act, width, n = 64, 8, 4, 256, 128
        ids = torch.topk(torch.randn(tokens, n_expts, device="cuda"), k_act).indices
        ids[::7, -1] = -1
        rd, gi, _ = ogsgen.routing_from_topk(ids, torch.rand(tokens, k_act, device="cuda"), n_expts)
        x = torch.randn(tokens, width, device="cuda").bfloat16()
        w = torch.randn(n_expts, width, n, device="cuda").bfloat16()
        rows = tokens * k_act
        shards = None if n_reduce_shards == world else torch.randint(
            0, world // n_reduce_shards, (rows,), dtype=torch.int32, device="cuda")
        buffer = symm_mem.empty(rows * n_reduce_shards, n, dtype=torch.bfloat16, device="cuda")
        buffer.zero_()
        handle = symm_mem.rendezvous(buffer, dist.group.WORLD)
        handles = torch.tensor(handle.buffer_ptrs, dtype=torch.int64, device="cuda")
        handle.barrier()
        matmul_ogs(x, w, None, rd, gather_indx=gi, gammas=rd.gate_scal, y=buffer,
                   fused_comm=FusedComm(handles, shards, rank % n_reduce_shards, n_reduce_shards))
        handle.barrier()
        local = matmul_ogs_torch(x.float(), w.float(), None, rd, gather_indx=gi, gammas=rd.gate_scal).bfloat16()
        local[int(rd.expt_hist.sum()):] = 0  # dropped gates' rows: written nowhere
        expected = ogsgen.post_matmul_comm_torch(local, rank, n_reduce_shards, world, shards)
        results[rank] = ((buffer.float() - expected.float()).abs().max() / expected.float().abs().max()).item()
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
@pytest.mark.parametrize("world,n_reduce_shards", [(1, 1), (2, 2), (2, 1)])
def test_symmetric_memory_ranks_against_nccl(world, n_reduce_shards):
    """Real ranks, one per GPU, their buffers in torch's symmetric memory (P2P stores), against
    post_matmul_comm_torch's NCCL all-gather. World size 1 runs on one GPU; 2 needs two."""
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} GPUs")
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_symmetric_memory_rank, args=(world, 29600 + os.getpid() % 1000, n_reduce_shards, results),
                 nprocs=world, join=True)
        results = dict(results)
    assert len(results) == world and max(results.values()) < 1e-2, results  # bf16 roundings of one result


def _back_to_back_rank(rank, world, port, steps, results):
    """One GPU rank: ``steps`` all-gathers through symmetric memory with no host synchronization between them, each
    step's rows new (seeded by step and rank, so that every rank knows every rank's rows); counts the steps whose
    buffer after the barrier differs from the rows every rank wrote in that step (a store not yet visible leaves the
    step before's rows)."""
    symm_mem = _init_gpu_rank(rank, world, port)
    try:
        m, k, n = 256, 256, 512
        w = torch.randn(k, n, device="cuda", generator=torch.Generator("cuda").manual_seed(0)).bfloat16()
        buffer = symm_mem.empty(m * world, n, dtype=torch.bfloat16, device="cuda")
        handle = symm_mem.rendezvous(buffer, dist.group.WORLD)
        handles = torch.tensor(handle.buffer_ptrs, dtype=torch.int64, device="cuda")
        comm = FusedComm(handles, None, rank, world)
        stale = torch.zeros((), dtype=torch.int64, device="cuda")

        def rows(step, r):
            return torch.randn(m, k, device="cuda", generator=torch.Generator("cuda").manual_seed(step * world + r))
        handle.barrier()
        for step in range(steps):
            matmul_ogs(rows(step, rank).bfloat16(), w, None, y=buffer, fused_comm=comm)
            handle.barrier()  # every rank's stores done before any rank reads
            expected = torch.stack([matmul_ogs(rows(step, r).bfloat16(), w, None) for r in range(world)], 1)
            stale += (buffer.view(m, world, n) != expected).any()
            handle.barrier()  # every rank's reads done before the next step's stores
        results[rank] = int(stale)
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
def test_peer_stores_are_seen_after_the_barrier_step_after_step():
    """Two ranks, 500 back-to-back steps: whether the kernel's stores into the other GPU's buffer need a fence of
    their own before torch's symmetric-memory barrier (none is issued): every step's buffer must hold that step's
    rows."""
    world = 2
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} GPUs")
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_back_to_back_rank, args=(world, 29700 + os.getpid() % 1000, 500, results), nprocs=world, join=True)
        results = dict(results)
    assert results == {0: 0, 1: 0}, f"steps with stale rows, per rank: {results}"


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("k_act", [pytest.param(1, marks=pytest.mark.slow), 2, pytest.param(4, marks=pytest.mark.slow)])
def test_expert_parallel_combine_through_the_topk_reduce(world, k_act, device):
    """Expert parallelism's second matmul: each rank sums its own experts' rows of each token (the top-k reduce,
    gates -1 for other ranks' experts) and sends that partial to every rank, in its own slot; the slots of a token
    sum to the whole layer's row."""
    tokens, n_expts, width, n = 17, 8, 32, 24
    ids = torch.topk(torch.randn(tokens, n_expts, device=device), k_act).indices
    gates = torch.rand(tokens, k_act, device=device)
    w = (torch.randn(n_expts, width, n, device=device) / 4).bfloat16()
    h = torch.randn(tokens * k_act, width, device=device).bfloat16()  # the rows of each gate (t * k + slot)
    rd, _, si = ogsgen.routing_from_topk(ids, gates, n_expts)
    whole = matmul_ogs_torch(h[si.dst_indx.long().clamp_min(0)].float(), w.float(), None, rd, scatter_indx=si,
                             gammas=rd.gate_scal)
    local = n_expts // world
    calls = []
    for rank in range(world):
        rd_r, _, si_r = ogsgen.expert_parallel_routing(ids, gates, n_expts, rank, world)
        rows = h[si_r.dst_indx.long().clamp_min(0)]  # this rank's gates in its expert-sorted order
        calls.append((rows, w[rank * local:(rank + 1) * local], rd_r, si_r))
    buffers = _run_ranks(world, world, lambda r, **kw: matmul_ogs(
        calls[r][0], calls[r][1], None, calls[r][2], scatter_indx=calls[r][3], gammas=calls[r][2].gate_scal, **kw),
        tokens, n, device)
    for buffer in buffers:
        assert_close(whole, buffer.float().view(tokens, world, n).sum(1))
