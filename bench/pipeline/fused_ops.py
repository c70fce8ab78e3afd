#!/usr/bin/env python3
"""smp.optimizers and smp.nn.FusedLayerNorm against torch's own and a per-parameter loop.

The parameters are GPT-2 small's shapes (token and position embeddings, 12
blocks of two LayerNorms, attention c_attn/c_proj and MLP c_fc/c_proj with
biases, a final LayerNorm: 124.4 M values, 148 tensors; --layers, --d-model,
--vocab shrink it), random, with random gradients that stay set. Every
optimizer gets its own state in each round: a fresh optimizer, one warm-up
step (it creates the state), --steps timed steps; --rounds rounds, the
implementations interleaved within each round so that a busy machine weighs on
all of them alike. Per implementation: median, p10, p90 of the step time (ms)
and the median against torch.optim.AdamW(foreach=True).

  torch-adam-foreach     torch.optim.Adam(foreach=True)
  torch-adamw-foreach    torch.optim.AdamW(foreach=True, weight_decay=0.01)
  torch-adam-loop        torch.optim.Adam(foreach=False): torch's per-parameter path
  torch-adamw-fused      torch.optim.AdamW(fused=True) where the build has it (for reference)
  smp-fused-adam         smp.optimizers.FusedAdam(weight_decay=0.01) (AdamW mode, apex's default): torch's
                         single-pass Adam kernel where it applies
  smp-fused-adam-foreach the same on its torch._foreach_* path (use_torch_kernel = False)
  smp-fused-lamb         smp.optimizers.FusedLamb() (weight_decay 0.01, max_grad_norm 1.0: clip engaged)
  loop-lamb              the same LAMB written per parameter (this file)
  smp-fused-novograd     smp.optimizers.FusedNovoGrad(weight_decay=0.01)
  loop-novograd          the same NovoGrad written per parameter (this file)

FusedLayerNorm against nn.LayerNorm: forward + backward of (--ln-rows, d_model).

Writes --out/results.md and --out/meta.json (command, commit, machine, load).
"""

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))

import torch  # noqa: E402

from shoal.modelparallel import optimizers as O  # noqa: E402
from shoal.modelparallel.nn import FusedLayerNorm  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag, default, what in (("--layers", 12, "GPT-2 blocks"), ("--d-model", 768, "hidden size"),
                                ("--vocab", 50257, "vocabulary"), ("--ctx", 1024, "positions"),
                                ("--steps", 4, "timed steps per round"), ("--rounds", 3, "rounds"),
                                ("--ln-rows", 8192, "LayerNorm rows (batch x sequence)"),
                                ("--ln-iters", 20, "LayerNorm iterations")):
        p.add_argument(flag, type=int, default=default, help=f"{what} (default {default})")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--impls", default="", help="comma-separated subset of the implementations")
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "fused-ops"))
    return p.parse_args()


def gpt2_shapes(layers, d, vocab, ctx):
    shapes = [(vocab, d), (ctx, d)]
    for _ in range(layers):
        shapes += [(d,), (d,), (d, 3 * d), (3 * d,), (d, d), (d,), (d,), (d,), (d, 4 * d), (4 * d,), (4 * d, d), (d,)]
    return shapes + [(d,), (d,)]


# ----------------------------------------------------------------- per-parameter loops (apex's rules)

