#!/usr/bin/env python3
"""netbed: several "hosts" on one machine, for multi-host tests and benchmarks.

Each host is a network namespace with one interface, `nb0`, whose other end
is a port of a Linux bridge that lives in a namespace of its own (so the
machine's own network is never touched). Every link is shaped in both
directions with a `tc tbf` qdisc (default 10 Gbit/s); a one-way delay (default
50 us) is added with `netem` where the kernel has it, and reported as not
applied where it does not. Addresses come from a private /24 that no route of
the root namespace covers, and exist only inside the bed's namespaces.

Python API (stdlib only):

    from netbed import NetBed
    with NetBed(hosts=2, rate="10gbit", delay_us=50) as bed:
        res = bed.job(["build/bin/shoal-perf", "--op", "allreduce", "--check"], per_host=2)
        res.raise_for_status()
        print(res.ranks[0].stdout)

Command line (`python3 bench/netbed ...` or `bench/netbed/netbed.py ...`):

    netbed run --hosts 2 --per-host 2 [--rate 10gbit] [--delay-us 50] -- CMD ...
    netbed check [--hosts 2 --per-host 2]      shoal-perf --check for every op
    netbed up / job / exec / down              a bed that outlives one command
    netbed cleanup [--prefix P | --all]        remove leftovers

Everything is removed on exit: on exceptions, on SIGINT/SIGTERM/SIGHUP, and,
through a small guard process that waits for its owner to go away, even when
the owner is killed with SIGKILL. See docs/netbed.md.
"""

import argparse
import ctypes
import hashlib
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

__all__ = ["NetBed", "NetBedError", "NetBedUnavailable", "JobResult", "RankResult",
           "cleanup", "parse_rate", "probe", "shoal_perf_ops"]

HERE = Path(__file__).resolve()
ROOT = HERE.parents[2]
SHOAL_PERF = ROOT / "build" / "bin" / "shoal-perf"

IFACE = "nb0"            # the host's interface, same name in every host namespace
BRIDGE = "br0"           # the bridge, in the bridge namespace
PREFIX_STEM = "netbed"   # default prefixes: netbed<pid>x<4 hex>
PREFIX_RE = re.compile(r"^[A-Za-z0-9_.]{1,40}$")
STATE_DIRS = (Path("/run/netbed"), Path(tempfile.gettempdir()) / "netbed")
ETH_OVERHEAD = 18        # Ethernet header + VLAN tag room, for the tbf bucket
BASE_PORT = 29500
HOST_QUEUE = 64 << 20    # bytes the host-side tbf may queue (it stands for a NIC's qdisc)


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


# --------------------------------------------------------------------------- jobs

class RankResult:
    def __init__(self, rank, host, local_rank, pid):
        self.rank, self.host, self.local_rank, self.pid = rank, host, local_rank, pid
        self.returncode = None
        self.ended = None             # time.monotonic() when its exit was seen
        self.killed = False           # stopped by the job runner (another rank failed, timeout)
        self._out, self._err = [], []

    @property
    def stdout(self):
        return "".join(self._out)

    @property
    def stderr(self):
        return "".join(self._err)

    def __repr__(self):
        return (f"RankResult(rank={self.rank}, host={self.host}, rc={self.returncode}"
                f"{', killed' if self.killed else ''})")


class JobResult:
    def __init__(self, argv, ranks, seconds, timed_out, timeout):
        self.argv, self.ranks, self.seconds = argv, ranks, seconds
        self.timed_out, self.timeout = timed_out, timeout

    @property
    def ok(self):
        return not self.timed_out and all(r.returncode == 0 for r in self.ranks)

    @property
    def failed(self):
        """The first rank that failed on its own (not killed by the runner), or None."""
        bad = [r for r in self.ranks if r.returncode not in (0, None) and not r.killed]
        return min(bad, key=lambda r: r.ended or float("inf")) if bad else None

    def summary(self, lines=15):
        if self.ok:
            return f"job ok: {len(self.ranks)} ranks in {self.seconds:.1f} s"
        head = (f"job timed out after {self.timeout:.0f} s" if self.timed_out
                else "job failed")
        parts = [f"{head}: {shlex.join(self.argv)}"]
        for r in self.ranks:
            state = "killed by the runner" if r.killed else f"exit {r.returncode}"
            parts.append(f"  rank {r.rank} (host {r.host}, local {r.local_rank}, pid {r.pid}): "
                         f"{state}")
        first = self.failed or next((r for r in self.ranks if r.returncode != 0), None)
        if first is not None:
            tail = (first.stdout + first.stderr).strip().splitlines()[-lines:]
            parts.append(f"  last lines of rank {first.rank}:")
            parts += [f"    {t}" for t in tail]
        return "\n".join(parts)

    def raise_for_status(self):
        if not self.ok:
            raise NetBedError(self.summary())
        return self


# --------------------------------------------------------------------------- the bed

