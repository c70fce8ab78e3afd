"""Side-by-side collective benchmark: shoal vs Gloo (torch.distributed) vs Open MPI.

    python3 -m bench.compare [options]        (from the repository root; --help)

Runs, one after the other on this machine, for each implementation in --impls:

  shoal    build/bin/shoal-perf --op OP --np N ... --barrier --check --format json
           (skipped with a warning if the binary does not exist)
  gloo     bench/compare/peers/torch_collective_bench.py --backend gloo (N ranks)
  shoal-torch  the same script with --backend shoal: shoal through torch.distributed
           (the path of a training script: tensors, process group, work.wait)
  mpi-tcp  mpirun --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo
           build/bench/mpi_bench   (like-for-like TCP over loopback)
  mpi-sm   mpirun with Open MPI's defaults (shared memory, vader) for reference

With --netbed HxL the same run happens across H "hosts" (network namespaces joined by
shaped veth links, tools/netbed) with L ranks each: shoal, shoal-flat-ring (shoal-perf
with SHOAL_ALGO=allreduce=ring, allreduce only), gloo (GLOO_SOCKET_IFNAME=nb0) and
mpi-tcp (mpirun across the namespaces, TCP btl on the bed's subnet); default ops
allreduce,allgather,reduce_scatter; oneccl (libfabric's tcp and oneCCL's key-value
store on nb0) when asked for. Needs root; see docs/netbed.md.

With --load SPEC every implementation's run has the same interference beside
it (bench/probes/load.py: bursty compute, the shape of a backward pass, or busy
loops), started before and stopped after each run. With --starts N each
table row is the median start and `worst/median` says how far the slowest
start was from it.

It writes into --out (a name: bench/out/NAME, ignored by git; default its
date-time), or with --baseline NAME into bench/results/NAME, the curated
baseline of one configuration that the docs cite (a new run replaces it; git
keeps the history):
  results.md     machine description, command line, one table per op
  summary.json   per implementation, op and size: time_us and busbw over the
                 starts (median, p10, p90), starts, wrong elements
  meta.json      what ran, skipped implementations, the machine, the bed
and beside them (for a baseline: in bench/out/NAME, never in the tree):
  results.jsonl  every raw row (one JSON object per start, op and size)
  runs.json      every command run: exit code, time, load, cores' distance
  plot.png       busbw and time vs size, log-log, one subplot per op
  logs/          stdout/stderr of every command

report.py writes the reports, machine.py describes the machine. See
bench/compare/peers/README.md.
"""

import argparse
import datetime
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.compare.machine import loadavg, machine_info
from bench.compare.report import (FLAT_RING, info, median_of_starts, warn, write_jsonl, write_markdown,
                                  write_plot, write_summary)
from bench.compare.runner import OP_ALIASES, Runner, tag_rows
from bench.probes import core_probe, load
from tools.netbed import NetBed, NetBedError, NetBedUnavailable
from tools.netbed.bed import CLI as NETBED_CLI
from tools.netbed.link_probe import tcp_probe

ROOT = Path(__file__).resolve().parents[2]
MODULE = "bench.compare"  # python3 -m bench.compare: __main__.py
VENV_PY = ROOT / ".venv" / "bin" / "python"

ALL_OPS = ("allreduce", "allgather", "broadcast", "reduce_scatter")
ALL_IMPLS = ("shoal", "shoal-tcp", "shoal-flat-ring", "shoal-torch", "gloo", "mpi-tcp", "mpi-sm", "oneccl",
             "oneccl-shm", "deepspeed-shm")
