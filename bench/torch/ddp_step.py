#!/usr/bin/env python3
"""DDP training-step benchmark: a ~25M-parameter MLP on N CPU ranks.

Without RANK in the environment this is a launcher: it starts --np copies of
itself (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1, MASTER_PORT) and
forwards rank 0's output. With RANK set (shoalrun, torchrun) it is one worker.

Per backend it measures, after warmup, the median over --steps of:
  step_ms         a full DDP step (forward, backward with gradient allreduce
                  overlapped by DDP's buckets, optimizer step)
  compute_ms      the same step under ddp.no_sync() (no communication at all)
  exposed_comm_ms step_ms - compute_ms: what communication adds to a step
  comm_busy_ms    time during which at least one bucket allreduce was in flight
                  (a comm hook timestamps each bucket from issue to completion;
                  measured in separate steps)
and prints one JSON row on rank 0's stdout.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="shoal")
    p.add_argument("--import", dest="imports", action="append", default=[],
                   help="module to import first (default for shoal: shoal.torch)")
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--width", type=int, default=2048, help="hidden width (default 2048)")
    p.add_argument("--layers", type=int, default=6, help="layers (default 6: 25.2M parameters)")
    p.add_argument("--batch", type=int, default=32, help="per-rank batch (default 32)")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    p.add_argument("--threads", type=int, default=0, help="torch threads per rank (0: cores / ranks)")
    return p.parse_args()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args):
    port = free_port()
    procs = []
    for r in range(args.np):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(args.np),
                   LOCAL_WORLD_SIZE=str(args.np), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)] + sys.argv[1:],
                                      env=env, stdout=None if r == 0 else subprocess.DEVNULL))
    rc = 0
    for p in procs:
        rc = rc or p.wait()
    return rc


def worker(args):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    if args.backend in ("shoal", "smddp") and not args.imports:
        args.imports = ["shoal.torch" if args.backend == "shoal"
                        else "smdistributed.dataparallel.torch.torch_smddp"]
    for m in args.imports:
        __import__(m)
    ws = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_WORLD_SIZE", ws))
    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // local))
    dist.init_process_group(args.backend)
    rank = dist.get_rank()
    torch.manual_seed(0)
    layers = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1])
    nparams = sum(p.numel() for p in model.parameters())
    ddp = DDP(model, bucket_cap_mb=args.bucket_cap_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-4)
    x = torch.randn(args.batch, args.width)

    def step():
        opt.zero_grad(set_to_none=False)
        ddp(x).square().mean().backward()
        opt.step()

    def timed(n, ctx=None):
        out = []
        for _ in range(n):
            dist.barrier()
            t0 = time.perf_counter()
            if ctx is None:
                step()
            else:
                with ctx():
                    step()
            out.append(time.perf_counter() - t0)
        return out

    timed(args.warmup)
    full = timed(args.steps)
    compute = timed(args.steps, ddp.no_sync)

    intervals = []

    def timing_hook(state, bucket):
        t0 = time.perf_counter()
        buf = bucket.buffer()
        buf.div_(ws)
        fut = dist.all_reduce(buf, async_op=True).get_future()

        def done(f):
            intervals.append((t0, time.perf_counter()))
            return f.value()[0]
        return fut.then(done)

    ddp.register_comm_hook(None, timing_hook)
    timed(1)
    busy = []
    for _ in range(args.steps):
        intervals.clear()
        timed(1)
        iv = sorted(intervals)
        total, cur_s, cur_e = 0.0, None, None
        for s, e in iv:
            if cur_e is None or s > cur_e:
                if cur_e is not None:
                    total += cur_e - cur_s
                cur_s, cur_e = s, e
            else:
                cur_e = max(cur_e, e)
        if cur_e is not None:
            total += cur_e - cur_s
        busy.append(total)

    def agree(v):  # the slowest rank's median
        t = torch.tensor([statistics.median(v)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item() * 1e3

    step_ms, compute_ms, busy_ms = agree(full), agree(compute), agree(busy)
    if rank == 0:
        print(json.dumps({"impl": args.backend, "bench": "ddp_step", "np": ws, "params": nparams,
                          "grad_bytes": nparams * 4, "batch": args.batch, "steps": args.steps,
                          "step_ms": round(step_ms, 2), "compute_ms": round(compute_ms, 2),
                          "exposed_comm_ms": round(step_ms - compute_ms, 2),
                          "comm_busy_ms": round(busy_ms, 2)}), flush=True)
    dist.destroy_process_group()


def main():
    args = parse_args()
    if "RANK" not in os.environ:
        return launch(args)
    worker(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
