"""Runs a multi-process torch.distributed job for the tests.

``run_job(suite, world_size)`` starts `world_size` processes of
``tests/python/worker.py SUITE`` (or of the script ``worker=``) with RANK /
WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT set (as torchrun and
shoalrun do), waits for all of them and returns their outputs. A rank that
fails makes the others be killed at once (they would wait for it forever).
Every rank prints one line
``RESULT <json>`` with its checks' outcomes.
"""

import atexit
import json
import os
import signal
import select
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
WORKER = HERE / "worker.py"

sys.path.insert(0, str(HERE.parent))   # tests/ports.py
from ports import free_port  # noqa: E402,F401


class JobError(AssertionError):
    pass


class Checks:
    """A worker's checks: run(name, fn, *args, **kwargs) records each outcome (and its
    seconds); report() prints the RESULT line run_job reads."""

    def __init__(self):
        self.passed, self.failed, self.info = [], {}, {}
        self.prefix = ""

    def run(self, name, fn, *args, **kwargs):
        name = self.prefix + name
        t0 = time.perf_counter()
        try:
            fn(*args, **kwargs)
            self.passed.append(name)
        except Exception as e:  # noqa: BLE001
            self.failed[name] = f"{type(e).__name__}: {e}\n{traceback.format_exc()[-2500:]}"
            print(f"FAILED {name}: {self.failed[name]}", flush=True)
        self.info[name] = round(time.perf_counter() - t0, 2)

    def report(self):
        rank = int(os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "-1")))
        print("RESULT " + json.dumps({"rank": rank, "passed": self.passed,
                                      "failed": self.failed, "info": self.info}), flush=True)
        return 1 if self.failed else 0


class _Zygote:
    """zygote.py, started once per test process: the rank processes of the
    workers here (tests/python/*_worker.py, which import torch) fork from it,
    torch already imported, instead of each starting Python and importing
    torch anew. SHOAL_TEST_FRESH_RANKS=1 starts every rank as a fresh
    `python worker.py` instead."""

    def __init__(self):
        env = dict(os.environ, OMP_NUM_THREADS="1")
        self.proc = subprocess.Popen([sys.executable, str(HERE / "zygote.py")], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env, cwd=ROOT)
        self.out = self.proc.stdout.fileno()
        os.set_blocking(self.out, False)
        self.pending = b""
        self.exits = {}

    def _lines(self, block):
        if block:
            select.select([self.out], [], [], 1.0)
        try:
            chunk = os.read(self.out, 1 << 16)
        except BlockingIOError:
            return []
        if not chunk:
            raise RuntimeError(f"the zygote exited ({self.proc.wait()})")
        self.pending += chunk
        *lines, self.pending = self.pending.split(b"\n")
        out = []
        for line in lines:
            msg = json.loads(line)
            if "exit" in msg:
                self.exits[msg["exit"]] = os.waitstatus_to_exitcode(msg["status"])
            else:
                out.append(msg)
        return out

    def start(self, argv, env, cwd, log):
        self.proc.stdin.write((json.dumps({"argv": argv, "env": env, "cwd": str(cwd), "log": log}) + "\n").encode())
        self.proc.stdin.flush()
        while True:
            for msg in self._lines(block=True):
                return _ZygoteRank(self, msg["pid"])

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait()


class _ZygoteRank:
    """A rank forked by the zygote, with Popen's poll/kill/wait/returncode."""

    def __init__(self, zygote, pid):
        self.zygote, self.pid, self.returncode = zygote, pid, None

    def poll(self):
        if self.returncode is None:
            self.zygote._lines(block=False)
            self.returncode = self.zygote.exits.pop(self.pid, None)
        return self.returncode

    def kill(self):
        if self.poll() is None:
            try:
                os.kill(self.pid, 9)
            except ProcessLookupError:
                pass

    def wait(self):
        while self.poll() is None:
            self.zygote._lines(block=True)
        return self.returncode


_ZYGOTE = None