class LoopLamb(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, max_grad_norm=1.0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.max_grad_norm = max_grad_norm

    @torch.no_grad()
    def step(self):
        ps = [p for g in self.param_groups for p in g["params"] if p.grad is not None]
        norm = math.sqrt(sum(float(p.grad.double().square().sum()) for p in ps))
        clip = max(norm / self.max_grad_norm, 1.0)
        for group in self.param_groups:
            group["step"] = t = group.get("step", 0) + 1
            (b1, b2), lr, eps, wd = group["betas"], group["lr"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                st = self.state[p]
                if not st:
                    st["m"], st["v"] = torch.zeros_like(p), torch.zeros_like(p)
                g = p.grad / clip
                st["m"].mul_(b1).add_(g, alpha=1 - b1)
                st["v"].mul_(b2).addcmul_(g, g, value=1 - b2)
                u = (st["m"] / (1 - b1 ** t)) / ((st["v"] / (1 - b2 ** t)).sqrt_().add_(eps))
                u.add_(p, alpha=wd)
                pn, un = float(p.norm()), float(u.norm())
                ratio = pn / un if pn > 0 and un > 0 else 1.0
                p.add_(u, alpha=-lr * ratio)


class LoopNovoGrad(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            group["step"] = t = group.get("step", 0) + 1
            (b1, b2), lr, eps, wd = group["betas"], group["lr"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                st = self.state[p]
                n = float(p.grad.norm())
                if not st:
                    st["m"], st["norm"] = torch.zeros_like(p), n
                st["norm"] = math.sqrt(b2 * st["norm"] ** 2 + (1 - b2) * n * n)
                st["m"].mul_(b1).add_(p.grad, alpha=1 - b1)
                denom = st["norm"] / math.sqrt(1 - b2 ** t) + eps
                p.mul_(1 - lr * wd).add_(st["m"], alpha=-lr / ((1 - b1 ** t) * denom))


def foreach_only(opt):
    opt.use_torch_kernel = False
    return opt


def optimizers():
    fused_ok = True
    try:
        torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], fused=True)
    except (RuntimeError, ValueError):
        fused_ok = False
    impls = {
        "torch-adam-foreach": lambda ps: torch.optim.Adam(ps, foreach=True),
        "torch-adamw-foreach": lambda ps: torch.optim.AdamW(ps, foreach=True, weight_decay=0.01),
        "torch-adam-loop": lambda ps: torch.optim.Adam(ps, foreach=False),
        "smp-fused-adam": lambda ps: O.FusedAdam(ps, weight_decay=0.01),
        "smp-fused-adam-foreach": lambda ps: foreach_only(O.FusedAdam(ps, weight_decay=0.01)),
        "smp-fused-lamb": lambda ps: O.FusedLamb(ps),
        "loop-lamb": lambda ps: LoopLamb(ps),
        "smp-fused-novograd": lambda ps: O.FusedNovoGrad(ps, weight_decay=0.01),
        "loop-novograd": lambda ps: LoopNovoGrad(ps),
    }
    if fused_ok:
        impls["torch-adamw-fused"] = lambda ps: torch.optim.AdamW(ps, fused=True, weight_decay=0.01)
    return impls


def sync(device):
    if device.type != "cpu":
        torch.accelerator.synchronize(device)


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def bench_optimizers(args, device):
    shapes = gpt2_shapes(args.layers, args.d_model, args.vocab, args.ctx)
    gen = torch.Generator().manual_seed(0)
    params = []
    for s in shapes:
        p = torch.nn.Parameter((torch.randn(s, generator=gen) * 0.02).to(device))
        p.grad = (torch.randn(s, generator=gen) * 1e-3).to(device)
        params.append(p)
    impls = optimizers()
    if args.impls:
        impls = {k: impls[k] for k in args.impls.split(",")}
    times = {k: [] for k in impls}
    for _ in range(args.rounds):
        for name, make in impls.items():
            opt = make(params)
            opt.step()
            sync(device)
            for _ in range(args.steps):
                t0 = time.perf_counter()
                opt.step()
                sync(device)
                times[name].append((time.perf_counter() - t0) * 1e3)
            del opt
    n = sum(p.numel() for p in params)
    return {"numel": n, "tensors": len(params), "times": times}


def bench_layer_norm(args, device):
    d = args.d_model
    x = torch.randn(args.ln_rows, d, device=device)
    dy = torch.randn_like(x)
    mods = {"nn.LayerNorm": torch.nn.LayerNorm(d).to(device), "smp.nn.FusedLayerNorm": FusedLayerNorm(d).to(device)}
    times = {k: [] for k in mods}
    for _ in range(args.rounds):
        for name, m in mods.items():
            for i in range(args.ln_iters + 2):
                xi = x.detach().requires_grad_()
                sync(device)
                t0 = time.perf_counter()
                m(xi).backward(dy)
                sync(device)
                if i >= 2:
                    times[name].append((time.perf_counter() - t0) * 1e3)
    return times


def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=10, cwd=ROOT).stdout.strip()
    except Exception as e:  # noqa: BLE001
        return f"({e})"


def summary(times, base):
    rows = []
    base_med = statistics.median(times[base]) if base in times else None
    for name, ts in times.items():
        med = statistics.median(ts)
        rows.append((name, med, pct(ts, 0.1), pct(ts, 0.9), base_med / med if base_med else float("nan")))
    return rows


def main():
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    load0 = os.getloadavg()
    opt = bench_optimizers(args, device)
    ln = bench_layer_norm(args, device)
    load1 = os.getloadavg()
    cmd = "bench/pipeline/fused_ops.py " + " ".join(sys.argv[1:])
    orows = summary(opt["times"], "torch-adamw-foreach")
    lrows = summary(ln, "nn.LayerNorm")
    med = {r[0]: r[1] for r in orows}
    lines = [f"# fused optimizers and LayerNorm ({device.type})", "",
             f"- command: `{cmd.strip()}`",
             f"- parameters: GPT-2 small shapes ({args.layers} layers, d_model {args.d_model}, vocab {args.vocab}, "
             f"context {args.ctx}): {opt['numel'] / 1e6:.1f} M float32 values in {opt['tensors']} tensors, "
             f"random, gradients set; {args.rounds} rounds x (fresh optimizer, 1 warm-up step, {args.steps} timed "
             f"steps), implementations interleaved",
             f"- torch {torch.__version__}, {torch.get_num_threads()} torch thread(s); load average (1 min) "
             f"{load0[0]:.2f} before, {load1[0]:.2f} after, on {os.cpu_count()} CPUs",
             "", "## optimizer step (ms)", "",
             "| implementation | median | p10 | p90 | speed vs torch AdamW foreach |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {n} | {m:.1f} | {a:.1f} | {b:.1f} | {s:.2f} |" for n, m, a, b, s in orows]
    lines.append("")
    for name in ("smp-fused-adam", "smp-fused-adam-foreach"):
        if name in med and "torch-adamw-foreach" in med:
            ok = med[name] <= med["torch-adamw-foreach"]
            lines += [f"- {name} (AdamW mode) median {med[name]:.1f} ms against torch AdamW foreach "
                      f"{med['torch-adamw-foreach']:.1f} ms: target (at least as fast) {'met' if ok else 'NOT met'}"]
    lines += ["", f"## LayerNorm forward + backward, ({args.ln_rows}, {args.d_model}) float32 (ms)", "",
              "| module | median | p10 | p90 | speed vs nn.LayerNorm |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {n} | {m:.2f} | {a:.2f} | {b:.2f} | {s:.2f} |" for n, m, a, b, s in lrows]
    lines.append("")
    text = "\n".join(lines)
    print(text, flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(text)
    meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": cmd.strip(),
            "commit": sh("git rev-parse --short HEAD"),
            "machine": {"nproc": sh("nproc"), "cpu": sh("lscpu | sed -n 's/^Model name: *//p'"),
                        "memory": sh("free -g | sed -n 's/^Mem: *\\([0-9]*\\).*/\\1 GiB/p'"),
                        "python": platform.python_version(), "torch": torch.__version__,
                        "torch_threads": torch.get_num_threads(), "device": str(device),
                        "loadavg_before": list(load0), "loadavg_after": list(load1),
                        "other_jobs": sh("ps -eo pcpu=,comm= --sort=-pcpu | head -n 6")},
            "args": vars(args),
            "summary_ms": {n: {"median": round(m, 2), "p10": round(a, 2), "p90": round(b, 2)}
                           for n, m, a, b, _ in orows + lrows}}
    with open(os.path.join(args.out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
