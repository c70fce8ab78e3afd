"""netbed: several "hosts" on one machine, for multi-host tests and benchmarks.

Each host is a network namespace with one interface, `nb0`, whose other end
is a port of a Linux bridge that lives in a namespace of its own (so the
machine's own network is never touched). Every link is shaped in both
directions with a `tc tbf` qdisc (default 10 Gbit/s); a one-way delay (default
50 us) is added with `netem` where the kernel has it, and reported as not
applied where it does not. Addresses come from a private /24 that no route of
the root namespace covers, and exist only inside the bed's namespaces.

Python API (stdlib only), from the repository root:

    from tools.netbed import NetBed
    with NetBed(hosts=2, rate="10gbit", delay_us=50) as bed:
        res = bed.job(["build/bin/shoal-perf", "--op", "allreduce", "--check"], per_host=2)
        res.raise_for_status()
        print(res.ranks[0].stdout)

Command line (`python3 -m tools.netbed ...`, cli.py):

    netbed run --hosts 2 --per-host 2 [--rate 10gbit] [--delay-us 50] -- CMD ...
    netbed check [--hosts 2 --per-host 2]      shoal-perf --check for every op
    netbed up / job / exec / down              a bed that outlives one command
    netbed cleanup [--prefix P | --all]        remove leftovers

Everything is removed on exit: on exceptions, on SIGINT/SIGTERM/SIGHUP, and,
through a small guard process that waits for its owner to go away, even when
the owner is killed with SIGKILL. See docs/netbed.md.
"""

import hashlib
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from .namespaces import (NetBedError, NetBedUnavailable, PREFIX_RE, PREFIX_STEM, STOP_SIGNALS,
                         _die_with_parent, _own_group, cleanup, cleanup_stale, fmt_rate,
                         list_netns, log, parse_rate, probe, proc_start_time, read_state, sh,
                         state_dir)
from .results import JobResult, RankResult

__all__ = ["NetBed", "NetBedError", "NetBedUnavailable", "JobResult", "RankResult",
           "cleanup", "parse_rate", "probe", "shoal_perf_ops"]

ROOT = Path(__file__).resolve().parents[2]
# The one command line of the bed; run from ROOT, where `tools` is a package.
CLI = [sys.executable, "-m", "tools.netbed"]
SHOAL_PERF = ROOT / "build" / "bin" / "shoal-perf"

IFACE = "nb0"            # the host's interface, same name in every host namespace
BRIDGE = "br0"           # the bridge, in the bridge namespace
ETH_OVERHEAD = 18        # Ethernet header + VLAN tag room, for the tbf bucket
BASE_PORT = 29500
HOST_QUEUE = 64 << 20    # bytes the host-side tbf may queue (it stands for a NIC's qdisc)


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
            CLI + ["_guard", "--prefix", self.prefix], cwd=ROOT,
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
            "# netbed: Open MPI's plm_rsh_agent for this bed (written by tools/netbed/bed.py).\n"
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
