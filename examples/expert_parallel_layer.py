"""An expert-parallel MoE layer: the experts sharded over the ranks of a torch.distributed process group, tokens
sent to the ranks owning their experts and back with all_to_all_single, each rank's output checked against the same
layer computed by one process over all experts.

    python examples/expert_parallel_layer.py --world 2                      # NCCL, one GPU per rank
    TRITON_INTERPRET=1 python examples/expert_parallel_layer.py --world 2   # gloo on the CPU (small sizes)

Rank r holds experts [r * E / world, (r + 1) * E / world) and its own tokens. Per layer, on every rank:
router matmul -> top-k -> dispatch (the per-destination row counts exchanged, then each token's rows, one per
chosen expert, sent to the expert's rank) -> w1 (+ bias, fused SwiGLU) and w2 (+ bias) over the received rows,
through ogsgen's routing of their local expert ids -> combine (the rows sent back, each token's k rows summed with
its gate weights). NCCL needs `world` GPUs; with fewer (but some) GPUs the example refuses, and without CUDA it runs
its ranks on the CPU through gloo and Triton's interpreter. On GPUs it also prints the time per layer (CUDA events
after warm-up), split into router and dispatch, experts and combine, beside the one-process layer's on the same GPU.
"""
import argparse
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import ogsgen
from ogsgen.moe import select_experts

SWIGLU = ogsgen.FusedActivation(ogsgen.swiglu, (1.702, 7.0))


def experts(x, routing, w1, b1, w2, b2, gammas=None):
    """w1 with SwiGLU over the rows gathered to their experts, w2 scattered back to the rows' order (and, for k > 1,
    summed over each token's k rows)."""
    routing_data, gather_indx, scatter_indx = routing
    hidden = ogsgen.matmul_ogs(x, w1, b1, routing_data, gather_indx=gather_indx, fused_activation=SWIGLU)
    return ogsgen.matmul_ogs(hidden, w2, b2, routing_data, scatter_indx=scatter_indx, gammas=gammas)


def route(x, w_router, n_expts_act):
    """The router: each token's top-k expert ids (n_tokens, k) and gate weights (the softmax over the chosen logits)."""
    logits = ogsgen.matmul_ogs(x, w_router, None,
                               precision_config=ogsgen.PrecisionConfig(out_dtype=torch.float32))
    ids, chosen = select_experts(logits, n_expts_act)
    return ids, torch.softmax(chosen, dim=-1)


def exchange(rows, send_counts, recv_counts):
    """all_to_all_single with variable split sizes: rows[i] goes to the rank its place in send_counts names."""
    out = rows.new_empty((sum(recv_counts), *rows.shape[1:]))
    dist.all_to_all_single(out, rows, recv_counts, send_counts)
    return out