def _start_rank(worker, argv, env, log):
    global _ZYGOTE
    if os.environ.get("SHOAL_TEST_FRESH_RANKS") == "1" or Path(worker).resolve().parent != HERE:
        return subprocess.Popen([sys.executable, str(worker), *argv], env=env, stdout=log,
                                stderr=subprocess.STDOUT, cwd=ROOT)
    if _ZYGOTE is None or _ZYGOTE.proc.poll() is not None:
        _ZYGOTE = _Zygote()
        atexit.register(_ZYGOTE.close)
    return _ZYGOTE.start([str(worker), *argv], env, ROOT, log.name)


def _dump_stacks(procs, logs):
    """Has each rank still running write its threads' Python stacks to its
    log (the zygote's ranks register faulthandler on SIGUSR1) and waits, at
    most 3 s, until every such log shows one."""
    alive = {r: os.path.getsize(logs[r].name) for r, p in enumerate(procs)
             if p.poll() is None and isinstance(p, _ZygoteRank)}
    for r in alive:
        os.kill(procs[r].pid, signal.SIGUSR1)
    give_up = time.monotonic() + 3.0
    while alive and time.monotonic() < give_up:
        for r, start in list(alive.items()):
            with open(logs[r].name, "rb") as f:
                f.seek(start)
                if b"most recent call first" in f.read():
                    del alive[r]
        time.sleep(0.05)


def _tail(text, limit=6000):
    """The end of a rank's log without C++ backtrace frames (a warning
    repeated with its backtrace would fill the limit)."""
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("frame #")]
    return "\n".join(lines)[-limit:]


def run_job(suite, world_size, *, timeout=180, env=None, args=(), worker=WORKER):
    port = free_port()
    procs, outs = [], []
    for r in range(world_size):
        e = dict(os.environ)
        e.update(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(world_size),
                 LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                 OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", SHOAL_TIMEOUT_S="60",
                 PYTHONPATH=str(ROOT / "python") + os.pathsep + e.get("PYTHONPATH", ""))
        e.update(env or {})
        log = tempfile.NamedTemporaryFile("w+", prefix=f"shoal-test-{suite}-{world_size}-{r}-", suffix=".log", delete=False)
        outs.append(log)
        procs.append(_start_rank(worker, [suite, *args], e, log))
    deadline = time.monotonic() + timeout
    failed = None
    try:
        while any(p.poll() is None for p in procs):
            if failed is None:
                for r, p in enumerate(procs):
                    if p.poll() not in (None, 0):
                        failed = f"rank {r} exited with {p.returncode}"
                        break
            if failed is not None or time.monotonic() > deadline:
                if failed is None:
                    failed = f"timed out after {timeout} s"
                    _dump_stacks(procs, outs)
                for p in procs:
                    if p.poll() is None:
                        p.kill()
            time.sleep(0.02)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    texts = []
    for log in outs:
        log.seek(0)
        texts.append(log.read())
        log.close()
        os.unlink(log.name)
    results = []
    for r, text in enumerate(texts):
        res = None
        for line in text.splitlines():
            if line.startswith("RESULT "):
                res = json.loads(line[len("RESULT "):])
        results.append(res)
    bad = [r for r, p in enumerate(procs) if p.returncode != 0]
    if failed or bad:
        detail = "\n".join(f"----- rank {r} (exit {procs[r].returncode}) -----\n{_tail(texts[r])}"
                           for r in range(world_size))
        raise JobError(f"job {suite} x{world_size}: {failed or 'ranks ' + str(bad) + ' failed'}\n{detail}")
    return results


def assert_all_passed(results):
    """Every rank ran and reported, ran at least one check, and no check failed.

    `results` has one entry per rank started (run_job), so a rank that exits
    before printing its RESULT line, or prints one for another rank or with
    nothing run, fails here: the job can never pass with fewer ranks than it
    started."""
    problems = []
    for r, res in enumerate(results):
        if res is None:
            problems.append(f"rank {r}: no RESULT line")
            continue
        if res.get("rank") != r:
            problems.append(f"rank {r}: its RESULT line says rank {res.get('rank')}")
        if not res["passed"] and not res["failed"]:
            problems.append(f"rank {r}: ran no check")
        for name, err in res["failed"].items():
            problems.append(f"rank {r}: {name}: {err}")
    assert results, "no rank ran"
    assert not problems, "\n".join(problems)
    return results[0]["passed"]
