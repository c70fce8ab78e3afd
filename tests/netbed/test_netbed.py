"""The net bed (tools/netbed): two "hosts" as network namespaces on a bridge, shaped links.

- every collective shoal-perf offers, with --check, on 2 hosts x 2 ranks (odd counts
  from 1 element to several 1 MiB segments; rooted ones rooted on the second host);
- the shoal torch backend across the bed (all_reduce, all_gather, broadcast);
- the bed itself: what it creates, that traffic crosses the shaped links, that the
  shaper holds the line rate, that the TCP probe sees the shaped rate, that the root
  namespace is left alone, that the delay is reported as it is, and that everything is
  removed on exit, on an exception, on SIGTERM and when the owner is SIGKILLed;
- the job runner: environment of each rank, a failing rank stops the job, timeouts.

Skipped (with the reason) where namespaces cannot be created.
"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO, SHOAL_PERF, assert_every_rank, root_network_state
from tools import netbed
from tools.netbed.link_probe import tcp_probe

# The bed's one command line, run where `tools` is a package (subprocess.run(..., cwd=REPO)).
NETBED_CLI = [sys.executable, "-m", "tools.netbed"]
PER_HOST = 2

try:
    OPS = netbed.shoal_perf_ops(SHOAL_PERF)
except (netbed.NetBedError, OSError):  # no binary yet: the shoal_perf fixture fails the tests
    OPS = ["allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "alltoall",
           "gather", "scatter", "barrier", "sendrecv"]


def wait_for(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)  # polling


def tc_sent_bytes(ns, dev):
    r = subprocess.run(["tc", "-s", "-n", ns, "qdisc", "show", "dev", dev], capture_output=True,
                       text=True, timeout=20)
    for line in r.stdout.splitlines():
        parts = line.split()
        if parts[:1] == ["Sent"]:
            return int(parts[1])
    raise AssertionError(f"no qdisc counters on {ns}/{dev}: {r.stdout!r}")


def perf_rows(res):
    res.raise_for_status()
    return [json.loads(line) for line in res.ranks[0].stdout.splitlines()
            if line.startswith("{")]


# --------------------------------------------------------------------------- collectives

@pytest.mark.parametrize("op", OPS)
def test_every_collective_on_two_hosts(bed, shoal_perf, op):
    world = bed.hosts * PER_HOST
    extra = ["--root", str(world - 1)] if op in ("broadcast", "reduce", "gather", "scatter") else []
    argv = [str(shoal_perf), "--op", op, *netbed.perf_sizes(op, world), "--iters", "2",
            "--warmup", "1", "--check", "--format", "json", *extra]
    rows = perf_rows(bed.job(argv, per_host=PER_HOST, timeout=90))
    assert rows, "shoal-perf printed no rows"
    assert all(r["np"] == world for r in rows)
    assert sum(r["wrong"] for r in rows) == 0, [r for r in rows if r["wrong"]]
    if op != "barrier":
        counts = [r["count"] for r in rows]
        # One element (per block) up to more than one 1 MiB pipelining segment, odd counts.
        assert min(counts) in (1, world), counts
        assert max(r["bytes"] for r in rows) > 1 << 20
        assert all(c % 2 == 1 for c in counts) or all((c // world) % 2 == 1 for c in counts)


@pytest.mark.parametrize("dtype,redop", [("int32", "max"), ("bfloat16", "sum"),
                                         ("float64", "prod"), ("int64", "bxor")])
def test_allreduce_dtypes_on_two_hosts(bed, shoal_perf, dtype, redop):
    argv = [str(shoal_perf), "--op", "allreduce", "--dtype", dtype, "--redop", redop,
            "-b", "8", "-e", "3M", "-f", "7", "--iters", "1", "--warmup", "0", "--check",
            "--format", "json"]
    rows = perf_rows(bed.job(argv, per_host=PER_HOST, timeout=60))
    assert rows and sum(r["wrong"] for r in rows) == 0, rows


def test_torch_backend_on_two_hosts(bed, venv_python):
    res = bed.job([str(venv_python), str(REPO / "tests" / "netbed" / "torch_check.py")],
                  per_host=PER_HOST, timeout=90)
    assert res.ok, res.summary()
    assert_every_rank(res, 4)
    for r in res.ranks:
        assert (f"torch check ok: rank {r.rank} of 4 on {bed.namespaces[r.host]}"
                in r.stdout), r.stdout + r.stderr


# --------------------------------------------------------------------------- the bed

def test_layout_and_addresses(bed):
    assert bed.hosts == 2 and len(bed.addrs) == 2
    for i, ns in enumerate(bed.namespaces):
        r = bed.exec(i, ["ip", "-o", "-4", "addr", "show", "dev", netbed.IFACE])
        assert f"{bed.addrs[i]}/" in r.stdout, r.stdout
        lo = bed.exec(i, ["ip", "-o", "link", "show", "lo"]).stdout
        assert "UP" in lo or "UNKNOWN" in lo, lo
        shown = subprocess.run(["tc", "-n", ns, "qdisc", "show", "dev", "nb0"],
                               capture_output=True, text=True).stdout
        assert "tbf" in shown and "rate 10Gbit" in shown, shown
        port = subprocess.run(["tc", "-n", bed.bridge_ns, "qdisc", "show", "dev", f"p{i}"],
                              capture_output=True, text=True).stdout
        assert "tbf" in port and "rate 10Gbit" in port, port
    # The hosts have no route out of the bed: only their own subnet.
    routes = bed.exec(1, ["ip", "-4", "route", "show"]).stdout.strip().splitlines()
    assert routes and all(line.startswith(str(bed.subnet)) for line in routes), routes


def test_root_namespace_untouched(bed, root_before):
    now = root_network_state()
    assert str(bed.subnet) not in now["routes"]
    for a in bed.addrs:
        assert f" {a}/" not in now["addrs"]
    names_before = {line.split(":")[1].strip().split("@")[0]
                    for line in root_before["links"].splitlines()}
    names_now = {line.split(":")[1].strip().split("@")[0] for line in now["links"].splitlines()}
    ours = {"nb0", "br0"} | {f"p{i}" for i in range(bed.hosts)}
    assert not (names_now - names_before) & ours


def test_traffic_crosses_the_shaped_links(bed, shoal_perf):
    before = [tc_sent_bytes(ns, "nb0") for ns in bed.namespaces]
    size = 8 << 20
    argv = [str(shoal_perf), "--op", "allreduce", "-b", str(size), "-e", str(size),
            "--iters", "1", "--warmup", "0", "--format", "json"]
    perf_rows(bed.job(argv, per_host=PER_HOST, timeout=60))
    sent = [tc_sent_bytes(ns, "nb0") - b for ns, b in zip(bed.namespaces, before)]
    # Whatever the algorithm, each host must send at least its half of the data once.
    assert all(s >= size // 2 for s in sent), sent


def test_delay_is_reported_as_it_is(bed):
    r = subprocess.run(["tc", "-n", bed.namespaces[0], "qdisc", "show", "dev", "nb0"],
                       capture_output=True, text=True)
    assert bed.delay_applied == ("netem" in r.stdout), (bed.delay_note, r.stdout)
    if not bed.delay_applied:
        assert "NOT applied" in bed.describe_line() and "netem" in bed.delay_note


def test_shaper_holds_the_line_rate(netns_ok, shoal_perf):
    # 1 Gbit/s: far below what this machine's CPUs move, so the shaper is the limit.
    with netbed.NetBed(hosts=2, rate="1gbit", delay_us=0) as bed:
        size = 16 << 20
        argv = [str(shoal_perf), "--op", "sendrecv", "-b", str(size), "-e", str(size),
                "--iters", "3", "--warmup", "1", "--format", "json"]
        row = perf_rows(bed.job(argv, per_host=1, timeout=60))[0]
    link = 1e9 / 8 / 1e9  # GB/s
    # Each rank sends `size` bytes one way while receiving as much: one link direction.
    assert row["algbw"] <= 1.03 * link, row
    assert row["algbw"] >= 0.5 * link, row


def test_tcp_probe_measures_the_shaped_rate(netns_ok):
    # tools/netbed/link_probe.py, the reference of bench/compare's "% of what TCP moves":
    # at 1 Gbit/s, far below what this machine's CPUs move, it must see the shaper's
    # limit (the bucket adds at most its size once), one way and both ways at once.
    with netbed.NetBed(hosts=2, rate="1gbit", delay_us=0) as bed:
        link = bed.link_GBps
        allowance = link + bed.burst / 1.0 / 1e9  # the rate plus one bucket over the 1 s window
        one = tcp_probe(bed, seconds=1.0, streams=1, both_ways=False)
        both = tcp_probe(bed, seconds=1.0, streams=2, both_ways=True)
    assert 0.5 * link <= one["GBps"] <= 1.02 * allowance, one
    assert 0.5 * link <= both["GBps"] <= 1.02 * allowance, both


# --------------------------------------------------------------------------- job runner

def test_job_environment_and_hostnames(bed):
    script = ('echo "$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $GROUP_RANK '
              '$MASTER_ADDR $MASTER_PORT $SHOAL_ADVERTISE_ADDR $(cat /proc/sys/kernel/hostname)"')
    res = bed.job(["sh", "-c", script], per_host=PER_HOST, timeout=30)
    assert res.ok, res.summary()
    assert_every_rank(res, 4)
    ports = set()
    for r in res.ranks:
        rank, world, local, lws, group, maddr, mport, adv, host = r.stdout.split()
        assert (int(rank), int(world), int(local), int(lws), int(group)) == (
            r.rank, 4, r.rank % 2, 2, r.rank // 2)
        assert maddr == bed.addrs[0] and adv == bed.addrs[r.rank // 2]
        assert host == bed.namespaces[r.rank // 2]
        ports.add(mport)
    assert len(ports) == 1


def test_failing_rank_stops_the_job(bed):
    t0 = time.monotonic()
    res = bed.job(lambda rank: ["sh", "-c", "exit 3"] if rank == 3 else ["sleep", "60"],
                  per_host=PER_HOST, timeout=30, grace=2)
    assert time.monotonic() - t0 < 15
    assert_every_rank(res, 4)
    assert not res.ok and res.failed.rank == 3 and res.failed.returncode == 3
    assert all(r.killed for r in res.ranks if r.rank != 3)
    assert "rank 3" in res.summary()
    for ns in bed.namespaces:
        assert netbed.netns_pids(ns) == []


def test_job_timeout_kills_every_rank(bed):
    res = bed.job(["sleep", "60"], per_host=PER_HOST, timeout=1, grace=1)
    assert_every_rank(res, 4)
    assert res.timed_out and not res.ok and res.seconds < 10
    assert all(r.killed and r.returncode != 0 for r in res.ranks)
    assert "timed out" in res.summary()


def test_mpirun_across_the_bed(bed):
    if subprocess.run(["sh", "-c", "command -v mpirun"], capture_output=True).returncode:
        pytest.skip("mpirun (Open MPI) is not installed")
    argv = bed.mpirun_argv(PER_HOST) + [
        "sh", "-c", 'echo "$OMPI_COMM_WORLD_RANK $(cat /proc/sys/kernel/hostname)"']
    p = bed.run(0, argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 0, out
    got = sorted(line.split() for line in out.splitlines() if line[:1].isdigit())
    assert got == [[str(r), bed.namespaces[r // PER_HOST]] for r in range(4)], out


# --------------------------------------------------------------------------- clean-up

def bed_process(code):
    """A Python process that builds a bed, prints its prefix, then runs `code`."""
    prog = ("from tools.netbed import NetBed\n"
            "with NetBed(hosts=2, delay_us=0) as bed:\n"
            "    print(bed.prefix, flush=True)\n"
            "    %s\n") % code
    # SIGINT back to its default: a test run started in the background by a
    # non-interactive shell (`make test &`) inherits it ignored, and the owner
    # would never see the SIGINT the test sends.
    p = subprocess.Popen([sys.executable, "-c", prog], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=REPO,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    prefix = p.stdout.readline().strip()
    assert prefix, p.stderr.read()
    assert any(n.startswith(prefix + "-") for n in netbed.list_netns())
    return p, prefix


def gone(prefix):
    return not any(n.startswith(prefix + "-") for n in netbed.list_netns())


def test_cleanup_on_exception(netns_ok):
    with pytest.raises(RuntimeError):
        with netbed.NetBed(hosts=2, delay_us=0) as bed:
            prefix = bed.prefix
            raise RuntimeError("boom")
    assert gone(prefix)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_cleanup_on_signal(netns_ok, sig):
    p, prefix = bed_process("bed.job(['sleep', '60'], per_host=1, timeout=120)")
    # Signal the owner while its job runs (both ranks started), not before.
    try:
        wait_for(lambda: all(netbed.netns_pids(f"{prefix}-h{i}") for i in range(2)), 20,
                 "the job's ranks to start")
    except BaseException:
        p.kill()  # its guard removes the bed
        p.wait()
        raise
    p.send_signal(sig)
    try:
        p.wait(timeout=20)
    except subprocess.TimeoutExpired:  # say where it hung
        tree = subprocess.run(["ps", "-o", "pid,ppid,pgid,stat,wchan:24,cmd", "--ppid",
                               str(p.pid)], capture_output=True, text=True).stdout
        p.kill()
        pytest.fail(f"the owner did not exit within 20 s of {sig!r}; its children:\n{tree}\n"
                    f"its stderr:\n{p.communicate()[1][-3000:]}")
    if sig == signal.SIGKILL:
        # Its guard process removes the bed, concurrently with this test, and
        # unlinks the state file only after the namespaces are gone.
        wait_for(lambda: gone(prefix) and netbed.read_state(prefix) is None, 15,
                 f"the guard to remove namespaces {prefix}-* and the state file")
    # SIGTERM/SIGINT: the owner removes the whole bed before it exits.
    assert gone(prefix)
    assert netbed.read_state(prefix) is None


def test_cli_run_and_cleanup(netns_ok):
    r = subprocess.run(NETBED_CLI + ["run", "--hosts", "2", "--per-host", "2", "--rate",
                                     "5gbit", "--delay-us", "0", "--prefix", "nbclitest",
                                     "--", "sh", "-c", 'echo "r$RANK"'],
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert sorted(line.split()[-1] for line in r.stdout.splitlines()) == ["r0", "r1", "r2", "r3"]
    assert "5 Gbit/s" in r.stderr
    assert gone("nbclitest")
    # A failing command: its exit code, and still nothing left.
    r = subprocess.run(NETBED_CLI + ["run", "--hosts", "2", "--prefix", "nbclitest", "--",
                                     "sh", "-c", 'exit $((RANK + 4))'],
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode in (4, 5) and "job failed" in r.stderr, r.stderr
    assert gone("nbclitest")
    # Leftovers (as after a crash of an owner without its guard) go with `cleanup`.
    subprocess.run(["ip", "netns", "add", "nbclitest-h0"], check=True)
    r = subprocess.run(NETBED_CLI + ["cleanup", "--prefix", "nbclitest"], capture_output=True,
                       text=True, timeout=60, cwd=REPO)
    assert r.returncode == 0 and gone("nbclitest"), r.stderr
