"""What the Python peers of bench/compare share (torch_collective_bench.py,
deepspeed_bench.py, oneccl_bench.py): the command line, the sizes, starting
the ranks, the iteration rule and the JSON row."""

import argparse
import json
import os
import socket
import subprocess
import sys
import time


def parse_size(text):
    s = str(text).strip()
    if s[-1:] in "bB" and len(s) > 1 and s[-2:-1].isalpha():
        s = s[:-1]
    mult = 1
    if s and s[-1] in "kKmMgG":
        mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[s[-1].lower()]
        s = s[:-1]
    return int(float(s) * mult)


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


def parser(doc, impl, ops_default):
    """The command line every peer takes (bench/compare's peer_args)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--impl", default=impl, help="name in the JSON rows")
    p.add_argument("--np", type=int, default=2, help="ranks to launch (launcher mode)")
    p.add_argument("-b", "--minbytes", type=parse_size, default=8)
    p.add_argument("-e", "--maxbytes", type=parse_size, default=256 << 20)
    p.add_argument("-f", "--stepfactor", type=float, default=2.0)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--min-iters", type=int, default=5)
    p.add_argument("--budget", type=float, default=0.0,
                   help="seconds per size; cut warmup/iters to fit (>= --min-iters); 0 = off")
    p.add_argument("--ops", default=ops_default)
    p.add_argument("--no-barrier", action="store_true")
    p.add_argument("--touch", action="store_true",
                   help="before each timed iteration, rewrite the input in place and read the output")
    p.add_argument("--timeout", type=float, default=1800.0, help="launcher: seconds before all ranks are killed")
    return p


def parse_ops(p, text, ops, aliases, refuse=None):
    """The --ops list, aliases resolved; p.error names an unknown op (or
    refuse(op), when given, says why an op is not served)."""
    out = []
    for tok in text.split(","):
        tok = aliases.get(tok.strip(), tok.strip())
        why = refuse(tok) if refuse else None
        if why:
            p.error(why)
        if tok not in ops:
            p.error(f"unknown op {tok!r} (choose from {', '.join(ops)})")
        out.append(tok)
    return out


def check_sizes(p, a):
    if a.stepfactor <= 1.0:
        p.error("-f must be > 1")
    a.iters = max(1, a.iters)
    a.min_iters = max(1, min(a.min_iters, a.iters))
    a.warmup = max(0, a.warmup)
    a.minbytes = max(4, a.minbytes)
    if a.maxbytes < a.minbytes:
        p.error("-e must be >= -b")
    if a.np < 1:
        p.error("--np must be >= 1")


def run_ranks(name, cmds_envs, timeout):
    """Starts one process per (cmd, env), rank 0's stdout forwarded; kills the
    others as soon as one fails (they would wait for it forever) or at the
    timeout. Returns the first failure's exit status (0 if none)."""
    procs = []
    for r, (cmd, env) in enumerate(cmds_envs):
        procs.append(subprocess.Popen(cmd, env=env, stdout=None if r == 0 else subprocess.DEVNULL))
    deadline = time.monotonic() + timeout
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
                    for other in procs:
                        other.kill()
            if time.monotonic() > deadline:
                print(f"{name}: timeout, killing ranks", file=sys.stderr)
                for pr in procs:
                    pr.kill()
                rc = rc or 124
                deadline = float("inf")
            time.sleep(0.05)
    except KeyboardInterrupt:
        for pr in procs:
            pr.kill()
        raise
    return rc if rc >= 0 else 128 - rc


def rank_envs(np_, port, extra=None):
    """The environment of each of np_ local ranks (as torchrun sets it)."""
    out = []
    for r in range(np_):
        env = dict(os.environ)
        env.update(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(np_), LOCAL_WORLD_SIZE=str(np_),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        env.setdefault("OMP_NUM_THREADS", "1")
        env.update(extra or {})
        out.append(env)
    return out


def timed(args, once, max_all):
    """The iteration rule of every peer: warmup (cut by --budget), then timed
    iterations (cut to fit --budget, at least --min-iters); returns (times,
    warmup, iters). once(last) runs one iteration and returns its seconds;
    max_all(v) is the maximum of v over the ranks."""
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
    return [once(last=(i == iters - 1)) for i in range(iters)], warmup, iters


def touch(send, recv):
    """--touch, untimed, before each timed iteration (torch tensors): one store
    into every 64-byte line of the input (the value it holds) and one load from
    every line of the output, as a training step writes what it sends and reads
    what it received; the data then sits where a step leaves it, not where the
    last call did."""
    import torch
    send.view(torch.uint8)[::64].add_(0)
    recv.view(torch.uint8)[::64].sum()


BUS_FACTOR = {"allreduce": lambda n: 2.0 * (n - 1) / n, "allgather": lambda n: (n - 1) / n,
              "reduce_scatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0}


def print_row(impl, op, nbytes, count, med, n, wrong, iters, warmup):
    algbw = nbytes / med / 1e9 if med > 0 else 0.0
    print(json.dumps({
        "impl": impl, "op": op, "bytes": nbytes, "count": count, "dtype": "float32",
        "time_us": round(med * 1e6, 3), "algbw": float(f"{algbw:.6g}"),
        "busbw": float(f"{algbw * BUS_FACTOR[op](n):.6g}"), "wrong": wrong, "iters": iters,
        "warmup": warmup, "np": n}), flush=True)
