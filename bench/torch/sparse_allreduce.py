#!/usr/bin/env python3
"""Sparse all_reduce of an embedding-bag gradient: shoal against Gloo, same run.

    .venv/bin/python bench/torch/sparse_allreduce.py [--nproc 2] [--rows 1000000] [--dim 64]
        [--bags 2048] [--bag-size 20] [--reps 20]

Each rank takes the gradient of nn.EmbeddingBag(rows, dim, sparse=True) for
its own random batch (bags x bag-size lookups, so indices repeat within and
across ranks) and all_reduces a copy of it on a shoal group and on a Gloo
group of the same ranks, in turn. Prints the median time per all_reduce and
the result's size for both; the sums must agree.
"""

import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import shoal.torch  # noqa: F401  (registers the "shoal" backend)


def gradient(args, rank):
    torch.manual_seed(1000 + rank)
    emb = torch.nn.EmbeddingBag(args.rows, args.dim, mode="sum", sparse=True)
    idx = torch.randint(0, args.rows, (args.bags * args.bag_size,))
    offsets = torch.arange(0, args.bags * args.bag_size, args.bag_size)
    emb(idx, offsets).sum().backward()
    return emb.weight.grad


def rank_main(rank, world, port, args, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    groups = {"shoal": dist.new_group(backend="shoal"), "gloo": dist.new_group(backend="gloo")}
    grad = gradient(args, rank)
    times = {b: [] for b in groups}
    results = {}
    for _ in range(args.reps):
        for b, g in groups.items():
            t = grad.clone()
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(t, group=g)
            times[b].append(time.perf_counter() - start)
            results[b] = t
    agree = torch.allclose(results["shoal"].coalesce().to_dense(), results["gloo"].coalesce().to_dense(),
                           atol=1e-4)
    if rank == 0:
        queue.put({"nnz_in": grad._nnz(), "nnz_out": results["shoal"]._nnz(), "agree": agree,
                   **{b: statistics.median(v) * 1e3 for b, v in times.items()}})
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--bags", type=int, default=2048)
    p.add_argument("--bag-size", type=int, default=20)
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    queue = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(rank_main, args=(args.nproc, port, args, queue), nprocs=args.nproc, start_method="spawn")
    r = queue.get()
    print(f"sparse all_reduce, {args.nproc} ranks, EmbeddingBag({args.rows}, {args.dim}) gradient of "
          f"{args.bags}x{args.bag_size} lookups: nnz {r['nnz_in']} per rank, {r['nnz_out']} in the sum")
    print(f"  shoal {r['shoal']:.2f} ms   gloo {r['gloo']:.2f} ms   gloo/shoal {r['gloo'] / r['shoal']:.2f}x   "
          f"results agree: {r['agree']}")
    if not r["agree"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
