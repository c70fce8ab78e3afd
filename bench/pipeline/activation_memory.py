#!/usr/bin/env python3
"""Peak memory per rank of GPT-2 trained through the pipeline, mode against mode.

    .venv/bin/python bench/pipeline/activation_memory.py [--modes baseline,checkpointing] [--np 2]
                     [--layers 8] [--width 256] [--seq 512] [--batch 8] [--microbatches 4] [--steps 3]

Trains GPT2LMHeadModel (transformers, built from a config, random weights,
tied embeddings, automatic partition with optimize "speed") on --np ranks /
--np partitions, once per mode, and reports per rank the peak resident set
size (VmHWM) over the timed steps and the median step time. The peak is reset
after the warm-up step (which partitions the model: building the whole model
and measuring it would otherwise be the peak), by writing 5 to
/proc/self/clear_refs after glibc's malloc_trim; the ranks run with glibc's
mmap threshold fixed at 64 KiB, so a freed tensor goes back to the system
and the peak follows the live tensors (parameters, gradients, optimizer
state, activations kept for the backward pass, messages in flight). Linux
only.

Modes (MODES; each is what it changes around smp.DistributedModel):
- baseline: the model as built;
- checkpointing: smp.set_activation_checkpointing on every transformer block
  (``transformer.h``, strategy "each"): a block keeps its input, its inner
  activations are recomputed in the backward pass;
- delayed: the model built under smp.delay_param_initialization (parameters
  on the meta device until partitioning, then each rank materialises its own
  partition's). Compare its "built" peak (after building the model, before
  partitioning) and "build peak" (through partitioning and the first forward
  and backward pass, before the optimizer's state exists) with baseline's.

A further mode is a Mode(build, after_wrap, what) entry: build(args) returns
the module to wrap, after_wrap(model) runs on the DistributedModel before the
first step.
"""

import argparse
import ctypes
import dataclasses
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

ROOT = Path(__file__).resolve().parents[2]


def gpt2(a):
    import transformers as T
    from transformers.utils import logging
    logging.set_verbosity_error()
    return T.GPT2LMHeadModel(T.GPT2Config(n_layer=a.layers, n_embd=a.width, n_head=4, vocab_size=a.vocab,
                                          n_positions=a.seq, bos_token_id=0, eos_token_id=0))


def gpt2_delayed(a):
    import shoal.modelparallel as smp
    with smp.delay_param_initialization(enabled=True):
        return gpt2(a)


def checkpoint_blocks(model):
    import shoal.modelparallel.activation_checkpointing as ac
    ac.set_activation_checkpointing(model.module.transformer.h, strategy="each")


@dataclasses.dataclass
class Mode:
    build: Callable
    after_wrap: Optional[Callable]
    what: str


MODES = {
    "baseline": Mode(gpt2, None, "the model as built"),
    "checkpointing": Mode(gpt2, checkpoint_blocks, "every transformer block checkpointed (strategy each)"),
    "delayed": Mode(gpt2_delayed, None, "built under smp.delay_param_initialization (meta parameters; each "
                    "rank materialises its partition)"),
}


def args_():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", default="baseline,checkpointing", help=f"comma-separated, of {', '.join(MODES)}")
    for flag, default, what in (("--np", 2, "ranks = partitions"), ("--layers", 8, "transformer blocks"),
                                ("--width", 256, "hidden size"), ("--vocab", 8000, "vocabulary"),
                                ("--seq", 512, "tokens per sequence"), ("--batch", 8, "sequences per step"),
                                ("--microbatches", 4, "microbatches per step")):
        p.add_argument(flag, type=int, default=default, help=what)
    p.add_argument("--pipeline", default="interleaved", choices=("interleaved", "simple"))
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--json", default=None, help="also write the results to this file (one object)")
    p.add_argument("--rank-mode", default="", help=argparse.SUPPRESS)
    return p.parse_args()


