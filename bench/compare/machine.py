"""What bench/compare records of the machine: its description (CPU, memory,
kernel, peers' versions, one core's memcpy bandwidth), the load average, and
how busy the CPUs were with other work during each run."""

import os
import platform
import subprocess
import time

from bench.compare.report import info, warn


def cpu_jiffies():
    """(busy, total) jiffies over all CPUs from /proc/stat, or None."""
    try:
        v = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return sum(v) - idle, sum(v)


def children_cpu():
    import resource
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def other_cpu(cpu0, kids0, wall):
    """CPUs' worth of time used by processes other than ours during a run (noise indicator)."""
    cpu1 = cpu_jiffies()
    if not cpu0 or not cpu1 or wall <= 0:
        return None
    hz = os.sysconf("SC_CLK_TCK")
    busy = (cpu1[0] - cpu0[0]) / hz
    ours = children_cpu() - kids0
    return round(max(0.0, busy - ours) / wall, 2)


def wait_for_idle(limit, busy_max=0.15, window=2.0):
    """Wait until the CPUs are < busy_max busy over `window` s; give up after `limit` s."""
    t0 = time.monotonic()
    announced = False
    while True:
        a = cpu_jiffies()
        time.sleep(window)
        b = cpu_jiffies()
        if not a or not b or b[1] == a[1]:
            return None
        busy = (b[0] - a[0]) / (b[1] - a[1])
        waited = time.monotonic() - t0
        if busy < busy_max:
            return round(waited, 1)
        if waited >= limit:
            warn(f"CPUs still {busy:.0%} busy after waiting {waited:.0f} s; running anyway")
            return round(waited, 1)
        if not announced:
            info(f"CPUs {busy:.0%} busy; waiting up to {limit:.0f} s for them to be idle")
            announced = True


def loadavg():
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "?"


def sh(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def memcpy_bandwidth(nbytes=256 << 20, reps=5):
    """The physical reference for shared memory: one core copying 256 MiB (best of 5),
    in GB/s of bytes copied (each byte is read once and written once)."""
    try:
        import numpy as np
    except ImportError:
        return "numpy not available"
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return f"{nbytes / best / 1e9:.2f} GB/s copied by one core (256 MiB, best of {reps})"


def machine_info(root, torch_version):
    m = {}
    lscpu = {}
    for line in sh(["lscpu"]).splitlines():
        k, _, v = line.partition(":")
        lscpu[k.strip()] = v.strip()
    m["cpu"] = lscpu.get("Model name") or platform.processor() or "?"
    cores = lscpu.get("Core(s) per socket")
    sockets = lscpu.get("Socket(s)")
    m["cores"] = (f"{lscpu.get('CPU(s)', os.cpu_count())} CPUs"
                  + (f" ({sockets} socket x {cores} cores, "
                     f"{lscpu.get('Thread(s) per core', '?')} thread/core)" if cores else ""))
    if lscpu.get("Hypervisor vendor"):
        m["cores"] += f", VM ({lscpu['Hypervisor vendor']})"
    try:
        kb = next(int(line.split()[1]) for line in open("/proc/meminfo")
                  if line.startswith("MemTotal:"))
        m["memory"] = f"{kb / 1024 / 1024:.1f} GiB"
    except (OSError, StopIteration, ValueError):
        m["memory"] = "?"
    m["kernel"] = platform.release()
    osname = "?"
    try:
        for line in open("/etc/os-release"):
            if line.startswith("PRETTY_NAME="):
                osname = line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    m["os"] = osname
    m["python"] = platform.python_version()
    m["torch"] = torch_version
    ompi = sh(["mpirun", "--version"]).splitlines()
    m["openmpi"] = ompi[0] if ompi else "not available"
    m["memcpy"] = memcpy_bandwidth()
    m["loadavg"] = loadavg()
    m["git"] = sh(["git", "-C", str(root), "rev-parse", "--short", "HEAD"]) or "no commit"
    return m
