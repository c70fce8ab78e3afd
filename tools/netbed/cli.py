"""The netbed command line, `python3 -m tools.netbed ...` from the repository root (see bed.py
and docs/netbed.md)."""

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

from .namespaces import (NetBedError, NetBedUnavailable, PREFIX_RE, PREFIX_STEM, all_states,
                         cleanup, cleanup_stale, list_netns, log, owner_alive, probe, read_state,
                         state_dir)
from .bed import NetBed, SHOAL_PERF, check_bed
from .link_probe import worker as probe_worker


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


def command_after_dashes(a):
    """The command after `--`, or None when there is none (said, with the usage)."""
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
    if not cmd:
        log(f"error: no command (netbed {a.command} [options] -- CMD ...)")
    return cmd or None


def cmd_run(a):
    cmd = command_after_dashes(a)
    if not cmd:
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
    cmd = command_after_dashes(a)
    if not cmd:
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
    cmd = command_after_dashes(a)
    if not cmd:
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


def cmd_probe_worker(a):
    probe_worker(a.addrs.split(","), a.seconds, a.both_ways == "1")
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

    w = sub.add_parser("_probe-worker", help=argparse.SUPPRESS)  # link_probe.py's ranks in the bed
    w.add_argument("addrs")
    w.add_argument("seconds", type=float)
    w.add_argument("both_ways", choices=("0", "1"))
    w.set_defaults(func=cmd_probe_worker)

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
