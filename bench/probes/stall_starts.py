"""Counts the starts of a command that stall: run it N times, beside load,
and call a start stalled when it has not ended within a bound.

    python3 -m bench.probes.stall_starts [--starts N] [--bound S] [--load SPEC] -- CMD ...

For each stalled start it keeps `ss -tnmi` (every TCP socket's queues,
memory, drops and retransmission state) in out/stall-<i>.ss, then kills
the start's process group. At the end it prints how many starts stalled
and how far the kernel's counters of receive-queue drops moved
(/proc/net/netstat: TCPRcvQDrop, RcvPruned). A rank that stalls without
failing is what a user meets as a job that hangs: the bound should be a
few times the command's normal run time.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

from bench.probes import load


def drop_counters() -> dict:
    counters = {}
    with open("/proc/net/netstat") as f:
        lines = f.read().splitlines()
    for names, values in zip(lines[::2], lines[1::2]):
        for n, v in zip(names.split()[1:], values.split()[1:]):
            if n in ("TCPRcvQDrop", "RcvPruned"):
                counters[n] = int(v)
    return counters


def main(argv) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--starts", type=int, default=20)
    ap.add_argument("--bound", type=float, default=40.0, help="seconds after which a start counts as stalled")
    ap.add_argument("--load", default="1", help="bench/probes/load.py SPEC, or 0 for none")
    ap.add_argument("--out", default="out", help="where the ss snapshots go")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        ap.error("no command")
    os.makedirs(a.out, exist_ok=True)
    before = drop_counters()
    stalled = 0
    ld = load.Load(a.load).start() if a.load != "0" else None
    try:
        for i in range(1, a.starts + 1):
            t0 = time.monotonic()
            p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, start_new_session=True)
            try:
                rc = p.wait(timeout=a.bound)
                print(f"start {i}: exit {rc} in {time.monotonic() - t0:.1f} s", flush=True)
            except subprocess.TimeoutExpired:
                stalled += 1
                ss = subprocess.run(["ss", "-tnmi"], capture_output=True, text=True).stdout
                path = os.path.join(a.out, f"stall-{i}.ss")
                with open(path, "w") as f:
                    f.write(ss)
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                print(f"start {i}: STALLED (not done after {a.bound:.0f} s; sockets in {path})", flush=True)
    finally:
        if ld:
            ld.stop()
    after = drop_counters()
    moved = ", ".join(f"{k} +{after[k] - before.get(k, 0)}" for k in sorted(after))
    print(f"{stalled} of {a.starts} starts stalled; kernel counters: {moved}")
    return 1 if stalled else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
