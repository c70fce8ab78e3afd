#!/usr/bin/env python3
"""Per-rank parameter, gradient and optimizer bytes of smp's layouts, and their step time beside torch's.

    .venv/bin/python bench/pipeline/sharded_state.py [--layouts dp2,tp2,...] [--peers ddp,tp,...]
                     [--layers 4] [--width 256] [--heads 8] [--vocab 8192] [--seq 128] [--batch 4]
                     [--warmup 2] [--steps 5] [--rounds 2] [--baseline sharded-state]

GPT-2 (transformers' GPT2LMHeadModel from a config: random weights, tied
embeddings, dropout 0) built under ``smp.model_creation(tensor_parallelism=True)``,
wrapped in smp.DistributedModel, AdamW through smp.DistributedOptimizer, one
microbatch, --batch sequences of --seq tokens per rank, 1 torch thread per
rank. Each layout (LAYOUTS) runs in its own ranks (subprocesses on this
machine): --warmup steps, then --steps timed steps (zero_grad, the smp.step,
optimizer.step); --rounds times, each layout followed by its peers. Measured on each rank after the last step's backward, before
its optimizer step:

- params: bytes of the rank's own parameter storage (model.local_parameters();
  an FSDP2 DTensor counts its local shard; FSDP's unsharded copies are freed
  after the forward and the backward, so none is live then);
- grads: bytes of the parameters' ``.grad`` (local shards of DTensors);
- reducer: the data-parallel gradient reducer's flat buckets (grads.py: a
  flat copy of the reduced gradients, and with shard_optimizer_state this
  rank's reduce-scattered slice as well; FSDP's parameters are not in them);
- optimizer: the tensors of the optimizer state the rank holds (AdamW's
  exp_avg, exp_avg_sq, step), and with shard_optimizer_state those of the
  inner optimizer that steps this rank's slices (optimizer_shard.py) plus the
  master slices it steps where they are copies (float32 ones with fp16/bf16;
  in fp32 training they are views of the parameters and hold nothing); the
  outer optimizer then holds none;
- peak RSS (VmHWM) over the timed steps, reset after the warm-up (glibc's
  mmap threshold at 64 KiB, as activation_memory.py).

Peers (PEERS): the same model, in plain torch (a GPT-2 written in this file:
nn.Linear q/k/v/out and MLP fc/proj, LayerNorm, tied embedding, tanh GELU, the
same sizes and parameter count: torch's tensor-parallel styles do not take
transformers' Conv1D), trained with torch's own DDP, ZeroRedundancyOptimizer,
DTensor tensor parallelism (parallelize_module: vocabulary-parallel embedding
and LM head with loss_parallel, column-parallel q/k/v/fc, row-parallel out/proj)
and FSDP2 (fully_shard per block and the root), all over the "shoal" backend.
Tensor-parallel ranks of a peer share their input (torch's TP replicates it),
so a peer tp rank reads tp x --batch sequences: every layout of a world trains
on world x --batch sequences a step, as smp's tp ranks, each reading its own
--batch, do.

Writes bench/out/NAME/results.json (every rank's numbers) and, with
--baseline NAME, bench/results/NAME/{results.md,meta.json,summary.json};
--render-only --baseline NAME rewrites those from bench/out/NAME/results.json.
"""

import argparse
import ctypes
import dataclasses
import datetime
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "python")]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import shoal.modelparallel as smp  # noqa: E402
import shoal.torch  # noqa: E402,F401  (registers the "shoal" backend)
from bench import baseline  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Layout:
    world: int
    tp: int = 1
    sdp: int = 1
    shard_opt: bool = False
    what: str = ""


LAYOUTS = {
    "dp2": Layout(2, what="data parallel (ddp), the unsharded reference"),
    "tp2": Layout(2, tp=2, what="tensor parallel 2"),
    "dp2+shard-opt": Layout(2, shard_opt=True, what="ddp + shard_optimizer_state"),
    "sdp2": Layout(2, sdp=2, what="sharded_data_parallel_degree 2"),
    "sdp2-default": Layout(2, sdp=2, what="sdp 2 with the default persistence threshold (1e6)"),
    "tp2xdp2": Layout(4, tp=2, what="tp 2 x ddp 2"),
    "tp2xdp2+shard-opt": Layout(4, tp=2, shard_opt=True, what="tp 2 x ddp 2 + shard_optimizer_state"),
    "tp2xsdp2": Layout(4, tp=2, sdp=2, what="tp 2 x sdp 2"),
}


