#!/usr/bin/env python3
"""Interference for benchmarks: other work sharing the cores, steady or bursty.

    bench/probes/load.py SPEC            # runs until killed (SIGTERM/SIGINT)

SPEC (also `python3 -m bench.compare --load SPEC`, `bench/torch/... --load SPEC`):

  N            N cores' worth of bursty load: 2N processes (rounded, at
               least one), each repeating a compute burst of 1-10 ms (a
               matrix product in a loop) and a sleep of 1-10 ms (random,
               uniform): about half a core each on average, in bursts, the
               shape of a backward pass competing for the cores while
               gradients are reduced (a duty of N over the processes where
               that is not a half: 0.2 is one process at duty 0.2)
  busy:N       N processes spinning without pause (steady load)
  burst:N[:D]  N bursty processes with duty cycle D (default 0.5)

The processes are plain Python (numpy), one thread each (their BLAS
library's pool is held to one thread: a pool of its own would spin beside
every burst, and "1" would take 1.75 cores); the random bursts are seeded per
process, so two runs with one SPEC see the same pattern of bursts.
"""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import time
from typing import List, Optional, Tuple


def parse(spec: str) -> Tuple[str, int, float]:
    """(kind, processes, duty) of a SPEC; ValueError naming the spec if bad
    (no load is no --load: N must be above 0)."""
    def bad(why: str = "expected N, busy:N or burst:N[:DUTY]") -> ValueError:
        return ValueError(f"--load {spec!r}: {why}")
    kind, _, rest = spec.partition(":") if spec.startswith(("busy:", "burst:")) else ("", "", spec)
    fields = rest.split(":")
    try:
        if kind == "busy" and len(fields) == 1:
            n, duty = int(rest), 1.0
        elif kind == "burst" and len(fields) <= 2:
            n, duty = int(fields[0]), float(fields[1]) if len(fields) == 2 else 0.5
        elif not kind:
            cores = float(spec)
        else:
            raise ValueError
    except ValueError:
        raise bad() from None
    if not kind:
        if not 0.0 < cores < float("inf"):
            raise bad(f"N cores' worth must be above 0 (leave --load out for none), got {spec}")
        kind, n = "burst", max(1, round(2 * cores))
        duty = cores / n  # a half where 2N is whole
    if not 0.0 < duty <= 1.0:
        raise bad(f"the duty cycle must be in (0, 1], got {fields[1]}")
    if n < 1:
        raise bad(f"the number of processes must be at least 1 (leave --load out for none), got {n}")
    return kind, n, duty


# A worker's environment: its BLAS library runs the matrix product in the
# worker's own thread. OpenBLAS (numpy's wheels) otherwise starts a thread
# per core that spins between products: each worker of "1" would take 0.87 of a
# core, 0.55 of it in that thread, instead of the half its duty sets.
ONE_THREAD = {name: "1" for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}


def _worker(kind: str, duty: float, seed: int) -> None:
    import numpy as np
    rng = random.Random(seed)
    a = np.random.default_rng(seed).standard_normal((96, 96))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    a = np.tanh(a @ a)  # numpy's libraries loaded: from here on, only the pattern of bursts
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        burst = rng.uniform(1e-3, 10e-3) if kind == "burst" else 1.0
        end = time.perf_counter() + burst
        while time.perf_counter() < end:
            a = np.tanh(a @ a)
        if kind == "burst":
            time.sleep(burst * (1.0 - duty) / duty)


# How long a worker may take to start (Python and numpy loaded) before
# Load.start() gives up on it.
READY_TIMEOUT_S = 60.0


class Load:
    """Starts the processes of a SPEC (context manager); stop() ends them.

    start() returns once every worker has said it is in its loop: starting
    Python and numpy takes each one a whole core for a few tenths of a
    second, more than the load itself, and a run begun before then measures
    that instead (a 2-rank TCP allreduce of 8 B took milliseconds per call
    when it ran within the workers' start)."""

    def __init__(self, spec: Optional[str]):
        self.spec = spec
        self.procs: List[subprocess.Popen] = []
        if spec:
            parse(spec)

    def start(self) -> "Load":
        if not self.spec:
            return self
        kind, n, duty = parse(self.spec)
        for i in range(n):
            self.procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", kind,
                                                str(duty), str(1000 + i)], stdin=subprocess.DEVNULL,
                                               env={**os.environ, **ONE_THREAD},
                                               stdout=subprocess.PIPE, text=True))
        deadline = time.monotonic() + READY_TIMEOUT_S
        for i, p in enumerate(self.procs):
            left = max(0.0, deadline - time.monotonic())
            line = p.stdout.readline() if select.select([p.stdout], [], [], left)[0] else None
            if line is None or line.strip() != "ready":
                code = p.poll()
                if line == "":  # its output closed: it is exiting, and its status is moments away
                    try:
                        code = p.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        pass
                self.stop()
                why = f"it exited with status {code}" if code is not None else f"no word in {READY_TIMEOUT_S:g} s"
                raise RuntimeError(f"load {self.spec!r}: worker {i} did not start ({why})")
        return self

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            if p.stdout:
                p.stdout.close()
        self.procs = []

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def describe(self) -> str:
        if not self.spec:
            return "none"
        kind, n, duty = parse(self.spec)
        if kind == "busy":
            return f"{n} busy-loop process(es) (steady, {n} core(s))"
        return (f"{n} bursty process(es): compute bursts of 1-10 ms at duty {duty:g} "
                f"(about {n * duty:g} core(s) on average)")


def main(argv: List[str]) -> int:
    if argv[:1] == ["--worker"]:
        _worker(argv[1], float(argv[2]), int(argv[3]))
        return 0
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        load = Load(argv[0])  # checks the spec
    except ValueError as e:
        print(f"load.py: error: {e}", file=sys.stderr)
        return 2
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    load.start()
    print(f"load: {load.describe()}; Ctrl-C ends it", flush=True)
    try:
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        load.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