class NetBed:
    """H hosts (network namespaces) on one bridge, shaped links; a context manager.

    hosts      number of hosts (1 .. 250)
    rate       line rate of every link, each direction: tc units ("10gbit"); 0 = unshaped
    delay_us   one-way delay added on each host's egress (netem); 0 = none. Where the
               kernel has no netem the delay is NOT applied: `delay_applied` is False and
               `delay_note` says why (a warning is printed).
    prefix     namespace names <prefix>-h0 .. -h<H-1> and <prefix>-br (default: unique)
    mtu        MTU of the bed's interfaces (default 65535: see docs/netbed.md)
    burst      tbf bucket in bytes (default: max(100 us at the rate, 2 largest frames))
    queue_ms   the switch port's tbf queue (bridge side): this many ms at the rate (default
               2) before tail drop; the host side queues up to 64 MiB, as a host's own
               qdisc would (TCP's small-queue limit keeps it far from full)
    subnet     an IPv4 /24 to use (default: picked from 10.0.0.0/8, clear of local routes)
    hostnames  give every process started in host i the host name <prefix>-h<i> (own
               UTS namespace), so that tools that look at host names see H hosts

    Not thread-safe; create, use and close it from one thread (signal handlers are
    installed only when that is the main thread).
    """

    def __init__(self, hosts=2, rate="10gbit", delay_us=50, prefix=None, mtu=65535,
                 burst=None, queue_ms=2.0, subnet=None, hostnames=True, verbose=False):
        if not 1 <= int(hosts) <= 250:
            raise ValueError("hosts must be 1 .. 250")
        self.hosts = int(hosts)
        self.rate_bps = parse_rate(rate)
        self.delay_us = float(delay_us or 0)
        if self.delay_us < 0:
            raise ValueError("delay_us must be >= 0")
        self.prefix = prefix or f"{PREFIX_STEM}{os.getpid()}x{uuid.uuid4().hex[:4]}"
        if not PREFIX_RE.match(self.prefix):
            raise ValueError(f"bad prefix {self.prefix!r}: 1-40 of [A-Za-z0-9_.]")
        if not 1280 <= int(mtu) <= 65535:
            raise ValueError("mtu must be 1280 .. 65535")
        self.mtu = int(mtu)
        frame = self.mtu + ETH_OVERHEAD
        rate_Bps = self.rate_bps / 8
        self.burst = int(burst) if burst else max(int(rate_Bps * 100e-6), 2 * frame)
        if self.burst < frame:
            raise ValueError(f"burst must be at least one frame ({frame} bytes)")
        self.queue_ms = float(queue_ms)
        # The switch port's buffer (bridge side): queue_ms at the rate, then tail drop.
        self.limit = max(int(rate_Bps * self.queue_ms / 1000), 2 * self.burst)
        # The host's own egress stands for its NIC and qdisc, which do not drop TCP's
        # traffic (TCP small queues bound what each socket leaves there): a large queue.
        self.host_limit = max(self.limit, HOST_QUEUE)
        self._subnet_req = subnet
        self.hostnames = hostnames and shutil.which("unshare") is not None
        self.verbose = verbose
        self.bridge_ns = f"{self.prefix}-br"
        self.namespaces = [f"{self.prefix}-h{i}" for i in range(self.hosts)]
        self.subnet = None
        self.addrs = []
        self.delay_applied = False
        self.delay_note = "no delay requested" if self.delay_us == 0 else "not set up yet"
        self.workdir = None
        self._created = False
        self._guard = None
        self._old_handlers = {}
        self._jobs = 0
        self._owned = True

    # ---- life cycle

    def __enter__(self):
        self.up()
        return self

    def __exit__(self, *exc):
        self.down()
        return False

    def up(self):
        if self._created:
            return self
        why = None
        for tool in ("ip", "tc"):
            if shutil.which(tool) is None:
                why = f"`{tool}` (iproute2) is not installed"
        if why is None and os.geteuid() != 0:
            why = f"network namespaces need root (euid is {os.geteuid()})"
        if why:
            raise NetBedUnavailable(why)
        cleanup_stale()
        if any(n.startswith(self.prefix + "-") for n in list_netns()):
            raise NetBedError(f"namespaces {self.prefix}-* already exist "
                              f"(netbed cleanup --prefix {self.prefix})")
        self._install_signal_handlers()
        self._created = True  # from here on, down() removes whatever <prefix>-* exists
        try:
            self.subnet = self._pick_subnet()
            hosts_ = list(self.subnet.hosts())
            self.addrs = [str(hosts_[i]) for i in range(self.hosts)]
            self.workdir = Path(tempfile.mkdtemp(prefix=f"{self.prefix}-"))
            self._write_state()
            self._start_guard()
            self._build()
        except BaseException:
            self.down()
            raise
        return self

    def down(self):
        """Remove everything (idempotent). Signals are held off while it runs."""
        blocked = STOP_SIGNALS
        is_main = threading.current_thread() is threading.main_thread()
        if is_main:
            signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
        try:
            if self._created and self._owned:
                try:
                    cleanup(self.prefix, quiet=not self.verbose)
                except NetBedError as e:
                    log(f"warning: {e}")
            self._created = False
            if self._guard is not None:
                try:
                    self._guard.stdin.close()
                    self._guard.wait(timeout=10)
                except (OSError, subprocess.TimeoutExpired):
                    self._guard.kill()
                    self._guard.wait()
                self._guard = None
            if self.workdir is not None:
                shutil.rmtree(self.workdir, ignore_errors=True)
                self.workdir = None
        finally:
            self._restore_signal_handlers()
            if is_main:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, blocked)

    close = down

    @classmethod
    def attach(cls, prefix):
        """A handle on a bed created by another process (`netbed up`), without owning it."""
        st = read_state(prefix)
        if not st:
            raise NetBedError(f"no bed {prefix!r} (no state file)")
        missing = [n for n in st["namespaces"] + [st["bridge_ns"]] if n not in list_netns()]
        if missing:
            raise NetBedError(f"bed {prefix!r} is incomplete: {missing} missing")
        bed = cls(hosts=st["hosts"], rate=f"{st['rate_bps']}bit" if st["rate_bps"] else 0,
                  delay_us=st["delay_us"], prefix=prefix, mtu=st["mtu"], burst=st["burst"],
                  queue_ms=st["queue_ms"], subnet=st["subnet"], hostnames=st["hostnames"])
        bed.subnet = ipaddress.ip_network(st["subnet"])
        bed.addrs = st["addrs"]
        bed.delay_applied, bed.delay_note = st["delay_applied"], st["delay_note"]
        bed.workdir = Path(st["workdir"])
        bed._created, bed._owned = True, False
        bed._jobs = int(time.time() * 1000) % 1000  # ports distinct from the owner's
        return bed

    def _install_signal_handlers(self):
        if threading.current_thread() is not threading.main_thread():
            return

        def on_signal(signum, _frame):
            raise SystemExit(128 + signum)  # unwinds through __exit__ / finally

        for sig in (signal.SIGTERM, signal.SIGHUP):
            try:
                old = signal.getsignal(sig)
                if old in (signal.SIG_DFL, None):
                    self._old_handlers[sig] = old
                    signal.signal(sig, on_signal)
            except (ValueError, OSError):
                pass

    def _restore_signal_handlers(self):
        for sig, old in self._old_handlers.items():
            try:
                signal.signal(sig, old)
            except (ValueError, OSError):
                pass
        self._old_handlers = {}

    def _start_guard(self):
        # Waits for EOF on stdin (this process closed it, or died), then removes the bed.
        # Its own session: a terminal's Ctrl-C does not reach it.
        self._guard = subprocess.Popen(
            [sys.executable, str(HERE), "_guard", "--prefix", self.prefix],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, close_fds=True)

    def _write_state(self):
        st = {"prefix": self.prefix, "owner_pid": os.getpid(),
              "owner_start": proc_start_time(os.getpid()), "created": time.time(),
              "hosts": self.hosts, "namespaces": self.namespaces, "bridge_ns": self.bridge_ns,
              "subnet": str(self.subnet), "addrs": self.addrs, "iface": IFACE,
              "rate_bps": self.rate_bps, "delay_us": self.delay_us, "mtu": self.mtu,
              "burst": self.burst, "limit": self.limit, "host_limit": self.host_limit,
              "queue_ms": self.queue_ms,
              "delay_applied": self.delay_applied, "delay_note": self.delay_note,
              "hostnames": self.hostnames, "workdir": str(self.workdir)}
        path = state_dir() / f"{self.prefix}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(st, indent=1) + "\n")
        os.replace(tmp, path)

    def _pick_subnet(self):
        if self._subnet_req:
            net = ipaddress.ip_network(self._subnet_req, strict=False)
            if net.version != 4 or net.prefixlen > 24:
                raise ValueError("subnet must be an IPv4 /24 or larger")
            return net
        used = []
        for args in (["-4", "route", "show", "table", "all"], ["-4", "addr", "show"]):
            for tok in sh(["ip", *args], check=False).stdout.split():
                try:
                    used.append(ipaddress.ip_network(tok, strict=False))
                except ValueError:
                    continue
        used = [u for u in used if u.prefixlen > 0]  # a default route covers everything
        seed = int(hashlib.sha256(self.prefix.encode()).hexdigest(), 16)
        for k in range(4096):
            a, b = 200 + (seed + k) % 54, (seed // 54 + k * 7) % 256
            net = ipaddress.ip_network(f"10.{a}.{b}.0/24")
            if not any(net.overlaps(u) for u in used):
                return net
        raise NetBedError("no free 10.x.y.0/24 subnet")

    def _build(self):
        ipn = lambda ns, *a: sh(["ip", "-n", ns, *a])  # noqa: E731
        sh(["ip", "netns", "add", self.bridge_ns])
        ipn(self.bridge_ns, "link", "set", "lo", "up")
        ipn(self.bridge_ns, "link", "add", BRIDGE, "type", "bridge", "stp_state", "0",
            "forward_delay", "0", "mcast_snooping", "0")
        ipn(self.bridge_ns, "link", "set", BRIDGE, "mtu", str(self.mtu), "up")
        plen = self.subnet.prefixlen
        for i, ns in enumerate(self.namespaces):
            port = f"p{i}"
            sh(["ip", "netns", "add", ns])
            ipn(ns, "link", "set", "lo", "up")
            # Created inside the bridge namespace with the peer placed straight into the
            # host's: no interface of the bed ever exists in the root namespace.
            ipn(self.bridge_ns, "link", "add", port, "mtu", str(self.mtu), "type", "veth",
                "peer", "name", IFACE, "mtu", str(self.mtu), "netns", ns)
            ipn(self.bridge_ns, "link", "set", port, "master", BRIDGE)
            ipn(self.bridge_ns, "link", "set", port, "up")
            ipn(ns, "addr", "add", f"{self.addrs[i]}/{plen}", "dev", IFACE)
            ipn(ns, "link", "set", IFACE, "up")
        self._shape()
        self._write_state()
        if self.delay_us > 0 and not self.delay_applied:
            log(f"warning: the {self.delay_us:g} us one-way delay is NOT applied: "
                f"{self.delay_note}")
        if self.verbose:
            log(self.describe_line())

    def _shape(self):
        """tbf on both ends of every link; netem delay on each host's egress if possible."""
        ok_delay = self.delay_us > 0
        note = "no delay requested"
        for i, ns in enumerate(self.namespaces):
            parent = ["root"]
            if self.delay_us > 0 and ok_delay:
                r = sh(["tc", "-n", ns, "qdisc", "add", "dev", IFACE, "root", "handle", "1:",
                        "netem", "delay", f"{self.delay_us:g}us", "limit", "100000"],
                       check=False)
                if r.returncode == 0:
                    parent = ["parent", "1:1"]
                    note = f"netem delay {self.delay_us:g}us on every host's egress"
                else:
                    ok_delay = False
                    err = (r.stderr or r.stdout).strip().splitlines()
                    err = err[-1] if err else f"exit {r.returncode}"
                    what = ("this kernel has no netem qdisc" if "unknown" in err.lower()
                            else "netem could not be set up")
                    note = (f"{what} (`tc qdisc add ... netem delay` failed: {err}); "
                            "links are rate-shaped only")
            if self.rate_bps:
                sh(["tc", "-n", ns, "qdisc", "add", "dev", IFACE, *parent, "handle", "10:",
                    "tbf", "rate", f"{self.rate_bps}bit", "burst", str(self.burst),
                    "limit", str(self.host_limit)])
                # The other direction: the bridge port's egress towards this host.
                sh(["tc", "-n", self.bridge_ns, "qdisc", "add", "dev", f"p{i}", "root",
                    "handle", "10:", "tbf", "rate", f"{self.rate_bps}bit", "burst",
                    str(self.burst), "limit", str(self.limit)])
        if self.delay_us > 0 and not ok_delay:
            # Some hosts may have got netem before a failure on another: none keeps it.
            for ns in self.namespaces:
                r = sh(["tc", "-n", ns, "qdisc", "show", "dev", IFACE], check=False)
                if "netem" in r.stdout:
                    raise NetBedError("netem worked on some hosts and not on others")
        self.delay_applied = self.delay_us > 0 and ok_delay
        self.delay_note = note

    # ---- description

    @property
    def link_GBps(self):
        """Line rate of one link direction in GB/s (1e9 bytes/s), 0 if unshaped."""
        return self.rate_bps / 8e9

    def describe(self):
        return {"prefix": self.prefix, "hosts": self.hosts, "namespaces": self.namespaces,
                "bridge_ns": self.bridge_ns, "subnet": str(self.subnet), "addrs": self.addrs,
                "iface": IFACE, "rate_bps": self.rate_bps, "rate": fmt_rate(self.rate_bps),
                "link_GBps": self.link_GBps, "mtu": self.mtu, "burst": self.burst,
                "limit": self.limit, "host_limit": self.host_limit, "queue_ms": self.queue_ms,
                "delay_us": self.delay_us,
                "delay_applied": self.delay_applied, "delay_note": self.delay_note}

    def describe_line(self):
        d = self.describe()
        delay = (f"one-way delay {self.delay_us:g} us (netem)" if self.delay_applied
                 else "no added delay" if self.delay_us == 0
                 else f"one-way delay {self.delay_us:g} us requested, NOT applied (no netem)")
        shaping = (f"{d['rate']} = {d['link_GBps']:g} GB/s each way (tc tbf, burst "
                   f"{self.burst} B, queue {self.limit} B at the switch port, "
                   f"{self.host_limit} B at the host)" if self.rate_bps else "unshaped")
        return (f"{self.hosts} hosts {', '.join(f'{n}={a}' for n, a in zip(self.namespaces, self.addrs))}"
                f" on bridge {self.bridge_ns}/{BRIDGE}, {self.subnet}; links {shaping}; "
                f"MTU {self.mtu}; {delay}")

    def qdiscs(self):
        """`tc -s qdisc show` of every shaped interface (for logs)."""
        out = []
        for i, ns in enumerate(self.namespaces):
            out.append(f"# {ns} {IFACE}\n" + sh(["tc", "-s", "-n", ns, "qdisc", "show", "dev",
                                                  IFACE], check=False).stdout)
            out.append(f"# {self.bridge_ns} p{i}\n" + sh(["tc", "-s", "-n", self.bridge_ns,
                                                          "qdisc", "show", "dev", f"p{i}"],
                                                         check=False).stdout)
        return "".join(out)

    # ---- running things

    def _check_up(self):
        if not self._created:
            raise NetBedError("the bed is not up")

    def wrap(self, host, argv):
        """The argv that runs argv inside host's namespace (and host name)."""
        self._check_up()
        ns = self.namespaces[host]
        if not self.hostnames:
            return ["ip", "netns", "exec", ns, *map(str, argv)]
        return ["ip", "netns", "exec", ns, "unshare", "--uts", "--", "sh", "-c",
                'echo "$0" > /proc/sys/kernel/hostname && exec "$@"', ns, *map(str, argv)]

    def run(self, host, argv, env=None, die_with_parent=True, **popen_kw):
        """Start argv in host's namespace; returns the Popen.

        The process gets its own process group and, with die_with_parent, is SIGKILLed
        when the thread that started it exits. env: the full environment (default: ours)."""
        preexec = _die_with_parent if die_with_parent else _own_group
        return subprocess.Popen(self.wrap(host, argv), env=env, preexec_fn=preexec,
                                **popen_kw)

    def exec(self, host, argv, timeout=60, env=None):
        """Run a short command in host's namespace; returns CompletedProcess (text)."""
        return subprocess.run(self.wrap(host, argv), capture_output=True, text=True,
                              timeout=timeout, env=env, stdin=subprocess.DEVNULL)

    def next_port(self):
        self._jobs += 1
        return BASE_PORT + (10 * self._jobs) % 20000

    def rank_env(self, rank, world, host, local_rank, per_host, master_port, env=None):
        e = dict(os.environ if env is None else env)
        e.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(local_rank),
                 LOCAL_WORLD_SIZE=str(per_host), GROUP_RANK=str(host), NODE_RANK=str(host),
                 MASTER_ADDR=self.addrs[0], MASTER_PORT=str(master_port),
                 SHOAL_ADVERTISE_ADDR=self.addrs[host])
        e.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // max(1, world))))
        return e

    def job(self, argv, per_host=1, env=None, timeout=300.0, master_port=None, cwd=None,
            on_line=None, grace=3.0, hosts=None):
        """Run hosts x per_host ranks of argv; wait for all; return a JobResult.

        Rank r = host * per_host + local_rank runs on host (namespace) r // per_host with
        RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK (= NODE_RANK),
        MASTER_ADDR (host 0's bed address), MASTER_PORT and SHOAL_ADVERTISE_ADDR (its
        host's bed address) set on top of env (default: this process's environment).
        argv may be a function (rank) -> argv. When a rank fails, the others get SIGTERM,
        then SIGKILL after `grace` s; past `timeout` s every rank is killed.
        on_line(rank, stream, line), if given, sees every output line as it comes (from
        reader threads, one call at a time)."""
        self._check_up()
        nhosts = self.hosts if hosts is None else int(hosts)
        world = nhosts * per_host
        port = master_port or self.next_port()
        lock = threading.Lock()
        ranks, procs, readers = [], [], []

        def reader(res, stream, pipe, sink):
            for line in pipe:
                sink.append(line)
                if on_line is not None:
                    with lock:
                        on_line(res.rank, stream, line)
            pipe.close()

        t0 = time.monotonic()
        timed_out = False
        # A stop signal (Ctrl-C, SIGTERM) that lands while a rank is being started could
        # leave a process this job does not know of, which nothing would stop: the
        # signals wait until the rank is on the lists (the child unblocks them).
        hold = threading.current_thread() is threading.main_thread()
        try:
            for rank in range(world):
                host, local = divmod(rank, per_host)
                cmd = argv(rank) if callable(argv) else argv
                rank_env = self.rank_env(rank, world, host, local, per_host, port, env)
                if hold:
                    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
                try:
                    p = self.run(host, cmd, env=rank_env, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 errors="replace", cwd=cwd)
                    res = RankResult(rank, host, local, p.pid)
                    ranks.append(res)
                    procs.append(p)
                finally:
                    if hold:
                        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
                for stream, pipe, sink in (("stdout", p.stdout, res._out),
                                           ("stderr", p.stderr, res._err)):
                    t = threading.Thread(target=reader, args=(res, stream, pipe, sink),
                                         daemon=True)
                    t.start()
                    readers.append(t)
            deadline = t0 + timeout
            failed = False
            while True:
                running = 0
                for res, p in zip(ranks, procs):
                    if res.returncode is None:
                        rc = p.poll()
                        if rc is None:
                            running += 1
                        else:
                            res.returncode, res.ended = rc, time.monotonic()
                            failed = failed or rc != 0
                if not running:
                    break
                if failed or time.monotonic() > deadline:
                    timed_out = not failed
                    self._stop(ranks, procs, grace)
                    break
                time.sleep(0.02)  # polling for exits
        except BaseException:
            self._stop(ranks, procs, 0)
            raise
        finally:
            for res, p in zip(ranks, procs):
                if res.returncode is None:
                    res.returncode, res.ended = p.wait(), time.monotonic()
            for t in readers:
                t.join(timeout=5)
        return JobResult(argv if not callable(argv) else ["<per-rank argv>"], ranks,
                         time.monotonic() - t0, timed_out, timeout)

    @staticmethod
    def _stop(ranks, procs, grace):
        """SIGTERM the process group of every rank still running, SIGKILL after grace s."""
        live = [(r, p) for r, p in zip(ranks, procs) if p.poll() is None]
        for r, p in live:
            r.killed = True
            try:
                os.killpg(p.pid, signal.SIGTERM if grace > 0 else signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        for r, p in live:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            r.returncode, r.ended = p.wait(), time.monotonic()

    # ---- Open MPI across the bed

    def mpi_files(self, slots):
        """Write a hostfile (bed addresses, `slots` each) and an rsh agent for mpirun.

        The agent is what Open MPI runs instead of ssh: `AGENT [options] HOST CMD...`; it
        runs CMD with sh inside HOST's namespace. Returns (hostfile, agent) paths."""
        self._check_up()
        hostfile = self.workdir / "hostfile"
        hostfile.write_text("".join(f"{a} slots={slots}\n" for a in self.addrs))
        agent = self.workdir / "rsh-agent"
        cases = "".join(f"  {a}|{n}) ns={n} ;;\n" for a, n in zip(self.addrs, self.namespaces))
        uts = ('exec ip netns exec "$ns" unshare --uts -- sh -c '
               '"echo $ns > /proc/sys/kernel/hostname; $*"' if self.hostnames
               else 'exec ip netns exec "$ns" sh -c "$*"')
        agent.write_text(
            "#!/bin/sh\n"
            "# netbed: Open MPI's plm_rsh_agent for this bed (written by netbed.py).\n"
            "# Called like ssh: AGENT [options] HOST COMMAND...; runs COMMAND with sh in\n"
            "# the network namespace of HOST (a bed address or namespace name).\n"
            "while [ $# -gt 0 ]; do\n"
            "  case \"$1\" in\n"
            "    -[bcDEeFIiJLlmOoPpQRSWw]) shift 2 ;;\n"
            "    -*) shift ;;\n"
            "    *) break ;;\n"
            "  esac\n"
            "done\n"
            "host=$1; shift\n"
            "case \"$host\" in\n"
            f"{cases}"
            "  *) echo \"netbed rsh agent: unknown host $host\" >&2; exit 255 ;;\n"
            "esac\n"
            f"{uts}\n")
        agent.chmod(0o755)
        return hostfile, agent

    def oversubscribed(self, per_host):
        """More ranks on the bed than this machine has cores (every host shares them)."""
        return self.hosts * per_host > (os.cpu_count() or 1)

    def mpirun_argv(self, per_host, mpirun="mpirun", extra=(), yield_when_idle=None):
        """mpirun across the bed over TCP only: run it with run(0, ...) (host 0).

        ranks 0 .. per_host-1 land on host 0, the next per_host on host 1, ...
        yield_when_idle (default: when the bed is oversubscribed): `mpi_yield_when_idle 1`,
        which Open MPI sets by itself on a node it knows to be oversubscribed; here each
        host has `per_host` slots, so it cannot know that all hosts share the same cores."""
        hostfile, agent = self.mpi_files(per_host)
        net = str(self.subnet)
        argv = [mpirun, "--hostfile", str(hostfile), "-np", str(self.hosts * per_host),
                "--map-by", "slot", "--bind-to", "none",
                "--mca", "plm_rsh_agent", str(agent), "--mca", "plm_rsh_no_tree_spawn", "1",
                "--mca", "oob_tcp_if_include", net,
                "--mca", "pml", "ob1", "--mca", "btl", "tcp,self",
                "--mca", "btl_tcp_if_include", net]
        if self.oversubscribed(per_host) if yield_when_idle is None else yield_when_idle:
            argv += ["--mca", "mpi_yield_when_idle", "1"]
        if os.geteuid() == 0:
            argv.append("--allow-run-as-root")
        return argv + list(extra)


# --------------------------------------------------------------------------- shoal-perf

def shoal_perf_ops(exe=SHOAL_PERF):
    """The ops `shoal-perf --help` lists."""
    r = sh([str(exe), "--help"], check=False)
    m = re.search(r"--op TEXT:\{([^}]*)\}", r.stdout)
    if not m:
        raise NetBedError(f"cannot read the op list from `{exe} --help`: {r.stdout[-300:]}")
    return [o.strip() for o in m.group(1).split(",") if o.strip()]


def perf_sizes(op, world):
    """shoal-perf -b/-e/-f covering 1 element up to > 1 segment with odd counts.

    Per-rank-block ops get 4 * world bytes as the smallest size so that every block
    holds 1, 3, 9, ... elements; the largest sizes span several 1 MiB segments."""
    blocked = op in ("allgather", "reduce_scatter", "alltoall", "gather", "scatter")
    lo = 4 * world if blocked else 4
    hi = lo * 3 ** 12 if not blocked else lo * 3 ** 11
    return ["-b", str(lo), "-e", str(hi), "-f", "3"]


def check_bed(bed, per_host, exe=SHOAL_PERF, ops=None, timeout=120.0, out=print):
    """shoal-perf --check for every op across the bed; returns the list of failures."""
    ops = ops or shoal_perf_ops(exe)
    world = bed.hosts * per_host
    failures = []
    for op in ops:
        extra = []
        if op in ("broadcast", "reduce", "gather", "scatter"):
            extra = ["--root", str(world - 1)]  # a root on the last host
        argv = [str(exe), "--op", op, *perf_sizes(op, world), "--iters", "3", "--warmup", "1",
                "--check", "--format", "json", *extra]
        res = bed.job(argv, per_host=per_host, timeout=timeout)
        rows = [json.loads(line) for line in res.ranks[0].stdout.splitlines()
                if line.startswith("{")]
        wrong = sum(int(r.get("wrong", 0)) for r in rows)
        if not res.ok or not rows or wrong:
            why = (res.summary() if not res.ok else "no rows" if not rows
                   else f"{wrong} wrong elements")
            failures.append((op, why))
            out(f"FAIL {op:15s} {why}")
        else:
            out(f"ok   {op:15s} {len(rows):2d} sizes {rows[0]['bytes']} .. {rows[-1]['bytes']} B"
                f" ({rows[0]['count']} .. {rows[-1]['count']} elements), 0 wrong, "
                f"{res.seconds:.1f} s")
    return failures


# --------------------------------------------------------------------------- CLI

def add_bed_options(p):
    p.add_argument("--hosts", type=int, default=2, help="hosts (namespaces), default 2")
    p.add_argument("--rate", default="10gbit",
                   help="line rate of every link, each way, tc units (default 10gbit; 0 = unshaped)")
    p.add_argument("--delay-us", type=float, default=50.0,
                   help="one-way delay in us, netem (default 50; not applied without netem)")
    p.add_argument("--mtu", type=int, default=65535, help="MTU of the bed (default 65535)")
    p.add_argument("--burst", type=int, default=None, help="tbf bucket in bytes (default: auto)")
    p.add_argument("--queue-ms", type=float, default=2.0,
                   help="tbf queue length in ms at the rate (default 2)")
    p.add_argument("--prefix", default=None, help="namespace name prefix (default: unique)")
    p.add_argument("--subnet", default=None, help="IPv4 /24 to use (default: a free 10.x.y.0/24)")


def bed_from_args(a, verbose=True):
    return NetBed(hosts=a.hosts, rate=a.rate, delay_us=a.delay_us, prefix=a.prefix, mtu=a.mtu,
                  burst=a.burst, queue_ms=a.queue_ms, subnet=a.subnet, verbose=verbose)


def echo_lines(only_rank0_stdout=False):
    """on_line for the CLI: rank 0's stdout raw (or every line as '[rank] ...')."""
    def on_line(rank, stream, line):
        if only_rank0_stdout:
            if rank == 0 and stream == "stdout":
                sys.stdout.write(line)
                sys.stdout.flush()
            else:
                sys.stderr.write(f"[{rank}] {line}")
            return
        f = sys.stdout if stream == "stdout" else sys.stderr
        f.write(f"[{rank}]: {line}")
        f.flush()
    return on_line


def strip_dashes(cmd):
    return cmd[1:] if cmd and cmd[0] == "--" else cmd


def cmd_run(a):
    cmd = strip_dashes(a.cmd)
    if not cmd:
        log("error: no command (netbed run [options] -- CMD ...)")
        return 2
    with bed_from_args(a) as bed:
        res = bed.job(cmd, per_host=a.per_host, timeout=a.timeout,
                      on_line=echo_lines(a.rank0_stdout))
        if not res.ok:
            log(res.summary())
            return (res.failed.returncode if res.failed else 124) or 1
        log(res.summary())
        return 0


def cmd_check(a):
    exe = Path(a.shoal_perf)
    if not exe.exists():
        log(f"error: {exe} not found (build shoal-perf first)")
        return 2
    with bed_from_args(a) as bed:
        failures = check_bed(bed, a.per_host, exe=exe, timeout=a.timeout,
                             ops=a.ops.split(",") if a.ops else None)
    if failures:
        log(f"{len(failures)} op(s) failed: {', '.join(op for op, _ in failures)}")
        return 1
    log("every op correct on the bed")
    return 0


def cmd_up(a):
    bed = bed_from_args(a, verbose=False)
    bed.up()
    # Hand the bed over: no guard (it would remove the bed when we exit); `down` removes it.
    if bed._guard is not None:
        bed._guard.kill()
        bed._guard.wait()
        bed._guard = None
    st = read_state(bed.prefix)
    st["owner_pid"], st["owner_start"] = None, None
    st["persistent"] = True  # kept until `netbed down` (or `cleanup --prefix`)
    (state_dir() / f"{bed.prefix}.json").write_text(json.dumps(st, indent=1) + "\n")
    bed._restore_signal_handlers()
    print(json.dumps(bed.describe()))
    return 0


def cmd_down(a):
    cleanup(a.prefix)
    return 0


def cmd_job(a):
    cmd = strip_dashes(a.cmd)
    if not cmd:
        log("error: no command")
        return 2
    bed = NetBed.attach(a.prefix)
    forward_terminating_signals()
    res = bed.job(cmd, per_host=a.per_host, timeout=a.timeout,
                  on_line=echo_lines(a.rank0_stdout))
    if not res.ok:
        log(res.summary())
        return (res.failed.returncode if res.failed else 124) or 1
    return 0


def cmd_exec(a):
    cmd = strip_dashes(a.cmd)
    if not cmd:
        log("error: no command")
        return 2
    bed = NetBed.attach(a.prefix)
    if cmd[0] == "mpirun" and a.mpi_per_host:
        cmd = bed.mpirun_argv(a.mpi_per_host) + cmd[1:]
    forward_terminating_signals()
    p = bed.run(a.host, cmd)
    try:
        return p.wait(timeout=a.timeout)
    except subprocess.TimeoutExpired:
        log(f"timed out after {a.timeout:g} s: {shlex.join(cmd)}")
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        return 124
    except BaseException:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        raise


def forward_terminating_signals():
    def on_signal(signum, _frame):
        raise SystemExit(128 + signum)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)


