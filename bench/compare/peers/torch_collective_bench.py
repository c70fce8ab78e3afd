"""nccl-tests style benchmark of torch.distributed collectives (CPU tensors).

Used by bench/compare as the Gloo peer (``--backend gloo``); the same script runs
with shoal's backend (``--backend shoal``) once it is registered with torch.

Without RANK in the environment the script is a launcher: it starts --np copies
of itself with RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR=127.0.0.1 /
MASTER_PORT=<free port> set, forwards rank 0's output and fails if any rank
fails. With RANK set (e.g. under torchrun or shoalrun) it is one worker.

Ops: all_reduce (float32 sum, in place), all_gather_into_tensor, broadcast
(root 0), reduce_scatter_tensor (float32 sum). For each size: warmup iterations, then timed iterations; each one is
preceded by an untimed dist.barrier() (unless --no-barrier) and, for
all_reduce, an untimed reset of the input (all_reduce is in place). Each call is
synchronous and timed alone with time.perf_counter. Reported time: median per
rank, max of the medians across ranks. The last iteration's result is checked.

One JSON object per line per (op, size) on rank 0's stdout, same fields as
bench/compare/peers/mpi_bench.c: impl, op, bytes, count, dtype, time_us, algbw, busbw,
wrong (+ iters, warmup, np). bytes is the output size per rank for allgather
and the input size per rank for reduce_scatter (as nccl-tests).
"""

import os
import statistics
import sys
import time

from bench.compare.peers import peer_common as PC

MODULE = "bench.compare.peers.torch_collective_bench"  # python3 -m MODULE, from the repository root

OPS = ("allreduce", "allgather", "broadcast", "reduce_scatter")
OP_ALIASES = {"all_reduce": "allreduce", "all_gather": "allgather",
              "all_gather_into_tensor": "allgather", "bcast": "broadcast",
              "reduce_scatter_tensor": "reduce_scatter"}


def parse_args(argv=None):
    p = PC.parser(__doc__, None, ",".join(OPS))
    p.add_argument("--backend", default="gloo", help="torch.distributed backend (gloo, shoal, ...)")
    p.add_argument("--import", dest="imports", action="append", default=[],
                   help="module to import before init (e.g. one that registers a backend)")
    a = p.parse_args(argv)
    a.ops = PC.parse_ops(p, a.ops, OPS, OP_ALIASES)
    PC.check_sizes(p, a)
    a.impl = a.impl or a.backend
    return a


def launch(args, argv):
    me = [sys.executable, "-m", MODULE] + list(argv)
    return PC.run_ranks("torch_collective_bench", [(me, env) for env in PC.rank_envs(args.np, PC.free_port())],
                        args.timeout)


def worker(args):
    import datetime
    import warnings

    import torch
    import torch.distributed as dist

    # torch >= 2.10 marks all_gather_into_tensor deprecated; it is still the
    # call that maps onto a backend's allgather_base, which is what we measure.
    warnings.filterwarnings("ignore", message=".*all_gather_into_tensor.*")
    warnings.filterwarnings("ignore", message=".*reduce_scatter_tensor.*")
    for mod in args.imports:
        __import__(mod)
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    dist.init_process_group(args.backend, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=600))
    n = world
    barrier = not args.no_barrier
    max_bytes = args.maxbytes
    max_count = max_bytes // 4 + n

    # Patterns are small integers so float32 sums are exact.
    idx = torch.arange(max_count, dtype=torch.int64)
    pat_full = ((idx % 251) + 1).to(torch.float32)

    def gather_pat(r, count):
        return ((r * 131 + idx[:count]) % 1021).to(torch.float32)

    def max_all(v):
        t = torch.tensor([float(v)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    def sum_all(v):
        t = torch.tensor([int(v)], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return int(t.item())

    has_base = hasattr(dist, "all_gather_into_tensor")
    has_rs_base = hasattr(dist, "reduce_scatter_tensor")

    for op in args.ops:
        for nbytes in PC.sizes(args.minbytes, args.maxbytes, args.stepfactor):
            if op in ("allgather", "reduce_scatter"):
                sendcount = max(1, nbytes // 4 // n)
                count = sendcount * n
            else:
                count = max(1, nbytes // 4)
                sendcount = count
            nbytes = count * 4

            if op == "allreduce":
                src = pat_full[:count] * float(rank + 1)
                buf = src.clone()

                def prep(last, buf=buf, src=src):
                    buf.copy_(src)

                def call(buf=buf):
                    dist.all_reduce(buf, op=dist.ReduceOp.SUM)

                def check(buf=buf, count=count):
                    exp = pat_full[:count] * float(n * (n + 1) // 2)
                    return int((buf != exp).sum().item())
            elif op == "allgather":
                inp = gather_pat(rank, sendcount)
                out = torch.empty(count, dtype=torch.float32)
                views = list(out.split(sendcount))

                def prep(last, out=out):
                    if last:
                        out.fill_(-1.0)

                if has_base:
                    def call(out=out, inp=inp):
                        dist.all_gather_into_tensor(out, inp)
                else:
                    def call(views=views, inp=inp):
                        dist.all_gather(views, inp)

                def check(out=out, sendcount=sendcount):
                    exp = torch.cat([gather_pat(r, sendcount) for r in range(n)])
                    return int((out != exp).sum().item())
            elif op == "reduce_scatter":
                # sendcount: the block each rank gets; count: the input size per rank.
                inp = pat_full[:count] * float(rank + 1)
                out = torch.empty(sendcount, dtype=torch.float32)
                blocks = list(inp.split(sendcount))

                def prep(last, out=out):
                    if last:
                        out.fill_(-1.0)

                if has_rs_base:
                    def call(out=out, inp=inp):
                        dist.reduce_scatter_tensor(out, inp, op=dist.ReduceOp.SUM)
                else:
                    def call(out=out, blocks=blocks):
                        dist.reduce_scatter(out, blocks, op=dist.ReduceOp.SUM)

                def check(out=out, sendcount=sendcount):
                    lo = rank * sendcount
                    exp = pat_full[lo:lo + sendcount] * float(n * (n + 1) // 2)
                    return int((out != exp).sum().item())
            else:
                buf = pat_full[:count].clone() if rank == 0 else torch.full((count,), -1.0)

                def prep(last, buf=buf):
                    if last and rank != 0:
                        buf.fill_(-1.0)

                def call(buf=buf):
                    dist.broadcast(buf, src=0)

                def check(buf=buf, count=count):
                    return int((buf != pat_full[:count]).sum().item())

            touched = (inp, out) if op in ("allgather", "reduce_scatter") else (buf, buf)

            def once(last=False, touched=touched):
                if args.touch:
                    PC.touch(*touched)
                prep(last)
                if barrier:
                    dist.barrier()
                t0 = time.perf_counter()
                call()
                return time.perf_counter() - t0

            times, warmup, iters = PC.timed(args, once, max_all)
            wrong = sum_all(check())
            med = max_all(statistics.median(times))
            if rank == 0:
                PC.print_row(args.impl, op, nbytes, count, med, n, wrong, iters, warmup)
            del prep, call, check
    dist.barrier()
    dist.destroy_process_group()
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return worker(args)
    return launch(args, argv)


if __name__ == "__main__":
    sys.exit(main())