DEFAULT_OPS = ("allreduce", "allgather", "broadcast")
# shoal picks shared memory on one host; shoal-tcp (SHOAL_SHM=0) is the
# like-for-like TCP comparison with Gloo and mpi-tcp.
DEFAULT_IMPLS = ("shoal", "shoal-tcp", "gloo", "mpi-tcp", "mpi-sm")
NETBED_OPS = ("allreduce", "allgather", "reduce_scatter")
NETBED_IMPLS = ("shoal", "shoal-flat-ring", "gloo", "mpi-tcp")
SHOAL_PERF = ROOT / "build" / "bin" / "shoal-perf"
MPI_SRC = ROOT / "bench" / "compare" / "peers" / "mpi_bench.c"
MPI_BIN = ROOT / "build" / "bench" / "mpi_bench"
# The peers' scripts run as modules (python -m) with the repository root as working directory.
TORCH_BENCH = "bench.compare.peers.torch_collective_bench"
# oneCCL and DeepSpeed run from their own venv (bench/compare/peers/setup.sh makes it).
PEERS_VENV = ROOT / "build" / "peers-venv"
PEER_SCRIPTS = {"oneccl": ("bench.compare.peers.oneccl_bench", ["--fabric", "tcp"]),
                "oneccl-shm": ("bench.compare.peers.oneccl_bench", ["--fabric", "shm"]),
                "deepspeed-shm": ("bench.compare.peers.deepspeed_bench", [])}


def parse_size(text):
    s = str(text).strip()
    if len(s) > 1 and s[-1] in "bB" and s[-2].isalpha():
        s = s[:-1]
    mult = 1
    if s and s[-1] in "kKmMgG":
        mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[s[-1].lower()]
        s = s[:-1]
    try:
        return int(float(s) * mult)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad size {text!r}") from None


def csv_list(allowed, aliases=None):
    def parse(text):
        out = []
        for tok in text.split(","):
            tok = tok.strip()
            tok = (aliases or {}).get(tok, tok)
            if not tok:
                continue
            if tok not in allowed:
                raise argparse.ArgumentTypeError(
                    f"unknown {tok!r}; choose from {','.join(allowed)}")
            if tok not in out:
                out.append(tok)
        return out
    return parse