@dataclasses.dataclass(frozen=True)
class Peer:
    world: int
    tp: int
    kind: str          # ddp | zero1 | tp | fsdp | tp+fsdp
    like: tuple        # the smp layouts it stands beside
    what: str = ""


PEERS = {
    "ddp": Peer(2, 1, "ddp", ("dp2",), "torch DDP"),
    "zero1": Peer(2, 1, "zero1", ("dp2+shard-opt",), "DDP + ZeroRedundancyOptimizer(AdamW)"),
    "tp": Peer(2, 2, "tp", ("tp2",), "DTensor TP (parallelize_module)"),
    "fsdp": Peer(2, 1, "fsdp", ("sdp2",), "FSDP2 (fully_shard per block + root)"),
    "tp+fsdp": Peer(4, 2, "tp+fsdp", ("tp2xdp2", "tp2xsdp2"), "2-D mesh (dp 2, tp 2): TP + FSDP2 over dp"),
}


def args_():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layouts", default=",".join(LAYOUTS), help=f"comma-separated, of {', '.join(LAYOUTS)}")
    p.add_argument("--peers", default=",".join(PEERS), help=f"comma-separated, of {', '.join(PEERS)} ('' none)")
    for flag, default, what in (("--layers", 4, "transformer blocks"), ("--width", 256, "hidden size"),
                                ("--heads", 8, "attention heads"), ("--vocab", 8192, "vocabulary"),
                                ("--seq", 128, "tokens per sequence"), ("--batch", 4, "sequences per rank"),
                                ("--warmup", 2, "untimed steps"), ("--steps", 5, "timed steps"),
                                ("--rounds", 2, "runs of every layout and peer, interleaved"),
                                ("--sdp-threshold", 4096, "sdp_param_persistence_threshold (elements) of the "
                                 "sdp layouts but sdp2-default")):
        p.add_argument(flag, type=int, default=default, help=f"{what} (default {default})")
    p.add_argument("--baseline", default="", help="also write bench/results/NAME (results.md, meta.json, summary.json)")
    p.add_argument("--render-only", action="store_true",
                   help="rewrite bench/results/NAME from bench/out/NAME/results.json, running nothing")
    p.add_argument("--rank-run", default="", help=argparse.SUPPRESS)
    return p.parse_args()


# ----------------------------------------------------------------- measuring

