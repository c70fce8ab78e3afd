"""SHOAL_SHM_STREAM auto / 0 / 1 (and Open MPI's shared memory), alternating,
each run labelled by the cores' distance just before and just after it.

  python3 -m bench.probes.slot_stores_ab [--seconds 240] [--far-only] [-b 512K] [-e 32M]
      [--ops allgather,allreduce] [--out FILE.jsonl] [--summary FILE.json]
  python3 -m bench.probes.slot_stores_ab --from FILE.jsonl [--summary FILE.json]
                                            (the table of an earlier run)

A round runs shoal-perf (2 ranks, allgather and allreduce, -f 4, 20
iterations) once per mode and mpi_bench, in an order that rotates from round
to round; bench/probes/core_rtt.c's round trip is taken between runs. A run counts as "close" when the round trips before and
after it are both under 100 ns, "far" when both are over 250 ns (the 2-vCPU
EPYC VM: 49-69 ns, and 300-380 ns in windows where the host puts the vCPUs
apart), else it is left out. With --far-only a round starts only when the
cores are far (it polls once a second). Prints, per class, op and mode, the
median over the runs of each size's time, and the number of runs
(docs/algorithms.md, "Where the cores are"). --out keeps every run (raw, for
bench/out/); --summary writes, per class, op, mode and size, the median, p10
and p90 over the runs (what a baseline under bench/results keeps).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench import baseline
from bench.probes import core_probe

PERF = baseline.ROOT / "build" / "bin" / "shoal-perf"
MPI = baseline.ROOT / "build" / "bench" / "mpi_bench"
MODES = ("auto", "0", "1")
SUMMARY_COLUMNS = ["cores", "op", "mode", "bytes", "runs", "time_us_median", "time_us_p10", "time_us_p90"]
SUMMARY_NOTE = ("per cores' distance (close: round trip < 100 ns before and after the run, far: > 250 ns), "
                "op, mode (SHOAL_SHM_STREAM auto/0/1, or Open MPI) and size: median, p10 and p90 over the "
                "runs of shoal-perf's time_us (20 iterations, 2 ranks)")


def us(t):
    """A median in µs: two decimals below 100 µs, where they still mean something."""
    return f"{t:.2f}" if t < 100 else f"{t:.0f}"


def shoal(args, op, mode):
    env = dict(os.environ, SHOAL_SHM_STREAM=mode)
    out = subprocess.run([str(PERF), "--np", "2", "--op", op, "-b", args.b, "-e", args.e, "-f", "4",
                          "--iters", "20", "--format", "json"], env=env, capture_output=True, text=True,
                         timeout=300).stdout
    return [json.loads(line)["time_us"] for line in out.splitlines() if line.startswith("{")]


def mpi(args, op):
    if not MPI.exists() or not shutil.which("mpirun"):
        return []
    out = subprocess.run(["mpirun", "-np", "2", "--bind-to", "none", "--allow-run-as-root", str(MPI),
                          "-b", args.b, "-e", args.e, "-f", "4", "--iters", "20", "--ops", op],
                         capture_output=True, text=True, timeout=300).stdout
    return [json.loads(line)["time_us"] for line in out.splitlines() if line.startswith("{")]


def label(before, after):
    if before and after and before < 100 and after < 100:
        return "close"
    if before and after and before > 250 and after > 250:
        return "far"
    return None


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=240)
    p.add_argument("--far-only", action="store_true")
    p.add_argument("-b", default="512K")
    p.add_argument("-e", default="32M")
    p.add_argument("--ops", default="allgather,allreduce",
                   help="comma-separated: allgather, allreduce, reduce_scatter, broadcast")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--from", dest="src", type=Path, default=None)
    p.add_argument("--summary", type=Path, default=None, help="summary.json of the runs")
    args = p.parse_args()
    if args.src:
        runs = [json.loads(line) for line in args.src.read_text().splitlines() if line.strip()]
        if args.summary:
            write_summary(args.summary, runs, sizes(args.b, args.e))
        return summary(runs)
    rtt_bin, why = core_probe.build()
    if why:
        sys.exit(f"slot_stores_ab: {why}")
    rtt = lambda: core_probe.measure(rtt_bin)  # noqa: E731
    runs, end, turn = [], time.monotonic() + args.seconds, 0
    while time.monotonic() < end:
        if args.far_only and (rtt() or 0) <= 250:
            time.sleep(1)
            continue
        order = MODES + ("mpi",)
        order = order[turn % len(order):] + order[:turn % len(order)]  # no mode always first
        turn += 1
        for op in args.ops.split(","):
            for mode in order:
                before = rtt()
                t = mpi(args, op) if mode == "mpi" else shoal(args, op, mode)
                runs.append({"op": op, "mode": mode, "times_us": t, "bytes": sizes(args.b, args.e)[:len(t)],
                             "rtt_before": before, "rtt_after": rtt()})
                print(json.dumps(runs[-1]), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("".join(json.dumps(r) + "\n" for r in runs))
    if args.summary:
        write_summary(args.summary, runs, sizes(args.b, args.e))
    summary(runs)


def sizes(lo, hi):
    """shoal-perf's sizes from -b lo to -e hi, x4 (512K, 32M: bytes)."""
    def parse(text):
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1].upper(), 1)
        return int(float(text[:-1] if mult > 1 else text) * mult)
    out, s = [], parse(lo)
    while s <= parse(hi):
        out.append(s)
        s *= 4
    return out


def write_summary(path, runs, default_sizes):
    """summary.json of the runs that fall in a class; a run without its sizes (older files) has
    the sizes of -b/-e."""
    cells = {}
    for r in runs:
        c = label(r["rtt_before"], r["rtt_after"])
        if not (c and r["times_us"]):
            continue
        for size, t in zip(r.get("bytes") or default_sizes, r["times_us"]):
            cells.setdefault((c, r["op"], r["mode"], size), []).append(t)
    rows = [[c, op, mode, size, len(v)] + baseline.spread(v, 2) for (c, op, mode, size), v in sorted(cells.items())]
    path.parent.mkdir(parents=True, exist_ok=True)
    baseline.write_summary(path, SUMMARY_COLUMNS, rows, SUMMARY_NOTE)


def summary(runs):
    cells = {}
    for r in runs:
        c = label(r["rtt_before"], r["rtt_after"])
        if c and r["times_us"]:
            cells.setdefault((c, r["op"], r["mode"]), []).append(r["times_us"])
    print("\n| cores, op | " + " | ".join(f"`{m}`" for m in MODES) + " | Open MPI |")
    print("|---|" + "---|" * (len(MODES) + 1))
    for c in ("close", "far"):
        for op in sorted({r["op"] for r in runs}):
            row = []
            for mode in MODES + ("mpi",):
                v = cells.get((c, op, mode))
                if not v:
                    row.append("-")
                    continue
                n = min(len(x) for x in v)
                row.append(" / ".join(us(statistics.median(x[i] for x in v)) for i in range(n))
                           + f" ({len(v)})")
            print(f"| {c}, {op} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