def torch_version():
    """torch's version where this interpreter imports it, else None (gloo and shoal-torch are
    then skipped)."""
    try:
        import torch
    except ImportError:
        return None
    return torch.__version__


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python3 -m " + MODULE, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--np", type=int, default=None, help="ranks (default 2; with --netbed H x L)")
    p.add_argument("-b", "--minbytes", type=parse_size, default=8, help="default 8")
    p.add_argument("-e", "--maxbytes", type=parse_size, default=256 << 20, help="default 256M")
    p.add_argument("-f", "--stepfactor", type=int, default=2, help="default 2")
    p.add_argument("--iters", type=int, default=20,
                   help="timed iterations per size (default 20; fewer for big sizes, see --budget)")
    p.add_argument("--warmup", type=int, default=5, help="default 5")
    p.add_argument("--min-iters", type=int, default=5,
                   help="never fewer timed iterations than this (default 5)")
    p.add_argument("--budget", type=float, default=2.0,
                   help="approx. seconds per size; iterations are cut to fit (default 2; 0 = off)")
    p.add_argument("--ops", type=csv_list(ALL_OPS, OP_ALIASES), default=None,
                   help="default allreduce,allgather,broadcast (with --netbed: "
                        "allreduce,allgather,reduce_scatter)")
    p.add_argument("--impls", type=csv_list(ALL_IMPLS), default=None,
                   help="default shoal,gloo,mpi-tcp,mpi-sm (with --netbed: "
                        "shoal,shoal-flat-ring,gloo,mpi-tcp)")
    p.add_argument("--netbed", default=None, metavar="HxL",
                   help="run across H hosts (network namespaces, tools/netbed) with L ranks "
                        "each, e.g. 2x2 (needs root)")
    p.add_argument("--netbed-rate", default="10gbit",
                   help="--netbed: line rate of every link, each way (default 10gbit)")
    p.add_argument("--netbed-delay-us", type=float, default=50.0,
                   help="--netbed: one-way delay (default 50; not applied where the kernel "
                        "has no netem, which results.md then says)")
    p.add_argument("--netbed-mtu", type=int, default=65535,
                   help="--netbed: MTU of the bed's links (default 65535)")
    p.add_argument("--out", default=None,
                   help="a name (-> bench/out/NAME, ignored by git) or a path (default: date-time)")
    p.add_argument("--baseline", default=None, metavar="NAME",
                   help="write the curated baseline bench/results/NAME (named by what it "
                        "measures, e.g. one-host-2ranks) instead of --out")
    p.add_argument("--shoal-perf", default=str(SHOAL_PERF), help="path of shoal-perf")
    p.add_argument("--timeout", type=float, default=900.0,
                   help="seconds before one implementation's run is killed (default 900)")
    p.add_argument("--wait-idle", type=float, default=0.0, metavar="S",
                   help="before each run, wait up to S seconds for the CPUs to be idle "
                        "(< 15%% busy over 2 s); default 0 = don't wait")
    p.add_argument("--starts", type=int, default=1, metavar="N",
                   help="run every implementation N times, interleaved (each once, then "
                        "each again); results.md shows every size's median start, summary.json "
                        "the median, p10 and p90 over the starts; every row is in results.jsonl "
                        "(default 1)")
    p.add_argument("--load", default=None, metavar="SPEC",
                   help="interference beside every implementation's run, started before "
                        "and stopped after each (bench/probes/load.py): N = N cores' worth of "
                        "bursty compute, busy:N = N busy loops, burst:N[:DUTY]")
    p.add_argument("--touch", action="store_true",
                   help="before each timed iteration (untimed), every rank of every "
                        "implementation rewrites its input in place and reads its output, "
                        "as a training step writes what it sends and reads what it received")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--no-reexec", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--render-only", action="store_true",
                   help="measure nothing: rewrite results.md, summary.json and plot.png of --out "
                        "(or --baseline) from its meta.json and the raw results.jsonl and runs.json")
    a = p.parse_args(argv)
    if a.starts < 1:
        p.error("--starts must be at least 1")
    if a.load:
        try:
            load.parse(a.load)
        except ValueError as e:
            p.error(str(e))
    a.hosts = a.per_host = None
    if a.netbed:
        try:
            a.hosts, a.per_host = (int(x) for x in a.netbed.lower().split("x"))
        except ValueError:
            p.error(f"--netbed takes HxL, e.g. 2x2 (got {a.netbed!r})")
        if a.hosts < 1 or a.per_host < 1:
            p.error("--netbed: H and L must be >= 1")
        if a.np is not None and a.np != a.hosts * a.per_host:
            p.error(f"--np {a.np} contradicts --netbed {a.netbed} ({a.hosts * a.per_host} ranks)")
        a.np = a.hosts * a.per_host
        if a.impls and "mpi-sm" in a.impls:
            p.error("--netbed: mpi-sm (shared memory) cannot span hosts; use mpi-tcp")
    a.np = 2 if a.np is None else a.np
    if a.ops is None:
        a.ops = list(NETBED_OPS if a.netbed else DEFAULT_OPS)
    if a.impls is None:
        a.impls = list(NETBED_IMPLS if a.netbed else DEFAULT_IMPLS)
    if a.np < 1:
        p.error("--np must be >= 1")
    if a.stepfactor < 2:
        p.error("-f must be >= 2")
    if a.maxbytes < a.minbytes:
        p.error("-e must be >= -b")
    a.iters = max(1, a.iters)
    a.min_iters = max(1, min(a.min_iters, a.iters))
    a.warmup = max(0, a.warmup)
    if a.baseline is not None:
        if a.out is not None:
            p.error("--baseline and --out exclude each other")
        if len(Path(a.baseline).parts) != 1:
            p.error("--baseline takes a name (bench/results/NAME), not a path")
        a.out = ROOT / "bench" / "results" / a.baseline
        a.raw = ROOT / "bench" / "out" / a.baseline  # raw rows, runs, plot, logs: never in the tree
    else:
        out = Path(a.out or datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
        if len(out.parts) == 1 and not out.is_absolute():
            out = ROOT / "bench" / "out" / out
        a.out = a.raw = out.resolve()
    a.logs = a.raw / "logs"
    return a


def sizes(lo, hi, factor):
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= factor
    return out


def busfactor(op, n):
    return ({"allreduce": 2.0 * (n - 1) / n, "allgather": (n - 1) / n,
             "reduce_scatter": (n - 1) / n}.get(op, 1.0) if n else 1.0)


def schedule(args, size):
    """Iterations for a tool without its own time budget (shoal-perf).

    Conservative guess of one iteration's time (TCP-like ~0.5 GB/s plus 50 us)."""
    if args.budget <= 0:
        return args.iters, args.warmup
    t = 50e-6 + size / 0.5e9
    iters = max(args.min_iters, min(args.iters, int(args.budget / t)))
    warmup = min(args.warmup, max(1, int(0.25 * args.budget / t)))
    return iters, warmup


def on_bed(args, cmd, every_rank=True):
    """cmd as it runs on the net bed (--netbed): one process per rank through
    `netbed job` (RANK, MASTER_ADDR, ... set; rank 0's stdout passed through), or one
    process on host 0 through `netbed exec` (mpirun). Unchanged without --netbed."""
    if not args.netbed:
        return cmd
    base = list(NETBED_CLI)  # from ROOT, the runner's working directory
    if every_rank:
        return base + ["job", "--prefix", args.bed.prefix, "--per-host", str(args.per_host),
                       "--rank0-stdout", "--timeout", str(args.timeout), "--"] + cmd
    return base + ["exec", "--prefix", args.bed.prefix, "--host", "0",
                   "--timeout", str(args.timeout), "--"] + cmd


def run_shoal(args, runner, meta, impl="shoal"):
    exe = Path(args.shoal_perf)
    if not (exe.is_file() and os.access(exe, os.X_OK)):
        msg = f"{exe} not found (build shoal-perf first); {impl} skipped"
        warn(msg)
        meta["skipped"][impl] = msg
        return []
    env = None
    ops = args.ops
    if impl == "shoal-tcp":
        env = dict(os.environ, SHOAL_SHM="0")
    if impl == "shoal-flat-ring":
        # shoal's own flat ring allreduce, for reference beside whatever it picks itself.
        env = dict(os.environ, SHOAL_ALGO=FLAT_RING)
        ops = [op for op in args.ops if op == "allreduce"]
        if not ops:
            meta["skipped"][impl] = "only measured for allreduce"
            return []
    rows = []
    for op in ops:
        # Group consecutive sizes sharing the same (iters, warmup) into one call.
        segs = []
        for s in sizes(args.minbytes, args.maxbytes, args.stepfactor):
            sched = schedule(args, s)
            if segs and segs[-1][2] == sched:
                segs[-1][1] = s
            else:
                segs.append([s, s, sched])
        for k, (lo, hi, (iters, warmup)) in enumerate(segs):
            # On the bed every rank joins through RANK/WORLD_SIZE/MASTER_* (no --np).
            np_opt = [] if args.netbed else ["--np", str(args.np)]
            cmd = [str(exe), "--op", op, *np_opt, "-b", str(lo), "-e", str(hi),
                   "-f", str(args.stepfactor), "--dtype", "float32", "--iters", str(iters),
                   "--warmup", str(warmup), "--barrier", "--check", "--format", "json"]
            if args.touch:
                cmd.append("--touch")
            got = runner.run(impl, f"{impl}-{op}-{lo}-{hi}", on_bed(args, cmd), env=env,
                             wait=k == 0)
            rows += [r for r in got if r["op"] == op]
            if runner.runs[-1]["error"] and not got:
                warn("shoal-perf failed without output; not trying its other sizes of " + op)
                break
    return tag_rows(rows, impl)


def peer_args(args, op):
    return ["-b", str(args.minbytes), "-e", str(args.maxbytes), "-f", str(args.stepfactor),
            "--iters", str(args.iters), "--warmup", str(args.warmup),
            "--min-iters", str(args.min_iters), "--budget", str(args.budget),
            "--ops", op] + (["--touch"] if args.touch else [])


def run_torch(args, runner, meta, impl):
    """gloo, or shoal-torch: torch_collective_bench.py with that backend."""
    if args.torch_version is None:
        msg = f"torch is not importable (no .venv?); {impl} skipped"
        warn(msg)
        meta["skipped"][impl] = msg
        return []
    env = dict(os.environ)
    backend = ["--backend", "gloo"]
    if impl == "shoal-torch":
        backend = ["--backend", "shoal", "--import", "shoal.torch"]
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "python"), env.get("PYTHONPATH")]))
    if args.netbed:
        env["GLOO_SOCKET_IFNAME"] = args.bed_info["iface"]  # the bed's link, in every host
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONWARNINGS"] = "ignore::FutureWarning"
    rows = []
    for op in args.ops:  # one run per op: shorter runs, each can wait for an idle machine
        cmd = [str(VENV_PY) if VENV_PY.exists() else sys.executable, "-m", TORCH_BENCH, *backend, "--impl", impl,
               "--np", str(args.np), "--timeout", str(args.timeout)] + peer_args(args, op)
        rows += runner.run(impl, f"{impl}-{op}", on_bed(args, cmd), env=env)
    return tag_rows(rows, impl)