def _status_kb(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {key} in /proc/self/status")


def _reset_peak():
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def nbytes(tensors):
    """Bytes of the distinct tensors (a DTensor's local shard)."""
    seen, n = set(), 0
    for t in tensors:
        if t is None or id(t) in seen:
            continue
        seen.add(id(t))
        t = _local(t)
        n += t.numel() * t.element_size()
    return n


def state_tensors(opt):
    return [v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]


def smp_memory(model, opt):
    params = list(model.local_parameters())
    shard = getattr(opt, "_smp_shard", None)
    if shard is not None:
        state = state_tensors(shard.inner) if shard.inner is not None else []
        masters = [pc.master for pc in shard.pieces]
    else:
        state, masters = state_tensors(opt), [m for _, m in opt._smp_pairs()]
    reducer = getattr(model._smp.rt, "reducer", None)
    bufs = [t for b in (reducer.buckets if reducer else []) for t in (b.flat, b.shard)]
    # a master that is a view of its parameter's own elements (fp32 training) holds no bytes of its own
    held = {_local(p).untyped_storage().data_ptr() for p in params}
    masters = [m for m in masters if _local(m).untyped_storage().data_ptr() not in held]
    return {"params": nbytes(params), "grads": nbytes(p.grad for p in params),
            "opt_state": nbytes(state), "masters": nbytes(masters), "reducer": nbytes(bufs),
            # parameters stored whole on this rank (neither tensor-parallel nor FSDP-sharded)
            "whole": nbytes(p for p in params if not getattr(p, "_smp_distributed", False)
                            and not getattr(p, "_smp_sdp", False)),
            "tp_split": nbytes(p for p in params if getattr(p, "_smp_distributed", False)),
            "n_params": sum(_local(p).numel() for p in params)}


def peer_memory(model, opt):
    params = list(model.parameters())
    inner = getattr(opt, "optim", opt)      # ZeroRedundancyOptimizer keeps its shard's optimizer in .optim
    return {"params": nbytes(params), "grads": nbytes(p.grad for p in params), "opt_state":
            nbytes(state_tensors(inner)), "masters": 0, "reducer": None,
            "n_params": sum(_local(p).numel() for p in params)}


def timed_steps(a, step, rank_seed, rows, measure):
    g = torch.Generator().manual_seed(rank_seed)
    data = [torch.randint(0, a.vocab, (rows, a.seq), generator=g) for _ in range(a.warmup + a.steps)]
    times, losses, mem = [], [], None
    for i, x in enumerate(data):
        if i == a.warmup:
            dist.barrier()
            _reset_peak()
            start_kb = _status_kb("VmRSS")
        t0 = time.perf_counter()
        losses.append(step(x, measure if i == len(data) - 1 else None))
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
        if i == len(data) - 1:
            mem = measure.result
    return {"step_s": statistics.median(times), "times": times, "losses": losses, "start_mib": start_kb / 1024,
            "peak_mib": _status_kb("VmHWM") / 1024, **mem}


class Measure:
    def __init__(self, fn):
        self.fn, self.result = fn, None

    def __call__(self):
        self.result = self.fn()


# ----------------------------------------------------------------- smp

def hf_config(a):
    import transformers as T
    return T.GPT2Config(n_layer=a.layers, n_embd=a.width, n_head=a.heads, vocab_size=a.vocab, n_positions=a.seq,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, activation_function="gelu_new",
                        use_cache=False, bos_token_id=0, eos_token_id=0)


def smp_rank(a, name):
    import transformers as T
    from transformers.utils import logging
    logging.set_verbosity_error()
    lay = LAYOUTS[name]
    cfg = {"tensor_parallel_degree": lay.tp, "pipeline_parallel_degree": 1, "ddp": True, "microbatches": 1,
           "shard_optimizer_state": lay.shard_opt, "sharded_data_parallel_degree": lay.sdp, "prescaled_batch": False}
    if lay.sdp > 1 and name != "sdp2-default":
        cfg["sdp_param_persistence_threshold"] = a.sdp_threshold
    smp.init(cfg)
    torch.manual_seed(0)
    with smp.model_creation(tensor_parallelism=True):
        net = T.GPT2LMHeadModel(hf_config(a))
    model = smp.DistributedModel(net)
    opt = smp.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-4))

    @smp.step
    def train_step(model, ids):
        out = model(input_ids=ids, labels=ids)
        model.backward(out["loss"])
        return out["loss"]

    def step(x, measure):
        opt.zero_grad()
        loss = float(train_step(model, x).reduce_mean())
        if measure:
            measure()
        opt.step()
        return loss

    out = timed_steps(a, step, smp.rank(), a.batch, Measure(lambda: smp_memory(model, opt)))
    return {**out, "rank": smp.rank(), "module": type(model.module).__name__}


# ----------------------------------------------------------------- the peer: plain-torch GPT-2

class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.fc, self.proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.hd = d // heads

    def forward(self, x):
        b, t, _ = x.shape
        y = self.ln_1(x)
        q, k, v = (m(y).view(b, t, -1, self.hd).transpose(1, 2) for m in (self.q, self.k, self.v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)      # heads local to a tp rank
        x = x + self.o(att.transpose(1, 2).reshape(b, t, -1))
        return x + self.proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(a.vocab, a.width), nn.Embedding(a.seq, a.width)
        self.h = nn.ModuleList(Block(a.width, a.heads) for _ in range(a.layers))
        self.ln_f = nn.LayerNorm(a.width)
        self.lm_head = nn.Linear(a.width, a.vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        for n, p in self.named_parameters():        # GPT-2's initialisation
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)
            elif n.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, ids):
        x = self.wte(ids) + self.wpe(torch.arange(ids.size(1)))
        for blk in self.h:
            x = blk(x)
        return self.lm_head(self.ln_f(x))


