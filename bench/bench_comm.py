"""Benchmark fused communication on several GPUs of one host: a matmul whose output rows go straight into every
rank's symmetric-memory buffer (FusedComm, an all-gather) against the same matmul followed by NCCL's all-gather.

    PYTHONPATH=. python bench/bench_comm.py --out bench/results/DATE-comm [--world 2] [--tokens 256 2048 8192]

Shapes: the expert layers' output widths, dense rows (tokens, K) @ (K, N): gpt-oss-120b w2 (K 2880, N 2880),
DeepSeek-V3 w2 (K 2048, N 7168). Each rank computes its tokens' rows; afterwards every rank holds all ranks' rows
(interleaved: row m of rank r at m * world + r). Times: each rank's CUDA events around the step (fused: the matmul and
the symmetric memory barrier; NCCL: the matmul and all_gather_into_tensor), median of --reps, the slowest rank's; the
results compared with each other first. Writes results.csv (rank 0) and env.json."""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import ogsgen

from bench_moe import write_csv, write_env

SHAPES = {"gpt-oss-120b w2": (2880, 2880), "DeepSeek-V3 w2": (2048, 7168)}


def _time(step, reps: int) -> float:
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _rank(rank: int, world: int, port: int, args, results) -> None:
    import torch.distributed._symmetric_memory as symm_mem
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    rows = []
    try:
        for name, (k, n) in SHAPES.items():
            for tokens in args.tokens:
                torch.manual_seed(rank)
                x = torch.randn(tokens, k, device="cuda").bfloat16()
                w = torch.randn(k, n, device="cuda").bfloat16() / k ** 0.5
                buffer = symm_mem.empty(tokens * world, n, dtype=torch.bfloat16, device="cuda")
                handle = symm_mem.rendezvous(buffer, dist.group.WORLD)
                comm = ogsgen.FusedComm(torch.tensor(handle.buffer_ptrs, dtype=torch.int64, device="cuda"), None,
                                        rank, world)
                gathered = torch.empty(world, tokens, n, dtype=torch.bfloat16, device="cuda")

                def fused():
                    ogsgen.matmul_ogs(x, w, None, y=buffer, fused_comm=comm)
                    handle.barrier()

                def nccl():
                    dist.all_gather_into_tensor(gathered, ogsgen.matmul_ogs(x, w, None))
                fused()
                nccl()
                torch.cuda.synchronize()
                agree = torch.equal(buffer.view(tokens, world, n), gathered.transpose(0, 1))
                timings = {"fused": _time(fused, args.reps), "matmul + NCCL all-gather": _time(nccl, args.reps)}
                slowest = [None] * world
                for impl, ms in timings.items():
                    dist.all_gather_object(slowest, ms)
                    rows.append(dict(case=f"{name} T={tokens}", impl=impl, world=world, ms=f"{max(slowest):.4f}",
                                     agree=agree))
        if rank == 0:
            results["rows"] = rows
    finally:
        dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--tokens", type=int, nargs="+", default=[256, 2048, 8192])
    parser.add_argument("--reps", type=int, default=50)
    args = parser.parse_args()
    if torch.cuda.device_count() < args.world:
        sys.exit(f"--world {args.world} needs as many GPUs; this machine has {torch.cuda.device_count()}")
    args.out.mkdir(parents=True, exist_ok=True)
    # NVLink multicast off: the fused path stores to peers point to point (and multicast can take a shared host's
    # GPUs out of service)
    os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1")
    write_env(args.out, world=args.world)
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_rank, args=(args.world, 29700 + os.getpid() % 1000, args, results), nprocs=args.world, join=True)
        rows = results["rows"]
    write_csv(rows, args.out / "results.csv")
    for row in rows:
        print(f"{row['case']:28s} {row['impl']:26s} {row['ms']} ms  outputs agree: {row['agree']}")


if __name__ == "__main__":
    main()