def run_venv_peer(args, runner, meta, impl):
    """oneCCL (through its C++ API, over TCP or libfabric's shared memory) and
    DeepSpeed's shared-memory allreduce (allreduce only), from PEERS_VENV."""
    py = PEERS_VENV / "bin" / "python"
    if not py.exists():
        msg = f"{PEERS_VENV} does not exist: run bench/compare/peers/setup.sh"
        warn(f"{impl} skipped: {msg}")
        meta["skipped"][impl] = msg
        return []
    if args.netbed and impl != "oneccl":
        meta["skipped"][impl] = "shared memory: ranks of one host only, and the net bed's hosts are apart"
        return []
    module, extra = PEER_SCRIPTS[impl]
    script = module.rpartition(".")[2]
    ops = [op for op in args.ops if impl != "deepspeed-shm" or op == "allreduce"]
    if len(ops) < len(args.ops):
        meta["skipped"].setdefault(impl, "allreduce only (DeepSpeed's shared-memory path has no other op)")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    base = [str(py), "-m", module]
    ccl = ["--ccl-root", str(PEERS_VENV)] if impl.startswith("oneccl") else []
    if args.netbed:
        # One process per rank on the bed's hosts (netbed job sets RANK, LOCAL_RANK,
        # MASTER_ADDR, ...); libfabric's tcp provider and oneCCL's key-value store on
        # the bed's link. The program is built once here, not by every rank at once.
        env.update(FI_TCP_IFACE=args.bed_info["iface"], CCL_KVS_IFACE=args.bed_info["iface"])
        built = subprocess.run(base + ccl + ["--build-only"], env=env, capture_output=True, text=True,
                               cwd=ROOT)
        if built.returncode != 0:
            msg = f"{script} --build-only failed: {built.stderr.strip()[-800:]}"
            warn(f"{impl} skipped: {msg}")
            meta["skipped"][impl] = msg
            return []
    rows = []
    for op in ops:
        cmd = base + ["--impl", impl, "--np", str(args.np), "--timeout", str(args.timeout)] + extra + \
            peer_args(args, op) + ccl
        rows += runner.run(impl, f"{impl}-{op}", on_bed(args, cmd), env=env)
    return tag_rows(rows, impl)


