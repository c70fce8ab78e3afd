"""Fixtures for the shoalrun tests.

Every test runs its launchers with SHOAL_TEST_JOB=<unique tag> in their
environment (inherited by workers and their children), and checks at the end
that no process carrying the tag is left. Waits poll files or process state
with a deadline; nothing sleeps to synchronise.
"""
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # tests/ports.py
from ports import free_port, free_ports  # noqa: E402,F401

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = REPO / ".venv" / "bin"


def shoalrun_path():
    return Path(os.environ.get("SHOALRUN", REPO / "build" / "bin" / "shoalrun"))


def wait_for(cond, timeout=10.0, interval=0.02, what="condition"):
    """Polls cond() until it is truthy; returns its value or fails the test."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def env_dump(*names):
    """A worker script (run with --no-python) that writes the values of the
    environment variables `names` to $JOB_DIR/env.$RANK ("unset" if absent)."""
    return ("#!/bin/sh\nfor v in " + " ".join(names) + "; do\n"
            '  eval "echo $v=\\${$v-unset}"\n'
            'done > "$JOB_DIR/env.$RANK"\n')


def read_env(job, rank):
    """What env_dump's script wrote for `rank`, as a dict."""
    return dict(l.split("=", 1) for l in (job.dir / f"env.{rank}").read_text().splitlines())


def job_pids(tag):
    """Pids of every process whose environment carries SHOAL_TEST_JOB=tag."""
    needle = f"SHOAL_TEST_JOB={tag}".encode()
    me = os.getpid()
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                env = f.read()
            with open(f"/proc/{d}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state == b"Z":
            continue  # a zombie holds nothing; its parent will reap it
        if needle in env.split(b"\0"):
            pids.append(int(d))
    return pids


class Launcher:
    """One shoalrun process, output to files (no pipe can fill up)."""

    def __init__(self, args, env, cwd, name):
        self.args = [str(a) for a in args]
        self.out_path = Path(cwd) / f"{name}.out"
        self.err_path = Path(cwd) / f"{name}.err"
        self._out = open(self.out_path, "wb")
        self._err = open(self.err_path, "wb")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(self.args, env=env, cwd=cwd, stdout=self._out, stderr=self._err,
                                     stdin=subprocess.DEVNULL)
        self.ended = None

    @property
    def pid(self):
        return self.proc.pid

    def wait(self, timeout=30):
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"shoalrun {' '.join(self.args[1:])} did not exit within {timeout} s;\n"
                        f"stderr:\n{self.err}")
        if self.ended is None:
            self.ended = time.monotonic()
        return rc

    def poll(self):
        rc = self.proc.poll()
        if rc is not None and self.ended is None:
            self.ended = time.monotonic()
        return rc

    def signal(self, sig):
        self.proc.send_signal(sig)

    @property
    def out(self):
        self._out.flush()
        return self.out_path.read_text(errors="replace")

    @property
    def err(self):
        self._err.flush()
        return self.err_path.read_text(errors="replace")

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._out.close()
        self._err.close()


class Job:
    """Starts launchers for one test and cleans up after it."""

    def __init__(self, tmp_path):
        self.tag = uuid.uuid4().hex
        self.dir = tmp_path
        self.launchers = []
        exe = shoalrun_path()
        if not exe.exists():
            pytest.fail(f"{exe} is not built (ninja -C build shoalrun), or set SHOALRUN")
        self.exe = exe
        self.base_env = dict(os.environ)
        for k in list(self.base_env):
            if k.startswith(("SM_", "SLURM_", "OMPI_", "SHOAL_")) or k in (
                    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                    "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES"):
                del self.base_env[k]
        self.base_env["PATH"] = f"{VENV_BIN}:{self.base_env.get('PATH', '/usr/bin:/bin')}"
        self.base_env["SHOAL_TEST_JOB"] = self.tag
        self.base_env["JOB_DIR"] = str(tmp_path)

    def env(self, **extra):
        e = dict(self.base_env)
        for k, v in extra.items():
            if v is None:
                e.pop(k, None)
            else:
                e[k] = str(v)
        return e

    def start(self, *args, env=None, name=None, prefix=()):
        name = name or f"launcher{len(self.launchers)}"
        launcher = Launcher([*prefix, self.exe, *args], env or self.env(), self.dir, name)
        self.launchers.append(launcher)
        return launcher

    def run(self, *args, env=None, timeout=30, name=None):
        launcher = self.start(*args, env=env, name=name)
        launcher.rc = launcher.wait(timeout)
        return launcher

    def script(self, name, text, mode=0o755):
        p = self.dir / name
        p.write_text(text)
        p.chmod(mode)
        return p

    def wait_files(self, pattern, count, timeout=10):
        return wait_for(lambda: len(list(self.dir.glob(pattern))) >= count and sorted(self.dir.glob(pattern)),
                        timeout, what=f"{count} files {pattern}")

    def check_no_orphans(self, timeout=5.0):
        """Every process of the job must be gone (bounded wait for exits in flight)."""
        for launcher in self.launchers:
            if launcher.proc.poll() is None:
                launcher.wait(timeout)
        deadline = time.monotonic() + timeout
        left = job_pids(self.tag)
        while left and time.monotonic() < deadline:
            time.sleep(0.05)
            left = job_pids(self.tag)
        if left:
            desc = []
            for p in left:
                try:
                    cmdline = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                    desc.append(f"{p}: {cmdline}")
                except OSError:
                    pass
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass
            pytest.fail("processes of the job were left behind:\n" + "\n".join(desc))

    def close(self):
        for launcher in self.launchers:
            launcher.close()


@pytest.fixture
def job(tmp_path):
    j = Job(tmp_path)
    try:
        yield j
        j.check_no_orphans()
    finally:
        j.close()
        for p in job_pids(j.tag):  # never leak, even when the test failed
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass


def one_error_line(launcher):
    """Bad input: exit code 2 and exactly one line on stderr."""
    lines = [l for l in launcher.err.splitlines() if l.strip()]
    assert launcher.rc == 2, launcher.err
    assert len(lines) == 1, launcher.err
    assert lines[0].startswith("shoalrun: error: "), lines[0]
    return lines[0]


RANK_LINE = re.compile(r"^\[(\d+)\]: rank (\d+) of (\d+)\b", re.M)


def assert_ranks_reported(out, world):
    """Every worker ran: exactly one line `[r]: rank r of <world> ...` for each r in 0..world-1
    (the launcher's prefix and the worker's own RANK agree), and no other."""
    got = sorted((int(p), int(r), int(w)) for p, r, w in RANK_LINE.findall(out))
    assert got == [(r, r, world) for r in range(world)], f"ranks that reported {got}:\n{out}"


def assert_rank_files(job, stem, world):
    """Every worker ran: exactly the files <stem>.0 .. <stem>.<world-1> were written."""
    got = sorted(p.name for p in job.dir.iterdir() if re.fullmatch(rf"{re.escape(stem)}\.\d+", p.name))
    assert got == sorted(f"{stem}.{r}" for r in range(world)), f"ranks that reported: {got}"


PY = sys.executable