def _tensor_parallel(model, mesh):
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    plan = {"wte": RowwiseParallel(input_layouts=Replicate()),
            "lm_head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)}
    for i in range(len(model.h)):
        plan.update({f"h.{i}.{m}": ColwiseParallel() for m in ("q", "k", "v", "fc")})
        plan.update({f"h.{i}.{m}": RowwiseParallel() for m in ("o", "proj")})
    parallelize_module(model, mesh, plan)
    model.lm_head.weight = model.wte.weight      # tied again: both Shard(0) over the vocabulary


def peer_rank(a, name):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.distributed.tensor.parallel import loss_parallel
    from torch.nn.parallel import DistributedDataParallel
    peer = PEERS[name]
    dist.init_process_group(backend="shoal")
    rank, world = dist.get_rank(), dist.get_world_size()
    dp = world // peer.tp
    torch.manual_seed(0)
    model = GPT2(a)
    if peer.kind == "tp+fsdp":
        mesh = init_device_mesh("cpu", (dp, peer.tp), mesh_dim_names=("dp", "tp"))
        tp_mesh, dp_mesh = mesh["tp"], mesh["dp"]
    elif peer.kind == "tp":
        tp_mesh, dp_mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",)), None
    elif peer.kind == "fsdp":
        tp_mesh, dp_mesh = None, init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    else:
        tp_mesh = dp_mesh = None
    if tp_mesh is not None:
        _tensor_parallel(model, tp_mesh)
    if dp_mesh is not None:
        for blk in model.h:
            fully_shard(blk, mesh=dp_mesh)
        fully_shard(model, mesh=dp_mesh)
    if peer.kind in ("ddp", "zero1"):
        model = DistributedDataParallel(model)
    if peer.kind == "zero1":
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-4)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def loss_of(x):
        logits = model(x)[:, :-1]
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1))

    def step(x, measure):
        opt.zero_grad()
        if tp_mesh is not None:
            with loss_parallel():
                loss = loss_of(x)
                loss.backward()
        else:
            loss = loss_of(x)
            loss.backward()
        if measure:
            measure()
        opt.step()
        return float(_local(loss).detach())

    dp_rank = rank // peer.tp        # tp ranks of one dp group read the same rows (torch's TP replicates input)
    out = timed_steps(a, step, 1000 + dp_rank, a.batch * peer.tp, Measure(lambda: peer_memory(model, opt)))
    dist.destroy_process_group()
    return {**out, "rank": rank}


# ----------------------------------------------------------------- launching