def build_mpi(meta):
    mpicc = shutil.which("mpicc")
    if MPI_BIN.exists() and MPI_BIN.stat().st_mtime >= MPI_SRC.stat().st_mtime:
        return True
    if not mpicc:
        meta["mpi_build"] = "mpicc not found"
        return False
    MPI_BIN.parent.mkdir(parents=True, exist_ok=True)
    tmp = MPI_BIN.with_name(f".mpi_bench.{os.getpid()}.tmp")
    cmd = [mpicc, "-O2", "-o", str(tmp), str(MPI_SRC), "-lm"]
    info("building " + shlex.join(cmd))
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        meta["mpi_build"] = "mpicc failed: " + r.stderr.strip()[-800:]
        tmp.unlink(missing_ok=True)
        return False
    os.replace(tmp, MPI_BIN)
    return True


def run_mpi(args, runner, meta, impl):
    if not shutil.which("mpirun"):
        msg = f"mpirun not found; {impl} skipped"
        warn(msg)
        meta["skipped"][impl] = msg
        return []
    if not build_mpi(meta):
        msg = f"cannot build {MPI_BIN}: {meta.get('mpi_build')}; {impl} skipped"
        warn(msg)
        meta["skipped"][impl] = msg
        return []
    env = dict(os.environ)
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    if args.netbed:
        # mpirun on host 0; its daemons reach the other hosts through the bed's rsh agent;
        # TCP only (ob1 + tcp,self btl), on the bed's subnet only.
        cmd = args.bed.mpirun_argv(args.per_host)
        rows = []
        for op in args.ops:
            rows += runner.run(impl, f"{impl}-{op}",
                               on_bed(args, cmd + [str(MPI_BIN), "--impl", impl]
                                      + peer_args(args, op), every_rank=False), env=env)
        return tag_rows(rows, impl)
    cmd = ["mpirun", "-np", str(args.np), "--bind-to", "none"]
    if args.np > (os.cpu_count() or 1):
        cmd.append("--oversubscribe")
    if impl == "mpi-tcp":
        cmd += ["--mca", "pml", "ob1", "--mca", "btl", "tcp,self",
                "--mca", "btl_tcp_if_include", "lo"]
    rows = []
    for op in args.ops:
        rows += runner.run(impl, f"{impl}-{op}",
                           cmd + [str(MPI_BIN), "--impl", impl] + peer_args(args, op), env=env)
    return tag_rows(rows, impl)


