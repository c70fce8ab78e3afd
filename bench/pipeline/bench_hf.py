#!/usr/bin/env python3
"""GPT-2 from transformers through the pipeline: throughput against one process.

    .venv/bin/python bench/pipeline/bench_hf.py [--np 2] [--microbatches 4] [--layers 8] [--width 256]

Trains GPT2LMHeadModel (built from a config, random weights, tied embeddings,
automatic partition) for --steps steps after --warmup, and reports samples/s:
one plain process with 1 thread and with --np threads, then --np ranks of
smp (--np partitions, --microbatches microbatches, 1 thread each, interleaved
schedule, --optimize speed by default: stages balanced by compute). The
speedups are against the one-thread process; the schedule's ideal is
m / (m + p - 1) x p for p equal stages.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def args_():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--optimize", default="speed", choices=("speed", "memory"),
                   help="smp's optimize: speed balances the stages' compute (default), memory their memory")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--mode", default="", help=argparse.SUPPRESS)
    return p.parse_args()


def model(a):
    import transformers as T
    from transformers.utils import logging
    logging.set_verbosity_error()
    return T.GPT2LMHeadModel(T.GPT2Config(n_layer=a.layers, n_embd=a.width, n_head=4, vocab_size=a.vocab,
                                          n_positions=a.seq, bos_token_id=0, eos_token_id=0))


def batches(a):
    import torch
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, a.vocab, (a.batch, a.seq), generator=g) for _ in range(a.steps + a.warmup)]


def plain(a, threads):
    import torch
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    m = model(a)
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    times = []
    for i, x in enumerate(batches(a)):
        t0 = time.perf_counter()
        opt.zero_grad()
        m(input_ids=x, labels=x, use_cache=False).loss.backward()
        opt.step()
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    return a.batch / statistics.median(times)


def pipelined(a):
    import torch
    sys.path.insert(0, str(ROOT / "python"))
    import shoal.modelparallel as smp
    torch.set_num_threads(1)
    smp.init({"partitions": a.np, "microbatches": a.microbatches, "pipeline": "interleaved",
              "optimize": a.optimize})
    torch.manual_seed(0)
    m = smp.DistributedModel(model(a))
    opt = smp.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.01))

    @smp.step
    def step(model, x):
        out = model(input_ids=x, labels=x)
        model.backward(out.loss)
        return out.loss
    times = []
    for i, x in enumerate(batches(a)):
        t0 = time.perf_counter()
        opt.zero_grad()
        step(m, x)
        opt.step()
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    t = torch.tensor([statistics.median(times)])
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return a.batch / t.item()


def main():
    a = args_()
    if a.mode == "rank":
        sps = pipelined(a)
        if int(os.environ["RANK"]) == 0:
            print("RESULT " + json.dumps({"pipeline": sps}), flush=True)
        return
    one, many = plain(a, 1), plain(a, a.np)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(a.np):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(a.np), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(a.np),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, __file__, *sys.argv[1:], "--mode", "rank"], env=env,
                                      stdout=subprocess.PIPE, text=True))
    out = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit("bench_hf: a rank failed:\n" + "\n".join(out))
    sps = next(json.loads(line[7:])["pipeline"] for line in out[0].splitlines() if line.startswith("RESULT "))
    p, m = a.np, a.microbatches
    print(f"GPT-2 ({a.layers} layers, width {a.width}, vocab {a.vocab}, seq {a.seq}, batch {a.batch}), "
          f"{p} partitions x {m} microbatches, interleaved, optimize={a.optimize}:")
    print(f"  one process, 1 thread : {one:7.2f} samples/s")
    print(f"  one process, {p} threads: {many:7.2f} samples/s  ({many / one:.2f}x)")
    print(f"  pipeline, {p} ranks     : {sps:7.2f} samples/s  ({sps / one:.2f}x; the schedule's ideal "
          f"{m / (m + p - 1) * p:.2f}x)")


if __name__ == "__main__":
    main()
