"""What a bed stands on: short commands (ip, tc), network namespaces and the
processes in them, the state files that let a later process find a bed, and
cleanup (bed.py builds beds on these)."""

import ctypes
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

PREFIX_STEM = "netbed"   # default prefixes: netbed<pid>x<4 hex>
PREFIX_RE = re.compile(r"^[A-Za-z0-9_.]{1,40}$")
STATE_DIRS = (Path("/run/netbed"), Path(tempfile.gettempdir()) / "netbed")


class NetBedError(RuntimeError):
    """Something went wrong while building or using a bed."""


class NetBedUnavailable(NetBedError):
    """Namespaces (or the tools) are not available here; `reason` says which."""

    def __init__(self, reason):
        super().__init__(reason)
        self.reason = reason


def log(msg):
    print(f"netbed: {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- helpers

def sh(argv, check=True, timeout=30):
    """Run a short command (ip, tc); return CompletedProcess; raise NetBedError if check."""
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        if check:
            raise NetBedError(f"{shlex.join(argv)}: {e}") from None
        return subprocess.CompletedProcess(argv, 127, "", str(e))
    if check and r.returncode != 0:
        raise NetBedError(f"{shlex.join(argv)} failed ({r.returncode}): "
                          f"{(r.stderr or r.stdout).strip()}")
    return r


def parse_rate(text):
    """'10gbit' -> 10_000_000_000 (bits/s; SI units as in tc). 0/'none'/'off' -> 0 (unshaped)."""
    s = str(text).strip().lower()
    if s in ("0", "none", "off", "unlimited"):
        return 0
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*(bit|kbit|mbit|gbit|tbit)?", s)
    if not m:
        raise ValueError(f"bad rate {text!r}: use e.g. 10gbit, 2.5gbit, 800mbit (or 0 = unshaped)")
    mult = {None: 1, "bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}[m.group(2)]
    bps = int(round(float(m.group(1)) * mult))
    if bps < 8000:
        raise ValueError(f"rate {text!r} is too low")
    return bps


def fmt_rate(bps):
    if bps == 0:
        return "unshaped"
    for unit, mult in (("Tbit/s", 10**12), ("Gbit/s", 10**9), ("Mbit/s", 10**6), ("kbit/s", 10**3)):
        if bps >= mult:
            return f"{bps / mult:g} {unit}"
    return f"{bps} bit/s"


def proc_start_time(pid):
    """The start time of pid (clock ticks since boot), or None if it does not exist."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def list_netns():
    r = sh(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


def netns_pids(ns):
    r = sh(["ip", "netns", "pids", ns], check=False)
    return [int(p) for p in r.stdout.split() if p.isdigit()]


try:  # loaded here, not in the forked child
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):
    _prctl = None


# Signals that stop an owner; held off while a rank is being started (see job()).
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


def _die_with_parent():
    """preexec_fn: own process group, and SIGKILL when the parent (thread) dies."""
    os.setpgid(0, 0)
    if _prctl is not None:
        _prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # job() holds them off in the parent


def _own_group():
    """preexec_fn: own process group only."""
    os.setpgid(0, 0)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def probe():
    """Why a bed cannot be built here, or None if it probably can (root, ip, tc, netns)."""
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` (iproute2) is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root (euid is %d)" % os.geteuid()
    name = f"{PREFIX_STEM}probe{os.getpid()}x{uuid.uuid4().hex[:4]}"
    r = sh(["ip", "netns", "add", name], check=False)
    if r.returncode != 0:
        return f"`ip netns add` failed: {(r.stderr or r.stdout).strip()}"
    try:
        r = sh(["ip", "-n", name, "link", "add", "vprobe0", "type", "veth", "peer", "name",
                "vprobe1"], check=False)
        if r.returncode != 0:
            return f"cannot create a veth pair: {(r.stderr or r.stdout).strip()}"
        r = sh(["ip", "-n", name, "link", "add", "bprobe", "type", "bridge"], check=False)
        if r.returncode != 0:
            return f"cannot create a bridge: {(r.stderr or r.stdout).strip()}"
    finally:
        sh(["ip", "netns", "del", name], check=False)
    return None


# --------------------------------------------------------------------------- state files

def state_dir():
    for d in STATE_DIRS:
        try:
            d.mkdir(parents=True, exist_ok=True)
            if os.access(d, os.W_OK):
                return d
        except OSError:
            continue
    raise NetBedError("no writable state directory (/run/netbed, $TMPDIR/netbed)")


def read_state(prefix):
    for d in STATE_DIRS:
        p = d / f"{prefix}.json"
        try:
            return json.loads(p.read_text())
        except (OSError, ValueError):
            continue
    return None


def all_states():
    out = {}
    for d in STATE_DIRS:
        for p in sorted(d.glob("*.json")) if d.is_dir() else []:
            try:
                out.setdefault(p.stem, json.loads(p.read_text()))
            except (OSError, ValueError):
                out.setdefault(p.stem, {})
    return out


def owner_alive(state):
    pid, start = state.get("owner_pid"), state.get("owner_start")
    return bool(pid) and proc_start_time(pid) is not None and proc_start_time(pid) == start


def cleanup(prefix, quiet=False):
    """Remove every namespace named <prefix>-*, after killing the processes in them.

    Returns the namespaces removed. Touches nothing outside those namespaces."""
    if not PREFIX_RE.match(prefix or ""):
        raise NetBedError(f"bad prefix {prefix!r}")
    ours = [n for n in list_netns() if n.startswith(prefix + "-")]
    # Hosts first, the bridge last (deleting a host takes its veth pair along).
    ours.sort(key=lambda n: n.endswith("-br"))
    for ns in ours:
        for pid in netns_pids(ns):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    deadline = time.monotonic() + 5.0
    for ns in ours:
        while netns_pids(ns) and time.monotonic() < deadline:
            time.sleep(0.02)  # polling until the killed processes are gone
        sh(["ip", "netns", "del", ns], check=False)
    st = read_state(prefix) or {}
    work = Path(st.get("workdir") or "/nonexistent")
    if work.name.startswith(prefix + "-") and work.parent == Path(tempfile.gettempdir()):
        shutil.rmtree(work, ignore_errors=True)  # hostfile, rsh agent
    for d in STATE_DIRS:
        try:
            (d / f"{prefix}.json").unlink()
        except OSError:
            pass
    left = [n for n in list_netns() if n.startswith(prefix + "-")]
    if left:
        raise NetBedError(f"could not remove namespaces {left}")
    if ours and not quiet:
        log(f"removed {', '.join(ours)}")
    return ours


def cleanup_stale(quiet=True):
    """Remove the beds whose owner process is gone (left by a crash or SIGKILL)."""
    removed = []
    for prefix, st in all_states().items():
        if st and (owner_alive(st) or st.get("persistent")):
            continue
        if PREFIX_RE.match(prefix):
            removed += cleanup(prefix, quiet=quiet)
    return removed
