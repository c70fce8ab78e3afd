"""The cores' distance, measured around every run of bench/compare.

bench/probes/core_rtt.c times a cache line's round trip between the first CPU and
each other one. On a VM it follows the host's placement of the virtual CPUs:
on the 2-vCPU EPYC VM the round trip is 50-60 ns most of the time and
310-350 ns in windows of several seconds, when the two vCPUs sit on different
core complexes. In those windows every transfer of data one core has just
written to the other costs several times more, which slows shared-memory
collectives that pass data through caches (shoal's arena slots, Open MPI's
shared FIFO) by 3-4x while single-copy reads of clean buffers barely change.
bench/compare runs the probe before and after each command and names the
starts that met far cores, so a slow start can be told from a slow library.
"""

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "bench" / "probes" / "core_rtt.c"
BIN = ROOT / "build" / "bench" / "core_rtt"
FAR = 2.0  # a start is on far cores when a round trip took FAR x the fastest seen in the run


def build():
    """The probe's path, compiled if missing or stale; (None, why) if it cannot be."""
    if BIN.exists() and BIN.stat().st_mtime >= SRC.stat().st_mtime:
        return BIN, None
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None, "no C compiler (cc) found"
    BIN.parent.mkdir(parents=True, exist_ok=True)
    tmp = BIN.with_name(f".core_rtt.{os.getpid()}.tmp")
    cmd = [cc, "-O2", "-pthread", "-o", str(tmp), str(SRC)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        tmp.unlink(missing_ok=True)
        return None, f"{shlex.join(cmd)} failed: {r.stderr.strip()[-400:]}"
    os.replace(tmp, BIN)
    return BIN, None


def measure(binary):
    """The slowest pair's round trip in ns, or None (one CPU, or the probe failed)."""
    if binary is None:
        return None
    try:
        out = subprocess.run([str(binary), "--rounds", "5000"], capture_output=True, text=True, timeout=10)
        res = json.loads(out.stdout)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return res["max_ns"] if out.returncode == 0 and res.get("pairs") else None


def note(runs):
    """A results.md line: the round trips seen and the runs taken on far cores."""
    worst = [(rec, max((ns for ns in rec.get("core_rtt_ns") or () if ns), default=0)) for rec in runs]
    seen = [ns for rec in runs for ns in rec.get("core_rtt_ns") or () if ns]
    if not seen:
        return None
    fastest = min(seen)
    far = [(rec["impl"], rec.get("start", 0), ns) for rec, ns in worst if ns > FAR * fastest]
    line = (f"- cores' distance (a cache line's round trip between the CPUs, bench/probes/core_rtt.c, "
            f"before and after each run): {fastest:.0f}-{max(seen):.0f} ns; ")
    if not far:
        return line + "no run met far cores"
    return line + (f"runs on far cores (a round trip over {FAR:g}x the fastest: cache-to-cache "
                   f"transfers several times slower, so shared-memory times are too): "
                   + ", ".join(f"{impl}" + (f" start {s}" if s else "") + f" ({ns:.0f} ns)"
                               for impl, s, ns in far))


def by_distance(by, impls, op, sizes, fmt_size, least=3):
    """A results.md line, or None: per implementation, the slowest start's time
    over the median start's among the starts on near cores (both round trips,
    before and after the start, under FAR x the fastest seen in the op's rows)
    and among those on far cores (both over); the largest over the sizes where
    a group has at least `least` starts, the sizes written by `fmt_size`.
    `by[(impl, op, size)]` are median_of_starts rows (`time_us_starts`,
    `core_rtt_starts`). A machine whose cores move between near and far gives
    two speeds to anything that passes data between them; within a group the
    distance is not what differs (as far as a probe before and after can tell:
    the cores may move during a start)."""
    rows = [by[(i, op, s)] for i in impls for s in sizes if (i, op, s) in by]
    seen = [ns for r in rows for rtt in r.get("core_rtt_starts") or () for ns in rtt or () if ns]
    if not seen or not any(len(r.get("time_us_starts") or ()) >= 2 * least for r in rows):
        return None
    limit = FAR * min(seen)
    parts = []
    for impl in impls:
        worst = {}  # group: (worst/median, size, starts)
        for s in sizes:
            r = by.get((impl, op, s))
            if not r or not r.get("core_rtt_starts"):
                continue
            groups = {"near": [], "far": []}
            for t, rtt in zip(r["time_us_starts"], r["core_rtt_starts"]):
                ns = list(rtt or ())
                if len(ns) < 2 or not all(ns):  # a probe before or after failed: neither group
                    continue
                if all(x <= limit for x in ns):
                    groups["near"].append(t)
                elif all(x > limit for x in ns):
                    groups["far"].append(t)
            for g, ts in groups.items():
                if len(ts) < least:
                    continue
                ts = sorted(ts)
                med = ts[(len(ts) - 1) // 2]
                w = ts[-1] / med if med else 0.0
                if w > worst.get(g, (0.0,))[0]:
                    worst[g] = (w, s, len(ts))
        said = [f"{g} {worst[g][0]:.2f} at {fmt_size(worst[g][1])} ({worst[g][2]} starts)"
                for g in ("near", "far") if g in worst]
        if said:
            parts.append(f"{impl} " + ", ".join(said))
    if not parts:
        return None
    return (f"- worst/median among the starts on near cores and among those on far ones (both round "
            f"trips, before and after the start, under or over {FAR:g}x the fastest; the largest over "
            f"the sizes): " + "; ".join(parts))
