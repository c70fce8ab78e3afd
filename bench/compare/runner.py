"""Running one command of bench/compare at a time: its rows streamed to the terminal, its
output kept in logs/, the machine's state (load, other processes' CPU, the cores' distance)
recorded around it, and a process group of its own killed when it ends or times out."""

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.compare.machine import children_cpu, cpu_jiffies, loadavg, other_cpu, wait_for_idle
from bench.compare.report import fmt_size, info, warn

ROOT = Path(__file__).resolve().parents[2]
OP_ALIASES = {"all_reduce": "allreduce", "all_gather": "allgather",
              "all_gather_into_tensor": "allgather", "bcast": "broadcast",
              "reduce_scatter_tensor": "reduce_scatter"}

# A process group of our own (not a session): Popen(process_group=0) from Python 3.11.
NEW_PGROUP = ({"process_group": 0} if sys.version_info >= (3, 11)
              else {"preexec_fn": os.setpgrp})


class Runner:
    """Runs one command at a time, streams rows to the terminal, keeps logs."""

    def __init__(self, logs_dir, timeout, wait_idle=0.0, load=None, rtt=None):
        self.wait_idle = wait_idle
        self.load = load  # bench/probes/load.py's Load, run beside every command
        self.rtt = rtt or (lambda: None)  # the cores' distance, before and after every command
        self.logs = logs_dir
        self.logs.mkdir(parents=True, exist_ok=True)
        self.timeout = timeout
        self.runs = []
        self.start = 0  # which of --starts N this is (0: only one)

    def run(self, impl, tag, cmd, env=None, wait=True):
        """Run cmd; return the list of JSON rows it printed."""
        if self.start:
            tag = f"{tag}-s{self.start}"
        log_base = self.logs / tag
        waited = wait_for_idle(self.wait_idle) if wait and self.wait_idle > 0 else None
        info(f"[{impl}] {shlex.join(cmd)}")
        rec = {"waited_idle_s": waited, "impl": impl, "tag": tag, "cmd": shlex.join(cmd), "rc": None,
               "rows": 0, "seconds": None, "error": None, "loadavg_start": loadavg(),
               "core_rtt_ns": [self.rtt()]}
        self.runs.append(rec)
        if self.load is not None:
            self.load.start()
        t0 = time.monotonic()
        cpu0, kids0 = cpu_jiffies(), children_cpu()
        rows = []
        try:
            with open(f"{log_base}.stdout", "w") as so, open(f"{log_base}.stderr", "w") as se:
                # Own process group (to kill launcher + ranks together), but NOT a new
                # session: with sched_autogroup a new session is a new scheduling group, and
                # busy-polling MPI ranks alone in one were seen stacked on one CPU under load
                # (8-16 ms per iteration).
                proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=se, text=True,
                                        env=env, cwd=ROOT, **NEW_PGROUP)
                killed = threading.Event()

                def on_timeout():
                    killed.set()
                    try:  # the whole process group we started (launcher + ranks)
                        os.killpg(proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass

                timer = threading.Timer(self.timeout, on_timeout)
                timer.start()
                try:
                    for line in proc.stdout:
                        so.write(line)
                        so.flush()
                        row = parse_row(line)
                        if row is None:
                            continue
                        rows.append(row)
                        print(f"  {impl:8s} {str(row.get('op')):9s} "
                              f"{fmt_size(int(row.get('bytes', 0))):>8s}  "
                              f"{float(row.get('time_us', 0)):12.2f} us  "
                              f"busbw {float(row.get('busbw', 0)):8.3f} GB/s"
                              + (f"  WRONG={row.get('wrong')}" if row.get("wrong") else ""),
                              flush=True)
                    rc = proc.wait()
                except KeyboardInterrupt:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    raise
                finally:
                    timer.cancel()
                    # Ranks orphaned by a crashed launcher would keep the machine busy.
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
            rec["rc"] = rc
            if killed.is_set():
                rec["error"] = f"killed after {self.timeout:.0f} s timeout"
            elif rc != 0:
                rec["error"] = f"exit code {rc}: " + tail(f"{log_base}.stderr")
        except OSError as e:
            rec["error"] = f"could not run: {e}"
        rec["seconds"] = round(time.monotonic() - t0, 2)
        rec["loadavg_end"] = loadavg()
        rec["core_rtt_ns"].append(self.rtt())
        rec["other_cpu"] = other_cpu(cpu0, kids0, time.monotonic() - t0)  # the load counts as others
        if self.load is not None:
            self.load.stop()
        rec["rows"] = len(rows)
        for r in rows:
            r["core_rtt_ns"] = rec["core_rtt_ns"]
        if self.start:
            rec["start"] = self.start
            for r in rows:
                r["start"] = self.start
        if rec["error"]:
            warn(f"[{impl}] {rec['error']}")
        return rows


def tail(path, n=600):
    try:
        text = Path(path).read_text(errors="replace").strip()
    except OSError:
        return ""
    return text[-n:].replace("\n", " | ")


def parse_row(line):
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        row = json.loads(line)
    except ValueError:
        return None
    if not isinstance(row, dict):
        return None
    try:
        row["op"] = OP_ALIASES.get(str(row["op"]), str(row["op"]))
        row["bytes"] = int(row["bytes"])
        row["time_us"] = float(row["time_us"])
        row["busbw"] = float(row["busbw"])
        row["algbw"] = float(row.get("algbw", 0.0))
        row["wrong"] = int(row.get("wrong", 0) or 0)
    except (KeyError, TypeError, ValueError):
        return None
    return row


def tag_rows(rows, impl):
    for r in rows:
        if r.get("impl") not in (None, impl):
            r["impl_reported"] = r["impl"]
        r["impl"] = impl
    return rows