def launch(a, kind, name, world):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
                   MALLOC_MMAP_THRESHOLD_="65536", PYTHONPATH=f"{ROOT}:{ROOT / 'python'}")
        procs.append(subprocess.Popen([sys.executable, "-m", "bench.pipeline.sharded_state", *sys.argv[1:],
                                       "--rank-run", f"{kind}:{name}"], env=env, cwd=ROOT,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    t0 = time.perf_counter()
    out = [p.communicate()[0] for p in procs]
    wall = time.perf_counter() - t0
    bad = [r for r, p in enumerate(procs) if p.returncode]
    if bad:
        tail = "\n".join(f"--- rank {r}:\n" + "\n".join(out[r].splitlines()[-25:]) for r in bad)
        print(f"sharded_state: {kind} {name} FAILED on ranks {bad}:\n{tail}", flush=True)
        return {"error": tail[-3000:], "wall_s": wall}
    ranks = [next(json.loads(line[7:]) for line in o.splitlines() if line.startswith("RESULT ")) for o in out]
    return {"ranks": ranks, "wall_s": wall}


def rank_main(a):
    torch.set_num_threads(1)
    kind, name = a.rank_run.split(":", 1)
    res = smp_rank(a, name) if kind == "smp" else peer_rank(a, name)
    print("RESULT " + json.dumps(res), flush=True)


def loadavg():
    return [round(float(x), 2) for x in Path("/proc/loadavg").read_text().split()[:3]]


def main():
    a = args_()
    if a.rank_run:
        rank_main(a)
        return
    layouts = [x for x in a.layouts.split(",") if x]
    peers = [x for x in a.peers.split(",") if x]
    for x in layouts:
        if x not in LAYOUTS:
            raise SystemExit(f"sharded_state: unknown layout {x!r} (have {', '.join(LAYOUTS)})")
    for x in peers:
        if x not in PEERS:
            raise SystemExit(f"sharded_state: unknown peer {x!r} (have {', '.join(PEERS)})")
    _, out_dir = baseline.folders(a.baseline or "sharded-state")
    out_dir.mkdir(parents=True, exist_ok=True)
    if a.render_only:
        write_baseline(a, json.loads((out_dir / "results.json").read_text()))
        return
    order = []      # each smp layout, then the peers that stand beside it: a busy machine weighs on both alike
    for name in layouts:
        order.append(("smp", name))
        order += [("peer", pn) for pn in peers if name in PEERS[pn].like and ("peer", pn) not in order]
    order += [("peer", pn) for pn in peers if ("peer", pn) not in order]
    res = {"args": {k: v for k, v in vars(a).items() if k not in ("rank_run", "render_only")},
           "command": ".venv/bin/python bench/pipeline/sharded_state.py " + " ".join(sys.argv[1:]),
           "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                    cwd=ROOT).stdout.strip(),
           "load_before": loadavg(),
           "smp": {}, "peer": {}, "load": {}}
    for rnd in range(a.rounds):
        for kind, name in order:
            r = launch(a, kind, name, (LAYOUTS[name] if kind == "smp" else PEERS[name]).world)
            res["load"][f"{kind}:{name}:{rnd}"] = loadavg()
            keep = res[kind].setdefault(name, {"rounds": []})
            if "error" in r:
                keep["error"] = r["error"]
                continue
            keep.setdefault("ranks", r["ranks"])        # the bytes: the first round's (every round's are alike)
            keep["rounds"].append(r["ranks"])
            print_one(kind, name, r)
    res["load_after"] = loadavg()
    (out_dir / "results.json").write_text(json.dumps(res, indent=1) + "\n")
    print(f"sharded_state: wrote {out_dir / 'results.json'}")
    if a.baseline:
        write_baseline(a, res)


def print_one(kind, name, r):
    if "error" in r:
        return
    for x in r["ranks"]:
        print(f"  {kind:<5} {name:<18} rank {x['rank']}: params {x['params']:>10,} grads {x['grads']:>10,} "
              f"opt {x['opt_state'] + x['masters']:>10,} reducer {x['reducer'] or 0:>10,} "
              f"peak {x['peak_mib']:7.1f} MiB  step {x['step_s'] * 1e3:7.0f} ms", flush=True)


# ----------------------------------------------------------------- the baseline

def _rank0(r):
    return r["ranks"][0] if "ranks" in r and "error" not in r else None


def summary_rows(res):
    """One row per (implementation, layout): rank 0's bytes, the largest peak RSS, the step time (the
    slowest rank's median; p10/p90 over that rank's timed steps)."""
    rows = []
    for kind in ("smp", "peer"):
        for name, r in res[kind].items():
            if "ranks" not in r or "error" in r:
                rows.append([kind, name, None, None, None, None, None, None, None, None, None, r["error"][-200:]])
                continue
            x = r["ranks"][0]
            times = [t * 1e3 for rnd in r["rounds"] for t in max(rnd, key=lambda y: y["step_s"])["times"]]
            med, p10, p90 = baseline.spread([t * 1e3 for t in times], 0)
            rows.append([kind, name, len(r["ranks"]), x["params"], x["grads"], x["opt_state"], x["masters"],
                         x["reducer"], round(max(y["peak_mib"] for y in r["ranks"]), 1), med, p10, p90])
    return rows


COLUMNS = ["impl", "layout", "world", "params_B", "grads_B", "opt_state_B", "masters_B", "reducer_B",
           "peak_rss_mib", "time_us_median", "time_us_p10", "time_us_p90"]


def _machine():
    def sh(cmd):
        try:
            return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=10).stdout.strip()
        except Exception:
            return ""
    return {"cpu": sh("lscpu | grep 'Model name' | sed 's/.*: *//'"), "nproc": os.cpu_count(),
            "lscpu": sh("lscpu | head -8"), "platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "transformers": sh(f"{sys.executable} -c 'import transformers as t; "
                                                           f"print(t.__version__)'")}


