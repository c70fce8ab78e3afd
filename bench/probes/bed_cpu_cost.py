"""CPU time per collective on the net bed: is a run bound by the links or by the CPUs?

    python3 -m bench.probes.bed_cpu_cost [--op allreduce] [--size 16M] [--per-host 2] [--reps 3]

(from the repository root; the bed is tools/netbed).

Runs shoal-perf on a fresh bed (2 hosts, default shaping) twice per repetition, with
5 and 45 timed iterations, and reads the machine's busy CPU time (/proc/stat) around
each job; the difference of the two, over the 40 extra iterations, is the CPU time one
operation costs on the whole machine (every rank and the kernel's network work, start-up
cancelled out), printed next to the wall time per iteration. If that CPU time divided
by the machine's cores exceeds a target time, no schedule meets the target here.
"""
import argparse
import json
import os
import sys
import time

from tools.netbed import NetBed

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
USER_HZ = os.sysconf("SC_CLK_TCK")


def busy():
    """Busy CPU time of the whole machine so far, in ticks (all but idle and iowait)."""
    v = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return sum(v) - v[3] - v[4]


def job(bed, a, iters):
    argv = [os.path.join(REPO, "build", "bin", "shoal-perf"), "--op", a.op, "-b", a.size,
            "-e", a.size, "--iters", str(iters), "--warmup", "2", "--format", "json"]
    b0 = busy()
    w0 = time.monotonic()
    res = bed.job(argv, per_host=a.per_host)
    w1 = time.monotonic()
    b1 = busy()
    res.raise_for_status()
    row = [json.loads(x) for x in res.ranks[0].stdout.splitlines() if x.startswith("{")][0]
    return (b1 - b0) / USER_HZ, w1 - w0, row["time_us"]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--op", default="allreduce")
    p.add_argument("--size", default="16M")
    p.add_argument("--per-host", type=int, default=2)
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args()
    cores = os.cpu_count()
    print(f"# {a.op} {a.size}, 2 hosts x {a.per_host} ranks, {cores} cores; per operation:")
    with NetBed(hosts=2) as bed:
        for _ in range(a.reps):
            c1, w1, _ = job(bed, a, 5)
            c2, w2, t = job(bed, a, 45)
            cpu_ms, wall_ms = (c2 - c1) / 40 * 1e3, (w2 - w1) / 40 * 1e3
            print(f"cpu {cpu_ms:6.1f} ms ({cpu_ms / cores:5.1f} ms on {cores} cores)  "
                  f"wall {wall_ms:6.1f} ms  shoal-perf median {t / 1e3:6.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
