"""Before/after of algorithms on this machine: short shoal-perf runs, each
algorithm forced in turn (--algo), alternating, R rounds; per size the
median and the best of the R runs' medians. Alternating is what makes the
comparison fair on a machine whose speed drifts over minutes: each round
sees every algorithm within a few seconds of the others.

  python3 -m bench.probes.ab_algos --op allgather --algos shared,shared_cma -b 16K -e 1M \
      [--np 2] [--rounds 5] [--iters 2000] [-f 2] [--barrier] [--load SPEC] [--out DIR | --baseline NAME]

--load SPEC runs bench/probes/load.py's interference (as bench.compare --load) beside
every run, started before the first round and stopped after the last.

Prints a Markdown table. With --out DIR it writes results.md, summary.json (per
algorithm and size: median, p10 and p90 over the rounds) and runs.jsonl (every
run's rows) into DIR; with --baseline NAME results.md and summary.json into
bench/results/NAME and runs.jsonl into bench/out/NAME (ignored by git).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
from datetime import datetime, timezone

from bench import baseline
from bench.probes.load import Load

PERF = str(baseline.ROOT / "build" / "bin" / "shoal-perf")
SUMMARY_COLUMNS = ["algo", "op", "bytes", "rounds", "time_us_median", "time_us_p10", "time_us_p90"]
SUMMARY_NOTE = ("per forced algorithm and size, over the alternating rounds: median, p10 and p90 of "
                "shoal-perf's time_us (median over iterations, slowest rank)")


def run_once(args, algo):
    cmd = [PERF, "--np", str(args.np), "--op", args.op, "-b", args.minbytes, "-e", args.maxbytes,
           "-f", str(args.stepfactor), "--iters", str(args.iters), "--warmup", str(args.warmup), "--format", "json"]
    if algo != "auto":
        cmd += ["--algo", algo]
    if args.barrier:
        cmd += ["--barrier"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def table(args, times):
    algos = args.algos
    lines = ["| bytes | " + " | ".join(f"{a} median | {a} best" for a in algos) +
             f" | {algos[-1]} / {algos[0]} (median) |",
             "|---:|" + "---:|---:|" * len(algos) + "---:|"]
    for size in sorted({s for a in algos for s in times[a]}):
        cells, med = [], {}
        for a in algos:
            v = times[a].get(size, [])
            med[a] = statistics.median(v) if v else None
            cells += [f"{med[a]:.2f}" if v else "-", f"{min(v):.2f}" if v else "-"]
        ratio = med[algos[-1]] / med[algos[0]] if med[algos[0]] and med[algos[-1]] else None
        lines.append(f"| {size} | " + " | ".join(cells) + (f" | {ratio:.2f}x |" if ratio else " | - |"))
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--op", required=True)
    p.add_argument("--algos", required=True, help="comma-separated; 'auto' = the selection table")
    p.add_argument("-b", "--minbytes", default="8")
    p.add_argument("-e", "--maxbytes", default="1M")
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("-f", "--stepfactor", type=int, default=2)
    p.add_argument("--barrier", action="store_true", help="an untimed barrier before each timed iteration")
    p.add_argument("--load", default=None, metavar="SPEC",
                   help="interference beside every run (bench/probes/load.py)")
    p.add_argument("--out", default=None, help="directory for results.md, summary.json and runs.jsonl")
    p.add_argument("--baseline", default=None, metavar="NAME",
                   help="results.md and summary.json into bench/results/NAME, runs.jsonl into bench/out/NAME")
    args = p.parse_args()
    if args.out and args.baseline:
        p.error("--out and --baseline exclude each other")
    try:
        out, raw = baseline.folders(args.baseline) if args.baseline else (args.out, args.out)
    except ValueError as e:
        p.error(str(e))
    args.algos = args.algos.split(",")
    if args.rounds < 1 or len(args.algos) < 2:
        p.error("--rounds >= 1 and at least two --algos")
    times = {a: {} for a in args.algos}
    runs = []
    with Load(args.load) as load:
        for r in range(args.rounds):
            for a in args.algos:
                for row in run_once(args, a):
                    times[a].setdefault(row["bytes"], []).append(row["time_us"])
                    runs.append(dict(row, round=r, algo_forced=a))
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                 "unknown CPU")
    md = (f"# {args.op}: {' vs '.join(args.algos)}, {args.np} ranks\n\n"
          f"- date: {datetime.now(timezone.utc).isoformat(timespec='seconds')}; {os.cpu_count()} x {model}; "
          f"load average {' '.join(open('/proc/loadavg').read().split()[:3])}\n"
          f"- command: `python3 -m bench.probes.ab_algos {' '.join(sys.argv[1:])}`\n"
          f"- interference: {load.describe()}\n"
          f"- time_us of shoal-perf (median over iterations, slowest rank); per size the median and the best "
          f"of {args.rounds} alternating runs\n\n" + table(args, times) + "\n")
    if out:
        where = os.path.relpath(raw, baseline.ROOT) if raw != out else "."
        md += (f"\nMedian, p10 and p90 over the rounds: `summary.json`; every run's rows: "
               f"`{where}/runs.jsonl`" + (" (written by the command, ignored by git)" if raw != out else "") + ".\n")
    print(md)
    if out:
        os.makedirs(out, exist_ok=True)
        os.makedirs(raw, exist_ok=True)
        with open(os.path.join(out, "results.md"), "w") as f:
            f.write(md)
        baseline.write_summary(os.path.join(out, "summary.json"), SUMMARY_COLUMNS, summarize(args.op, runs),
                               SUMMARY_NOTE)
        with open(os.path.join(raw, "runs.jsonl"), "w") as f:
            for row in runs:
                f.write(json.dumps(row) + "\n")


def summarize(op, runs):
    """Rows of SUMMARY_COLUMNS from the runs' rows (each with algo_forced and bytes)."""
    times = {}
    for row in runs:
        times.setdefault((row["algo_forced"], int(row["bytes"])), []).append(row["time_us"])
    return [[algo, op, size, len(v)] + baseline.spread(v) for (algo, size), v in times.items()]


if __name__ == "__main__":
    main()
