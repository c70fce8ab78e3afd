#!/usr/bin/env python3
"""GPT-2 from transformers through the pipeline: throughput against one process.

    .venv/bin/python bench/pipeline/bench_hf.py [--np 2] [--replicas 1] [--microbatches 4] [--layers 8]
                                                [--width 256] [--memory-weight W] [--breakdown]
    .venv/bin/python bench/pipeline/bench_hf.py --per-sample [--batch 32]

Trains GPT2LMHeadModel (built from a config, random weights, tied embeddings,
automatic partition) for --steps steps after --warmup, and reports samples/s:
one plain process with 1 thread (before and after the pipeline, the mean is
the baseline; a drift of more than 10% between them is flagged) and with
--np threads, then --np ranks of
smp (--np partitions, --microbatches microbatches, 1 thread each, interleaved
schedule, --optimize speed by default: stages balanced by compute). The
speedups are against the one-thread process; the schedule's ideal is
m / (m + p - 1) x p for p equal stages. With --replicas R, R pipelines of
--np partitions each (np x R ranks) train on --batch samples each, as smp's
data-parallel ranks each load their own batch, their gradients averaged by
smp's data parallelism; the one-process baselines train on the whole R x
--batch.

--breakdown records smp's timeline over the timed steps and prints, per rank,
where a step's time goes: forward and backward compute, waits in receives,
starting sends, the data-parallel allreduce, waiting for sends at the end, and
the rest (the step function, microbatch splitting, the optimizer, scheduling).
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
    p.add_argument("--replicas", type=int, default=1, help="data-parallel replicas of the pipeline")
    p.add_argument("--breakdown", action="store_true", help="per-rank time breakdown from smp's timeline")
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=16, help="samples per step of each pipeline replica")
    p.add_argument("--optimize", default="speed", choices=("speed", "memory"),
                   help="smp's optimize: speed balances the stages' compute (default), memory their memory")
    p.add_argument("--memory-weight", type=float, default=None,
                   help="smp's memory_weight (default: optimize's, 0.2 for speed): 0 balances the "
                        "stages by measured time alone")
    p.add_argument("--per-sample", action="store_true",
                   help="only measure one process's forward + backward per sample for each microbatch size "
                        "up to --batch (what smaller microbatches cost a core)")
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
    """The global batches: --batch samples for each replica."""
    import torch
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, a.vocab, (a.batch * a.replicas, a.seq), generator=g)
            for _ in range(a.steps + a.warmup)]


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
    return a.batch * a.replicas / statistics.median(times)


def per_sample(a):
    """One thread's forward + backward per sample when --batch samples run in
    microbatches of 1, 2, 4, ... --batch: fastest of 3 passes after one warm-up."""
    import torch
    torch.set_num_threads(1)
    torch.manual_seed(0)
    m = model(a)
    x = batches(a)[0][:a.batch]
    sizes = [b for b in (1, 2, 4, 8, 16, 32, 64, 128) if b <= a.batch and a.batch % b == 0]
    out = {}
    for b in sizes:
        best = float("inf")
        for rep in range(4):
            t0 = time.perf_counter()
            for i in range(0, a.batch, b):
                m(input_ids=x[i:i + b], labels=x[i:i + b], use_cache=False).loss.backward()
            if rep:
                best = min(best, time.perf_counter() - t0)
        out[b] = 1e3 * best / a.batch
    print(f"GPT-2 ({a.layers} layers, width {a.width}, vocab {a.vocab}, seq {a.seq}), one process, 1 thread, "
          f"forward + backward of {a.batch} samples:")
    for b, ms in out.items():
        print(f"  microbatches of {b:3d}: {ms:6.2f} ms per sample ({ms / out[sizes[-1]]:.2f}x the whole batch's)")


def pipelined(a):
    import torch
    sys.path.insert(0, str(ROOT / "python"))
    import shoal.modelparallel as smp
    torch.set_num_threads(1)
    cfg = {"partitions": a.np, "microbatches": a.microbatches, "pipeline": "interleaved",
           "optimize": a.optimize, "ddp": a.replicas > 1}
    if a.memory_weight is not None:
        cfg["memory_weight"] = a.memory_weight
    smp.init(cfg)
    from shoal.modelparallel import timeline
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
        if i == a.warmup and a.breakdown:
            timeline.enable()
        t0 = time.perf_counter()
        opt.zero_grad()
        step(m, x[smp.dp_rank() * a.batch:(smp.dp_rank() + 1) * a.batch])
        opt.step()
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    t = torch.tensor([statistics.median(times)])
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    parts = breakdown(timeline.events(), sum(times) / len(times)) if a.breakdown else None
    if parts is not None:
        parts = {"pp": smp.pp_rank(), "dp": smp.dp_rank(), **parts}
    return a.batch * a.replicas / t.item(), parts


CATEGORIES = (("forward", "F "), ("backward", "B "), ("recv wait", "recv "), ("send start", "send "),
              ("dp allreduce", "allreduce"), ("wait sends", "wait sends"))


def breakdown(events, mean_step):
    """Mean milliseconds per step in each category (events of the timed steps)."""
    steps = max(1, sum(1 for e in events if e[0] == "wait sends"))
    out = {}
    for label, prefix in CATEGORIES:
        out[label] = 1e3 * sum(e[3] - e[2] for e in events if e[0].startswith(prefix)) / steps
    out["rest"] = 1e3 * mean_step - sum(out.values())
    out["step"] = 1e3 * mean_step
    return out


def main():
    a = args_()
    if a.mode == "rank":
        sps, parts = pipelined(a)
        print("RESULT " + json.dumps({"pipeline": sps, "parts": parts}), flush=True)
        return
    if a.per_sample:
        per_sample(a)
        return
    if a.batch % a.microbatches:
        raise SystemExit(f"bench_hf: --batch {a.batch} does not divide into {a.microbatches} microbatches")
    world = a.np * a.replicas
    one_before, many = plain(a, 1), plain(a, a.np)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, __file__, *sys.argv[1:], "--mode", "rank"], env=env,
                                      stdout=subprocess.PIPE, text=True))
    out = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit("bench_hf: a rank failed:\n" + "\n".join(out))
    res = [next(json.loads(line[7:]) for line in o.splitlines() if line.startswith("RESULT ")) for o in out]
    sps = res[0]["pipeline"]
    # the machine's speed drifts: the baseline again after the pipeline, and their mean
    one_after = plain(a, 1)
    one = (one_before + one_after) / 2
    p, m, r = a.np, a.microbatches, a.replicas
    batch = f"batch {a.batch}" if r == 1 else f"batch {a.batch} per replica, {a.batch * r} in all"
    print(f"GPT-2 ({a.layers} layers, width {a.width}, vocab {a.vocab}, seq {a.seq}, {batch}), "
          f"{p} partitions x {m} microbatches x {r} replica(s), interleaved, optimize={a.optimize}"
          f"{'' if a.memory_weight is None else f', memory_weight={a.memory_weight}'}:")
    drift = abs(one_after - one_before) / one
    print(f"  one process, 1 thread : {one:7.2f} samples/s  (before {one_before:.2f}, after {one_after:.2f}"
          f"{'; the machine drifted more than 10%: rerun' if drift > 0.10 else ''})")
    print(f"  one process, {p} threads: {many:7.2f} samples/s  ({many / one:.2f}x)")
    cores = os.cpu_count() or 1
    ideal = m / (m + p - 1) * p * r
    ceiling = f"; with {world} ranks on {cores} cores at most {cores:.2f}x" if world > cores else ""
    print(f"  pipeline, {world} ranks     : {sps:7.2f} samples/s  ({sps / one:.2f}x; the schedule's ideal "
          f"{ideal:.2f}x{ceiling})")
    if a.breakdown:
        cols = [k for k in res[0]["parts"] if k not in ("pp", "dp")]
        print("  per step, ms (mean over the timed steps):")
        print("    " + " " * 16 + "".join(f"{k:>13}" for k in cols))
        for rank, x in enumerate(res):
            q = x["parts"]
            print(f"    rank {rank} (pp {q['pp']}, dp {q['dp']})" + "".join(f"{q[k]:13.1f}" for k in cols))


if __name__ == "__main__":
    main()