# --------------------------------------------------------------------------- the net bed's probe

def probe_bed(bed, per_host, seconds=2.0):
    """What plain TCP moves through the bed (tools/netbed/link_probe.py): one stream one way,
    and per_host streams each way in both directions at once (the hierarchical
    allreduce's pattern). GB/s per direction; an error is recorded, not raised."""
    out = {}
    for key, streams, both in (("one_stream", 1, False), ("both_ways", per_host, True)):
        try:
            out[key] = tcp_probe(bed, seconds, streams, both)["GBps"]
        except Exception as e:  # noqa: BLE001 - a failed probe must not lose the run
            out[key] = None
            out[f"{key}_error"] = str(e)[-300:]
            warn(f"--netbed: TCP probe ({key}) failed: {e}")
    info("net bed TCP probe: " + ", ".join(f"{k} {v:.3f} GB/s" for k, v in out.items()
                                           if isinstance(v, float)))
    return out


def read_raw(args):
    """(rows, runs) of a run from its raw folder (for a baseline: bench/out/NAME)."""
    rows = [json.loads(line) for line in (args.raw / "results.jsonl").read_text().splitlines()
            if line.strip()]
    return rows, json.loads((args.raw / "runs.json").read_text())


def write_reports(args, meta, rows):
    """results.md, summary.json and meta.json into args.out; results.jsonl, runs.json and
    plot.png into args.raw (the same folder unless this is a baseline). True if plotted."""
    args.raw.mkdir(parents=True, exist_ok=True)
    write_jsonl(args.raw / "results.jsonl", rows)
    (args.raw / "runs.json").write_text(json.dumps(meta["runs"], indent=1) + "\n")
    best = median_of_starts(rows)
    write_markdown(args.out / "results.md", args, meta, best,
                   raw_dir=os.path.relpath(args.raw, ROOT) if args.raw != args.out else None)
    write_summary(args.out / "summary.json", rows)
    plotted = False if args.no_plot else write_plot(args.raw / "plot.png", args, best)
    meta["plot"] = plotted
    (args.out / "meta.json").write_text(
        json.dumps({k: v for k, v in meta.items() if k != "runs"}, indent=2) + "\n")
    return plotted


def recorded_argv(command):
    """The options of a recorded command line (`python3 -m bench.compare ...`)."""
    words = shlex.split(command)
    at = next((i for i, w in enumerate(words) if w == MODULE or w.endswith("bench/compare")), None)
    if at is None:
        raise ValueError(f"not a bench.compare command: {command!r}")
    return words[at + 1:]