def write_baseline(a, res):
    folder, _ = baseline.folders(a.baseline)
    folder.mkdir(parents=True, exist_ok=True)
    commit = res.get("commit") or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                                 text=True, cwd=ROOT).stdout.strip()
    command = res.get("command") or (".venv/bin/python bench/pipeline/sharded_state.py " +
                                     " ".join(x for x in sys.argv[1:] if x != "--render-only"))
    a = argparse.Namespace(**{**vars(a), **res["args"]})      # the run's own sizes
    machine = _machine()
    rows = summary_rows(res)
    baseline.write_summary(folder / "summary.json", COLUMNS, rows,
                           note="rank 0's bytes after the last step's backward; peak RSS: the largest rank's; "
                                "time: median (p10, p90) over the timed steps of each round's slowest rank, us")
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S+0000"),
            "command": command, "commit": commit, "machine": machine, "args": res["args"],
            "loadavg_before": res["load_before"], "loadavg_after": res["load_after"], "loadavg": res["load"],
            "layouts": {k: dataclasses.asdict(LAYOUTS[k]) for k in res["smp"]},
            "peers": {k: dataclasses.asdict(PEERS[k]) for k in res["peer"]},
            "smp_module": {k: _rank0(r)["module"] for k, r in res["smp"].items() if _rank0(r)}}
    (folder / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    (folder / "results.md").write_text(render(a, res, command, commit, machine))
    print(f"sharded_state: wrote {folder}")


def _mb(n):
    return "-" if n is None else f"{n / 2**20:.2f}"


def render(a, res, command, commit, machine):
    ref = _rank0(res["smp"].get("dp2", {}))
    L = [f"# Sharded state: per-rank bytes and step time of smp's layouts, beside torch's\n",
         f"- command: `{command}` (commit {commit})",
         f"- model: GPT-2, {a.layers} layers, width {a.width}, {a.heads} heads, vocabulary {a.vocab}, "
         f"sequence {a.seq}, tied embeddings, dropout 0, fp32, AdamW; {a.batch} sequences per rank a step; "
         f"{a.warmup} warm-up + {a.steps} timed steps; 1 torch thread per rank",
         f"- machine: {machine['cpu']}, {machine['nproc']} CPUs; torch {machine['torch']}, transformers "
         f"{machine['transformers']}; world 4 is 4 processes on {machine['nproc']} cores",
         f"- load average (1, 5, 15 min): {res['load_before']} before, {res['load_after']} after\n",
         "## Per-rank bytes (rank 0, MiB), and the fraction of the dp2 reference\n",
         "| layout | world | params | grads | optimizer | (of it masters) | reducer buffers | peak RSS | "
         "params / dp2 | grads / dp2 | optimizer / dp2 |",
         "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for kind in ("smp", "peer"):
        for name, r in res[kind].items():
            x = _rank0(r)
            label = name if kind == "smp" else f"torch {name}"
            if x is None:
                L.append(f"| {label} | FAILED (see the notes) |||||||||| ")
                continue
            opt = x["opt_state"] + x["masters"]
            peak = max(y["peak_mib"] for y in r["ranks"])
            fr = ["-"] * 3
            if ref:
                fr = [f"{x['params'] / ref['params']:.3f}", f"{x['grads'] / max(1, ref['grads']):.3f}",
                      f"{opt / max(1, ref['opt_state'] + ref['masters']):.3f}"]
            L.append(f"| {label} | {len(r['ranks'])} | {_mb(x['params'])} | {_mb(x['grads'])} | {_mb(opt)} | "
                     f"{_mb(x['masters'])} | {_mb(x['reducer'])} | {peak:.0f} | {' | '.join(fr)} |")
    L += ["", f"## Step time (ms; median, p10, p90 over the timed steps of each round's slowest rank, {a.rounds} "
          f"rounds)\n",
          "| layout | smp median | p10 | p90 | torch peer | peer median | p10 | p90 | smp / peer |",
          "|---|---:|---:|---:|---|---:|---:|---:|---:|"]
    rows = {(r[0], r[1]): r for r in summary_rows(res)}
    for name in res["smp"]:
        s = rows[("smp", name)]
        peers = [(pn, rows[("peer", pn)]) for pn, p in PEERS.items() if name in p.like and ("peer", pn) in rows]
        for pn, p in peers or [("-", None)]:
            sm = "FAILED | - | -" if s[9] is None else f"{s[9] / 1e3:.0f} | {s[10] / 1e3:.0f} | {s[11] / 1e3:.0f}"
            if p is None:
                L.append(f"| {name} | {sm} | - | - | - | - | - |")
                continue
            pm = "FAILED | - | -" if p[9] is None else f"{p[9] / 1e3:.0f} | {p[10] / 1e3:.0f} | {p[11] / 1e3:.0f}"
            ratio = "-" if s[9] is None or p[9] is None else f"{s[9] / p[9]:.2f}"
            L.append(f"| {name} | {sm} | {pn}: {PEERS[pn].what} | {pm} | {ratio} |")
    return "\n".join(L) + "\n"


if __name__ == "__main__":
    main()