def expert_parallel_layer(x, w_router, w1, b1, w2, b2, n_expts_act, n_expts_tot, rank, world, marks=None):
    """This rank's share of the layer; w1, b1, w2, b2 hold its local experts only. ``marks`` (optional): a callable
    called with "dispatched" and "computed" between the phases (the example's timer)."""
    mark = marks or (lambda phase: None)
    local = n_expts_tot // world
    ids, weights = route(x, w_router, n_expts_act)
    n_tokens, k = ids.shape
    # Dispatch: one row per (token, chosen expert), grouped by the rank owning the expert (a stable sort keeps each
    # group's tokens in order).
    dest = (ids // local).reshape(-1)
    order = torch.argsort(dest, stable=True)
    counts = torch.bincount(dest, minlength=world)
    recv = torch.empty_like(counts)
    dist.all_to_all_single(recv, counts)  # the split sizes first: every rank must know what it receives
    send_counts, recv_counts = counts.tolist(), recv.tolist()  # (all_to_all_single takes them on the host)
    recv_x = exchange(x[order // k], send_counts, recv_counts)
    recv_ids = exchange((ids.reshape(-1)[order] - dest[order] * local).int(), send_counts, recv_counts)
    mark("dispatched")
    # Experts: each received row is one gate (k = 1) of a local expert; the gate weights stay with the token's rank.
    if recv_x.shape[0]:
        routing = ogsgen.routing_from_topk(recv_ids[:, None], torch.ones(recv_x.shape[0], 1, device=x.device), local)
        y = experts(recv_x, routing, w1, b1, w2, b2)
    else:  # (no token chose this rank's experts)
        y = recv_x.new_empty(0, w2.shape[-1])
    mark("computed")
    # Combine: the rows go back to their tokens' ranks (the reverse exchange), into gate order, and each token's k
    # rows are summed with its gate weights.
    rows = torch.empty(n_tokens * k, y.shape[-1], device=x.device, dtype=y.dtype)
    rows[order] = exchange(y, recv_counts, send_counts)
    return (rows.view(n_tokens, k, -1).float() * weights[..., None]).sum(1).to(x.dtype)


def one_process_layer(x, w_router, w1, b1, w2, b2, n_expts_act):
    """The same layer on one process over all experts (the reference)."""
    ids, weights = route(x, w_router, n_expts_act)
    routing = ogsgen.routing_from_topk(ids, weights, w1.shape[0])
    return experts(x, routing, w1, b1, w2, b2, gammas=routing[0].gate_scal)


def _time_ms(step, iters, warmup=3):
    """Mean milliseconds per call of ``step(marks)`` between CUDA events, with its phases split at the marks."""
    for _ in range(warmup):
        step(None)
    totals = {}
    for _ in range(iters):
        events = [("start", torch.cuda.Event(enable_timing=True))]
        events[0][1].record()

        def marks(phase):
            events.append((phase, torch.cuda.Event(enable_timing=True)))
            events[-1][1].record()
        step(marks)
        marks("end")
        torch.cuda.synchronize()
        for (_, before), (phase, after) in zip(events, events[1:]):
            totals[phase] = totals.get(phase, 0.0) + before.elapsed_time(after) / iters
    return totals


def run_rank(rank, args, port, on_gpu):
    if on_gpu:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if on_gpu else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=args.world)
    try:
        device, dtype = torch.device("cuda", rank) if on_gpu else torch.device("cpu"), torch.bfloat16
        h, i, e = args.hidden, args.intermediate, args.experts
        torch.manual_seed(0)  # the same weights on every rank (each keeps its experts; all of them for the check)
        w_router = (torch.randn(h, e, device=device) / h ** 0.5).to(dtype)
        w1 = (torch.randn(e, h, 2 * i, device=device) / h ** 0.5).to(dtype)  # gate/linear columns interleaved
        b1 = torch.randn(e, 2 * i, device=device) * 0.1
        w2 = (torch.randn(e, i, h, device=device) / i ** 0.5).to(dtype)
        b2 = torch.randn(e, h, device=device) * 0.1
        torch.manual_seed(1 + rank)  # each rank's own tokens
        x = torch.randn(args.tokens, h, device=device).to(dtype)
        mine = slice(rank * e // args.world, (rank + 1) * e // args.world)
        local_weights = (w1[mine].contiguous(), b1[mine].contiguous(), w2[mine].contiguous(), b2[mine].contiguous())

        def layer(marks=None):
            return expert_parallel_layer(x, w_router, *local_weights, args.top_k, e, rank, args.world, marks)
        out = layer().float()
        ref = one_process_layer(x, w_router, w1, b1, w2, b2, args.top_k).float()
        diff = ((out - ref).abs().max() / ref.abs().max()).item()
        line = (f"rank {rank}: max relative difference {diff:.3e} against the one-process layer "
                f"(tokens={args.tokens} hidden={h} experts {mine.start}-{mine.stop - 1} of {e} top-{args.top_k} "
                f"{dtype}, {'nccl' if on_gpu else 'gloo'} on {device})")
        if on_gpu:
            dist.barrier()
            split = _time_ms(layer, args.iters)
            whole = _time_ms(lambda marks: one_process_layer(x, w_router, w1, b1, w2, b2, args.top_k), args.iters)
            line += (f"; {sum(split.values()):.3f} ms per layer (router and dispatch {split['dispatched']:.3f}, "
                     f"experts {split['computed']:.3f}, combine {split['end']:.3f}); one process, all {e} experts: "
                     f"{whole['end']:.3f} ms")
        lines = [None] * args.world if rank == 0 else None
        dist.gather_object(line, lines, dst=0)  # (printed by one process: the ranks' lines would interleave)
        if rank == 0:
            print("\n".join(lines), flush=True)
        assert diff < 2e-2, f"rank {rank}: the expert-parallel layer differs from the one-process layer by {diff:.3g}"
    finally:
        dist.destroy_process_group()


def main():
    on_gpu = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", type=int, default=2, help="ranks (processes); on GPUs one GPU each")
    parser.add_argument("--tokens", type=int, default=1024 if on_gpu else 16, help="tokens per rank")
    parser.add_argument("--hidden", type=int, default=2880 if on_gpu else 32)
    parser.add_argument("--intermediate", type=int, default=2880 if on_gpu else 16)
    parser.add_argument("--experts", type=int, default=128 if on_gpu else 4)
    parser.add_argument("--top-k", type=int, default=4 if on_gpu else 2)
    parser.add_argument("--iters", type=int, default=20, help="timed layers per rank (GPUs only)")
    args = parser.parse_args()
    if args.experts % args.world:
        parser.error(f"--experts {args.experts} must split evenly over --world {args.world} ranks")
    if on_gpu and torch.cuda.device_count() < args.world:
        parser.error(f"--world {args.world} needs {args.world} GPUs (NCCL, one GPU per rank); this machine has "
                     f"{torch.cuda.device_count()}. Run fewer ranks, or on the CPU with CUDA_VISIBLE_DEVICES= "
                     f"TRITON_INTERPRET=1")
    # NVLink multicast (NVLS) off: this layer uses point-to-point exchanges only.
    os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1")
    if not on_gpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # (the ranks import Triton afresh: on the CPU, interpreted)
    with socket.socket() as probe:  # a free port for the ranks' rendezvous
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mp.spawn(run_rank, args=(args, port, on_gpu), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