def _status_kb(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {key} in /proc/self/status")


def _reset_peak() -> None:
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def rank_main(a) -> dict:
    import torch
    sys.path.insert(0, str(ROOT / "python"))
    import shoal.modelparallel as smp
    torch.set_num_threads(1)
    mode = MODES[a.rank_mode]
    smp.init({"partitions": a.np, "microbatches": a.microbatches, "pipeline": a.pipeline, "optimize": "speed"})
    torch.manual_seed(0)
    model = smp.DistributedModel(mode.build(a))
    built = _status_kb("VmHWM")     # the peak of building the model (before partitioning)
    if mode.after_wrap:
        mode.after_wrap(model)
    opt = smp.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-4))

    @smp.step
    def step(model, x):
        out = model(input_ids=x, labels=x)
        model.backward(out.loss)
        return out.loss

    g = torch.Generator().manual_seed(0)
    data = [torch.randint(0, a.vocab, (a.batch, a.seq), generator=g) for _ in range(a.steps + 1)]
    times, losses = [], []
    for i, x in enumerate(data):
        if i == 1:      # after the warm-up step (partitioning, optimizer state): the peak from here on
            smp.barrier()
            _reset_peak()
            base = _status_kb("VmRSS")
        t0 = time.perf_counter()
        opt.zero_grad()
        losses.append(float(step(model, x).reduce_mean()))
        if i == 0:      # built, measured, partitioned, one forward and backward; no optimizer state yet
            build_peak = _status_kb("VmHWM")
        opt.step()
        if i >= 1:
            times.append(time.perf_counter() - t0)
    return {"rank": smp.rank(), "peak_mib": _status_kb("VmHWM") / 1024, "start_mib": base / 1024,
            "built_mib": built / 1024, "build_peak_mib": build_peak / 1024,
            "step_s": statistics.median(times), "losses": losses,
            "params": sum(p.numel() for p in model.local_parameters())}


def run_mode(a, name: str) -> list:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(a.np):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(a.np), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(a.np),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
                   MALLOC_MMAP_THRESHOLD_="65536")
        procs.append(subprocess.Popen([sys.executable, __file__, *sys.argv[1:], "--rank-mode", name], env=env,
                                      stdout=subprocess.PIPE, text=True))
    out = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"activation_memory: a rank failed in mode {name}:\n" + "\n".join(out))
    return [next(json.loads(line[7:]) for line in o.splitlines() if line.startswith("RESULT ")) for o in out]


def main():
    a = args_()
    if a.rank_mode:
        print("RESULT " + json.dumps(rank_main(a)), flush=True)
        return
    modes = a.modes.split(",")
    for m in modes:
        if m not in MODES:
            raise SystemExit(f"activation_memory: unknown mode {m!r} (have {', '.join(MODES)})")
    res = {m: run_mode(a, m) for m in modes}
    first = modes[0]
    print(f"GPT-2 ({a.layers} layers, width {a.width}, vocab {a.vocab}, seq {a.seq}, batch {a.batch}), "
          f"{a.np} partitions x {a.microbatches} microbatches, {a.pipeline}, AdamW; peak RSS per rank over "
          f"{a.steps} steps after a warm-up step (MiB), median step time:")
    print(f"  {'mode':<14} {'rank':>4} {'params':>10} {'built':>7} {'build peak':>11} {'RSS at start':>13} {'peak':>9} "
          f"{'peak - start':>13} {'vs ' + first:>12} {'step':>8}")
    for m in modes:
        for r, x in enumerate(res[m]):
            ref = res[first][r]
            rel = (x["peak_mib"] - x["start_mib"]) / max(1e-9, ref["peak_mib"] - ref["start_mib"])
            print(f"  {m:<14} {r:>4} {x['params']:>10,} {x['built_mib']:>7.1f} {x['build_peak_mib']:>11.1f} "
                  f"{x['start_mib']:>12.1f} "
                  f"{x['peak_mib']:>9.1f} "
                  f"{x['peak_mib'] - x['start_mib']:>13.1f} {rel:>11.2f}x {x['step_s'] * 1e3:>6.0f}ms")
    for m in modes[1:]:
        same = all(abs(p - q) <= 1e-4 * abs(q) for p, q in zip(res[m][-1]["losses"], res[first][-1]["losses"]))
        print(f"  losses of {m} {'equal' if same else 'DIFFER from'} {first}'s "
              f"({', '.join(f'{v:.4f}' for v in res[m][-1]['losses'])})")
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "machine": platform.platform(),
                                            "cpus": os.cpu_count(), "results": res}, indent=1) + "\n")


if __name__ == "__main__":
    main()