def render_only(args):
    try:
        meta = json.loads((args.out / "meta.json").read_text())
        rows, meta["runs"] = read_raw(args)
        recorded = parse_args(recorded_argv(meta["command"]))
    except (OSError, ValueError) as e:
        warn(f"cannot read {args.out}/meta.json and the raw results.jsonl and runs.json in {args.raw}"
             f" (rerun the command in meta.json to make them): {e}")
        return 2
    # The settings of the original run are those of its recorded command line.
    recorded.out, recorded.raw, recorded.no_plot = args.out, args.raw, args.no_plot
    recorded.bed_info = meta.get("netbed")
    write_reports(recorded, meta, rows)
    info(f"rewrote {args.out / 'results.md'}, summary.json" + ("" if args.no_plot else ", plot.png"))
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    version = torch_version()
    if version is None and VENV_PY.exists() and "--no-reexec" not in argv:
        # the project's virtualenv has torch (gloo, shoal-torch)
        os.execv(str(VENV_PY), [str(VENV_PY), "-m", MODULE, "--no-reexec"] + argv)
    args = parse_args(argv)
    if args.render_only:
        return render_only(args)
    args.torch_version = version
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    meta = {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "command": shlex.join(["python3", "-m", MODULE] + [a for a in argv if a != "--no-reexec"]),
            "machine": machine_info(ROOT, version or "not available"),
            "args": {k: str(v) for k, v in vars(args).items()},
            "skipped": {}, "runs": []}
    info(f"output: {args.out}" + (f" (raw rows, runs, plot and logs: {args.raw})" if args.raw != args.out else ""))
    args.bed = args.bed_info = None
    if args.netbed:
        try:
            args.bed = NetBed(hosts=args.hosts, rate=args.netbed_rate,
                              delay_us=args.netbed_delay_us, mtu=args.netbed_mtu).up()
        except NetBedUnavailable as e:
            warn(f"--netbed: cannot build a net bed here: {e.reason}")
            return 2
        except (NetBedError, ValueError) as e:
            warn(f"--netbed: {e}")
            return 2
        args.bed_info = meta["netbed"] = args.bed.describe()
        meta["netbed"]["per_host"] = args.per_host
        meta["netbed"]["tcp_probe"] = {"before": probe_bed(args.bed, args.per_host)}
        meta["netbed"]["oversubscribed"] = args.bed.oversubscribed(args.per_host)
        info("net bed: " + args.bed.describe_line())
    rtt_bin, why = core_probe.build()
    if why:
        warn(f"the cores' distance is not measured: {why}")
    runner = Runner(args.logs, args.timeout, args.wait_idle,
                    load.Load(args.load) if args.load else None,
                    lambda: core_probe.measure(rtt_bin))
    if args.load:
        meta["load"] = runner.load.describe()
    rows = []
    try:
        for start in range(1, args.starts + 1):
            runner.start = start if args.starts > 1 else 0
            for impl in args.impls:  # strictly one benchmark at a time
                if impl in ("shoal", "shoal-tcp", "shoal-flat-ring"):
                    rows += run_shoal(args, runner, meta, impl)
                elif impl in ("gloo", "shoal-torch"):
                    rows += run_torch(args, runner, meta, impl)
                elif impl in PEER_SCRIPTS:
                    rows += run_venv_peer(args, runner, meta, impl)
                else:
                    rows += run_mpi(args, runner, meta, impl)
                write_jsonl(args.raw / "results.jsonl", rows)  # keep partial results
    except KeyboardInterrupt:
        warn("interrupted; writing what was measured")
    finally:
        if args.bed is not None:
            meta["netbed"]["tcp_probe"]["after"] = probe_bed(args.bed, args.per_host)
            (args.logs / "netbed-qdiscs.txt").write_text(args.bed.qdiscs())
            args.bed.down()
    meta["runs"] = runner.runs
    meta["seconds"] = time.monotonic() - t0
    meta["loadavg_end"] = loadavg()
    plotted = write_reports(args, meta, rows)
    info(f"wrote {args.out / 'results.md'}, summary.json, meta.json; {args.raw / 'results.jsonl'}, runs.json"
         + (", plot.png" if plotted else "") + f" in {meta['seconds']:.0f} s")
    bad = sum(1 for r in rows if r.get("wrong"))
    failed = [r for r in runner.runs if r["error"]]
    if bad:
        warn(f"{bad} rows with wrong results")
    return 1 if (bad or failed or not rows) else 0

