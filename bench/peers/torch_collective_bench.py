#!/usr/bin/env python3
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
bench/peers/mpi_bench.c: impl, op, bytes, count, dtype, time_us, algbw, busbw,
wrong (+ iters, warmup, np). bytes is the output size per rank for allgather
and the input size per rank for reduce_scatter (as nccl-tests).
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

OPS = ("allreduce", "allgather", "broadcast", "reduce_scatter")
OP_ALIASES = {"all_reduce": "allreduce", "all_gather": "allgather",
              "all_gather_into_tensor": "allgather", "bcast": "broadcast",
              "reduce_scatter_tensor": "reduce_scatter"}


def parse_size(text):
    s = text.strip()
    if s[-1:] in "bB" and len(s) > 1 and s[-2:-1].isalpha():
        s = s[:-1]
    mult = 1
    if s and s[-1] in "kKmMgG":
        mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[s[-1].lower()]
        s = s[:-1]
    return int(float(s) * mult)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="gloo", help="torch.distributed backend (gloo, shoal, ...)")
    p.add_argument("--impl", default=None, help="name in the JSON rows (default: the backend)")
    p.add_argument("--np", type=int, default=2, help="ranks to launch (launcher mode)")
    p.add_argument("-b", "--minbytes", type=parse_size, default=8)
    p.add_argument("-e", "--maxbytes", type=parse_size, default=256 << 20)
    p.add_argument("-f", "--stepfactor", type=float, default=2.0)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--min-iters", type=int, default=5)
    p.add_argument("--budget", type=float, default=0.0,
                   help="seconds per size; cut warmup/iters to fit (>= --min-iters); 0 = off")
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--no-barrier", action="store_true")
    p.add_argument("--import", dest="imports", action="append", default=[],
                   help="module to import before init (e.g. one that registers a backend)")
    p.add_argument("--timeout", type=float, default=1800.0,
                   help="launcher: seconds before all ranks are killed")
    a = p.parse_args(argv)
    ops = []
    for tok in a.ops.split(","):
        tok = OP_ALIASES.get(tok.strip(), tok.strip())
        if tok not in OPS:
            p.error(f"unknown op {tok!r} (choose from {', '.join(OPS)})")
        ops.append(tok)
    a.ops = ops
    if a.stepfactor <= 1.0:
        p.error("-f must be > 1")
    a.iters = max(1, a.iters)
    a.min_iters = max(1, min(a.min_iters, a.iters))
    a.warmup = max(0, a.warmup)
    a.minbytes = max(4, a.minbytes)
    if a.maxbytes < a.minbytes:
        p.error("-e must be >= -b")
    a.impl = a.impl or a.backend
    return a


def sizes(lo, hi, factor):
    out, s = [], float(lo)
    while s <= hi * 1.000001:
        out.append(int(s))
        s *= factor
    return out


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args, argv):
    port = free_port()
    procs = []
    for r in range(args.np):
        env = dict(os.environ)
        env.update(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(args.np),
                   LOCAL_WORLD_SIZE=str(args.np), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port))
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        env.setdefault("OMP_NUM_THREADS", "1")
        out = None if r == 0 else subprocess.DEVNULL
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)] + list(argv),
                                      env=env, stdout=out))
    deadline = time.monotonic() + args.timeout
    rc = 0
    try:
        while procs:
            for pr in list(procs):
                code = pr.poll()
                if code is None:
                    continue
                procs.remove(pr)
                if code != 0:
                    rc = rc or code
                    for other in procs:  # one rank died: the others would hang
                        other.terminate()
            if time.monotonic() > deadline:
                print("torch_collective_bench: timeout, killing ranks", file=sys.stderr)
                for pr in procs:
                    pr.kill()
                rc = rc or 124
                deadline = float("inf")
            time.sleep(0.05)
    except KeyboardInterrupt:
        for pr in procs:
            pr.kill()
        raise
    return rc


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
        for nbytes in sizes(args.minbytes, args.maxbytes, args.stepfactor):
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

            def once(last=False):
                prep(last)
                if barrier:
                    dist.barrier()
                t0 = time.perf_counter()
                call()
                return time.perf_counter() - t0

            warmup, iters = args.warmup, args.iters
            t_est = 0.0
            if warmup > 0:
                t_est = max_all(once())
                if args.budget > 0 and t_est > 0:
                    warmup = min(warmup, 1 + int(0.25 * args.budget / t_est))
                best = t_est
                for _ in range(warmup - 1):
                    best = min(best, once())
                t_est = max_all(best)
            if args.budget > 0:
                if t_est <= 0:
                    t_est = max_all(once())
                iters = min(iters, int(args.budget / max(t_est, 1e-9)))
                iters = max(iters, args.min_iters)

            times = [once(last=(i == iters - 1)) for i in range(iters)]
            wrong = sum_all(check())
            med = max_all(statistics.median(times))
            if rank == 0:
                factor = {"allreduce": 2.0 * (n - 1) / n, "allgather": (n - 1) / n,
                          "reduce_scatter": (n - 1) / n, "broadcast": 1.0}[op]
                algbw = nbytes / med / 1e9 if med > 0 else 0.0
                print(json.dumps({
                    "impl": args.impl, "op": op, "bytes": nbytes, "count": count,
                    "dtype": "float32", "time_us": round(med * 1e6, 3),
                    "algbw": float(f"{algbw:.6g}"), "busbw": float(f"{algbw * factor:.6g}"),
                    "wrong": wrong, "iters": iters, "warmup": warmup, "np": n,
                }), flush=True)
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