def cmd_cleanup(a):
    if a.prefix:
        removed = cleanup(a.prefix)
    elif a.all:
        removed = []
        for prefix in all_states():
            if PREFIX_RE.match(prefix):
                removed += cleanup(prefix)
        stems = {n.rsplit("-", 1)[0] for n in list_netns()
                 if n.startswith(PREFIX_STEM) and re.fullmatch(r".*-(h\d+|br)", n)}
        for prefix in stems:
            removed += cleanup(prefix)
    else:
        removed = cleanup_stale(quiet=False)
    print(f"netbed: removed {len(removed)} namespace(s)")
    return 0


def cmd_guard(a):
    # Blocks until the owner closes our stdin or dies, then removes what is left.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        sys.stdin.buffer.read()
    except OSError:
        pass
    try:
        cleanup(a.prefix, quiet=True)
    except NetBedError:
        return 1
    return 0


def cmd_info(a):
    why = probe()
    print(f"namespaces: {'available' if why is None else 'NOT available: ' + why}")
    if why is None:
        with NetBed(hosts=2, rate="10gbit", delay_us=a.delay_us) as bed:
            print(f"bed: {bed.describe_line()}")
            print(f"delay: {'applied' if bed.delay_applied else 'NOT applied'} "
                  f"({bed.delay_note})")
    for prefix, st in all_states().items():
        print(f"bed {prefix}: owner {st.get('owner_pid')} "
              f"({'alive' if owner_alive(st) else 'gone'})")
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(prog="netbed", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="build a bed, run H x L ranks of a command, remove the bed")
    add_bed_options(r)
    r.add_argument("--per-host", type=int, default=1, help="ranks per host (default 1)")
    r.add_argument("--timeout", type=float, default=600.0, help="seconds (default 600)")
    r.add_argument("--rank0-stdout", action="store_true",
                   help="only rank 0's stdout to stdout, unprefixed; the rest to stderr")
    r.add_argument("cmd", nargs=argparse.REMAINDER)
    r.set_defaults(func=cmd_run)

    c = sub.add_parser("check", help="shoal-perf --check for every op on the bed")
    add_bed_options(c)
    c.add_argument("--per-host", type=int, default=2, help="ranks per host (default 2)")
    c.add_argument("--timeout", type=float, default=120.0, help="seconds per op (default 120)")
    c.add_argument("--shoal-perf", default=str(SHOAL_PERF))
    c.add_argument("--ops", default=None, help="comma list (default: every op of shoal-perf)")
    c.set_defaults(func=cmd_check)

    u = sub.add_parser("up", help="build a bed and leave it (remove it with `down`)")
    add_bed_options(u)
    u.set_defaults(func=cmd_up)

    d = sub.add_parser("down", help="remove a bed made by `up`")
    d.add_argument("--prefix", required=True)
    d.set_defaults(func=cmd_down)

    j = sub.add_parser("job", help="run H x L ranks of a command on an existing bed")
    j.add_argument("--prefix", required=True)
    j.add_argument("--per-host", type=int, default=1)
    j.add_argument("--timeout", type=float, default=600.0)
    j.add_argument("--rank0-stdout", action="store_true",
                   help="only rank 0's stdout to stdout, unprefixed; the rest to stderr")
    j.add_argument("cmd", nargs=argparse.REMAINDER)
    j.set_defaults(func=cmd_job)

    e = sub.add_parser("exec", help="run one command in one host of an existing bed")
    e.add_argument("--prefix", required=True)
    e.add_argument("--host", type=int, default=0)
    e.add_argument("--timeout", type=float, default=600.0)
    e.add_argument("--mpi-per-host", type=int, default=0,
                   help="with a command `mpirun ARGS`: prepend the bed's mpirun options "
                        "(hostfile with this many slots per host, rsh agent, TCP only)")
    e.add_argument("cmd", nargs=argparse.REMAINDER)
    e.set_defaults(func=cmd_exec)

    k = sub.add_parser("cleanup", help="remove leftover beds")
    k.add_argument("--prefix", default=None, help="remove <prefix>-* namespaces")
    k.add_argument("--all", action="store_true",
                   help="every bed with a state file, and every netbed*-h<N>/-br namespace")
    k.set_defaults(func=cmd_cleanup)

    i = sub.add_parser("info", help="can a bed be built here? is the delay applied?")
    i.add_argument("--delay-us", type=float, default=50.0)
    i.set_defaults(func=cmd_info)

    g = sub.add_parser("_guard", help=argparse.SUPPRESS)
    g.add_argument("--prefix", required=True)
    g.set_defaults(func=cmd_guard)

    a = p.parse_args(argv)
    try:
        return a.func(a)
    except NetBedUnavailable as ex:
        log(f"cannot build a bed here: {ex.reason}")
        return 3
    except (NetBedError, ValueError) as ex:
        log(f"error: {ex}")
        return 1
    except KeyboardInterrupt:
        log("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
