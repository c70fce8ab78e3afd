"""The c10d rendezvous and elastic jobs, with several launchers on loopback
(--same-host-nodes: the first to bind the endpoint's port hosts the store, the
others join it as clients, as torchrun's launchers on one machine do).

Workers write up.<launcher pid>.<node>.<world size>.<restart> and hold while
their world is smaller than HOLD_BELOW or as large as HOLD_AT, or until the
file `release` exists when HOLD is set; every wait polls with a deadline.
"""
import re
import signal
import socket
import time

import pytest

from conftest import REPO, assert_ranks_reported, free_ports, wait_for

WORKER = r"""#!/bin/bash
echo "rank $RANK of $WORLD_SIZE node $GROUP_RANK/$GROUP_WORLD_SIZE master $MASTER_ADDR:$MASTER_PORT restart $SHOAL_RESTART_COUNT secret $SHOAL_SECRET"
touch "$JOB_DIR/up.$PPID.$GROUP_RANK.$WORLD_SIZE.$SHOAL_RESTART_COUNT"
if [ -n "$HOLD_BELOW" ] && [ "$WORLD_SIZE" -lt "$HOLD_BELOW" ]; then sleep 60 & wait $!; fi
if [ "$WORLD_SIZE" = "${HOLD_AT-x}" ]; then sleep 60 & wait $!; fi
if [ -n "$HOLD" ]; then while [ ! -e "$JOB_DIR/release" ]; do sleep 0.05; done; fi
exit 0
"""

HOSTING = "hosting the launchers' rendezvous store"
TAKEN = "is taken on this machine: joining as a client"
LINE = re.compile(r"^\[(\d+)\]: rank (\d+) of (\d+) node (\d+)/(\d+) master (\S+) restart (\d+) secret (\S+)$", re.M)


def c10d(job, port, nnodes, *extra, env=None, name=None, script="./w.sh"):
    return job.start("--nnodes", nnodes, "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                     "--same-host-nodes", "-v", *extra, "--no-python", script, env=env or job.env(), name=name)


def ups(job):
    """(launcher pid, node, world size, restart) of every up file."""
    return [tuple(map(int, p.name.split(".")[1:])) for p in job.dir.glob("up.*")]


def test_two_nodes_meet_at_the_endpoint(job):
    job.script("w.sh", WORKER)
    (port,) = free_ports(1)
    launchers = [c10d(job, port, 2, "--nproc_per_node=2", "--rdzv_id=sm-job", name=f"l{i}") for i in range(2)]
    for launcher in launchers:
        assert launcher.wait(30) == 0, launcher.err
    rows = [m for launcher in launchers for m in LINE.findall(launcher.out)]
    assert_ranks_reported("".join(launcher.out for launcher in launchers), 4)
    # One store, hosted by the launcher that became node 0; the workers' store
    # is on a free port of node 0, not the endpoint's; one secret for the job.
    host = [launcher for launcher in launchers if HOSTING in launcher.err]
    assert len(host) == 1 and "[0]: rank 0 of 4 node 0/2" in host[0].out
    assert {m[5] for m in rows} == {rows[0][5]} and rows[0][5].startswith("127.0.0.1:")
    assert rows[0][5] != f"127.0.0.1:{port}"
    assert len({m[7] for m in rows}) == 1


def test_node_0s_local_addr_and_master_port(job):
    # c10d: MASTER_ADDR is node 0's --local-addr (else the endpoint's host),
    # MASTER_PORT --master-port (else a free port of node 0).
    job.script("w.sh", WORKER)
    port, master_port = free_ports(2)
    launchers = [c10d(job, port, 2, "--local-addr", "localhost", "--master-port", master_port, name=f"l{i}")
                 for i in range(2)]
    for launcher in launchers:
        assert launcher.wait(30) == 0, launcher.err
    rows = [m for launcher in launchers for m in LINE.findall(launcher.out)]
    assert sorted(m[1] for m in rows) == ["0", "1"]
    assert {m[5] for m in rows} == {f"localhost:{master_port}"}


def test_real_allreduce_over_c10d(job):
    exe = REPO / "build" / "bin" / "example-allreduce"
    if not exe.exists():
        pytest.skip("build/bin/example-allreduce is not built")
    (port,) = free_ports(1)
    launchers = [c10d(job, port, 3, script=str(exe), name=f"l{i}") for i in range(3)]
    out = ""
    for launcher in launchers:
        assert launcher.wait(60) == 0, launcher.err
        out += launcher.out
    for rank in range(3):
        assert f"[{rank}]: rank {rank} of 3: grad[0] = 1" in out, out


def test_job_id_keeps_jobs_apart(job):
    job.script("w.sh", WORKER)
    (port,) = free_ports(1)
    env = job.env(HOLD=1)
    alpha = [c10d(job, port, 2, "--rdzv-id", "alpha", env=env, name=f"alpha{i}") for i in range(2)]
    wait_for(lambda: len(ups(job)) == 2, 20, what="job alpha's workers")
    beta = c10d(job, port, 2, "--rdzv-id", "beta", name="beta")
    assert beta.wait(20) == 2, beta.err
    assert ("the rendezvous store at 127.0.0.1:%d serves job 'alpha', but this launcher was started for job "
            "'beta' (--rdzv-id)" % port) in beta.err
    (job.dir / "release").touch()
    for launcher in alpha:
        assert launcher.wait(30) == 0, launcher.err
    assert_ranks_reported(alpha[0].out + alpha[1].out, 2)


def test_elastic_waits_the_last_call_then_starts_without_max(job):
    job.script("w.sh", WORKER)
    (port,) = free_ports(1)
    launchers = [c10d(job, port, "2:3", "--rdzv-conf", "last_call_timeout=1.5", name=f"l{i}") for i in range(2)]
    for launcher in launchers:
        assert launcher.wait(30) == 0, launcher.err
    assert sorted((n, w) for _, n, w, _ in ups(job)) == [(0, 2), (1, 2)]
    host = next(launcher for launcher in launchers if HOSTING in launcher.err)
    assert "2 nodes are in; waiting up to 1.5 s for more (at most 3)" in host.err
    # The round closed only after the last call (MAX never came).
    assert min(launcher.ended for launcher in launchers) - max(launcher.started for launcher in launchers) >= 1.5


def test_elastic_takes_at_most_max(job):
    job.script("w.sh", WORKER)
    (port,) = free_ports(1)
    env = job.env(HOLD=1)
    launchers = [c10d(job, port, "1:2", "--rdzv-conf", "last_call_timeout=30", env=env, name=f"l{i}")
                 for i in range(3)]
    wait_for(lambda: len(ups(job)) == 2, 20, what="two nodes' workers")
    waiting = wait_for(lambda: [launcher for launcher in launchers if "waiting to be admitted" in launcher.err], 20,
                       what="the third launcher waiting")
    assert len(waiting) == 1 and waiting[0].poll() is None
    (job.dir / "release").touch()
    for launcher in launchers:
        assert launcher.wait(30) == 0, launcher.err
    assert sorted((n, w) for _, n, w, _ in ups(job)) == [(0, 2), (1, 2)]
    assert "the job ended (successfully) before this launcher was admitted to it" in waiting[0].err


def test_late_node_is_admitted_without_using_a_restart(job):
    job.script("w.sh", WORKER)
    (port,) = free_ports(1)
    env = job.env(HOLD_BELOW=2)
    first = c10d(job, port, "1:2", "--rdzv-conf", "last_call_timeout=0.2", env=env, name="first")
    wait_for(lambda: [u for u in ups(job) if u[2] == 1], 20, what="the one-node job")
    second = c10d(job, port, "1:2", "--rdzv-conf", "last_call_timeout=0.2", env=env, name="second")
    for launcher in (first, second):
        assert launcher.wait(30) == 0, launcher.err
    assert sorted((n, w, r) for _, n, w, r in ups(job)) == [(0, 1, 0), (0, 2, 0), (1, 2, 0)]
    assert "restarting the workers on every node (not counted as a restart)" in first.err


@pytest.mark.parametrize("max_restarts", [1, 0])
def test_lost_node_restarts_the_rest(job, max_restarts):
    job.script("w.sh", WORKER)
    (port,) = free_ports(1)
    env = job.env(HOLD_AT=3)
    conf = "last_call_timeout=0.5,keep_alive_interval=0.2,keep_alive_max_attempt=3"
    launchers = [c10d(job, port, "2:3", "--max-restarts", max_restarts, "--rdzv-conf", conf, env=env, name=f"l{i}")
                 for i in range(3)]
    full = wait_for(lambda: len([u for u in ups(job) if u[2] == 3]) == 3 and [u for u in ups(job) if u[2] == 3], 30,
                    what="the three-node job")
    victim_pid = next(pid for pid, node, _, _ in full if node == 2)
    victim = next(launcher for launcher in launchers if launcher.pid == victim_pid)
    victim.signal(signal.SIGKILL)
    killed_at = time.monotonic()
    survivors = [launcher for launcher in launchers if launcher is not victim]
    for launcher in survivors:
        assert launcher.wait(30) == (0 if max_restarts else 1), launcher.err
        assert "node 2 (host" in launcher.err and "is lost" in launcher.err, launcher.err
    host = next(launcher for launcher in survivors if HOSTING in launcher.err)
    lost_line = next(line for line in host.err.splitlines() if "declared node 2" in line)
    assert "sent no heartbeat for 0." in lost_line, lost_line  # 3 x 0.2 s, not the default 3 s
    if max_restarts:
        # The others went on as a two-node job, restart 1.
        assert sorted((n, w, r) for _, n, w, r in ups(job) if w == 2) == [(0, 2, 1), (1, 2, 1)]
        assert all("restarting the workers on every node (restart 1 of 1)" in s.err for s in survivors)
    else:
        assert not [u for u in ups(job) if u[2] == 2]
    assert min(s.ended for s in survivors) - killed_at < 10


def test_close_timeout_bounds_how_long_node_0_keeps_the_store(job):
    # A launcher killed while it waits to be admitted never says it has read
    # the job's end: node 0 keeps the store up for close_timeout, no longer.
    job.script("w.sh", WORKER)
    (port,) = free_ports(1)
    env = job.env(HOLD=1)
    conf = ["--rdzv-conf", "last_call_timeout=30,close_timeout=2"]
    launchers = [c10d(job, port, "1:2", *conf, env=env, name=f"l{i}") for i in range(3)]
    wait_for(lambda: len(ups(job)) == 2, 20, what="two nodes' workers")
    waiting = wait_for(lambda: [launcher for launcher in launchers if "waiting to be admitted" in launcher.err], 20,
                       what="the third launcher waiting")[0]
    waiting.signal(signal.SIGKILL)
    waiting.wait(10)
    (job.dir / "release").touch()
    released = time.monotonic()
    running = [launcher for launcher in launchers if launcher is not waiting]
    for launcher in running:
        assert launcher.wait(30) == 0, launcher.err
    host = next(launcher for launcher in running if HOSTING in launcher.err)
    other = next(launcher for launcher in running if launcher is not host)
    assert host.ended - released >= 2.0
    assert host.ended - other.ended < 6


def test_heartbeat_timeout_bounds_one_call_to_a_silent_node_0(job):
    job.script("w.sh", WORKER)
    (port,) = free_ports(1)
    conf = ["--rdzv-conf", "heartbeat_timeout=3.5,keep_alive_interval=0.2,keep_alive_max_attempt=2"]
    launchers = [c10d(job, port, 2, *conf, env=job.env(HOLD=1), name=f"l{i}") for i in range(2)]
    wait_for(lambda: len(ups(job)) == 2, 20, what="the workers")
    host = next(launcher for launcher in launchers if HOSTING in launcher.err)
    other = next(launcher for launcher in launchers if launcher is not host)
    host.signal(signal.SIGSTOP)  # silent, its connections open
    stopped = time.monotonic()
    try:
        assert other.wait(30) == 1, other.err
        assert "lost the master node 0" in other.err and "stopped answering" in other.err, other.err
        # A call waits heartbeat_timeout before the silence counts (0.4 s of
        # missed heartbeats alone would have said so sooner).
        assert 3.3 <= other.ended - stopped < 12
    finally:
        host.signal(signal.SIGKILL)
        host.wait(10)


def test_a_port_held_for_a_while_is_hosted_once_free(job):
    """Something that binds the endpoint's port without listening (a passing
    connection's socket) makes every launcher here find it taken; they must
    not all wait as clients for a host that never comes."""
    job.script("w.sh", WORKER)
    (port,) = free_ports(1)
    holder = socket.socket()
    holder.bind(("127.0.0.1", port))
    try:
        launchers = [c10d(job, port, 2, name=f"l{i}") for i in range(2)]
        wait_for(lambda: all(TAKEN in launcher.err for launcher in launchers), 20, what="both to find the port taken")
    finally:
        holder.close()
    for launcher in launchers:
        assert launcher.wait(30) == 0, launcher.err
    assert sum(HOSTING in launcher.err for launcher in launchers) == 1
    assert len(ups(job)) == 2


def test_min_nodes_never_arrive(job):
    job.script("w.sh", WORKER)
    (port,) = free_ports(1)
    r = c10d(job, port, 2, "--rdzv-conf", "join_timeout=1")
    assert r.wait(20) == 1, r.err
    assert f"rendezvous timed out after 1 s: 1 of at least 2 nodes arrived at 127.0.0.1:{port}" in r.err
    assert r.ended - r.started < 8


def test_is_host_0_never_hosts(job):
    job.script("w.sh", WORKER)
    (port,) = free_ports(1)
    r = c10d(job, port, 2, "--rdzv-conf", "join_timeout=1,is_host=0")
    assert r.wait(20) == 1, r.err
    assert f"no launcher hosts the rendezvous store at 127.0.0.1:{port}" in r.err


def test_nodes_that_disagree(job):
    job.script("w.sh", WORKER)
    (port,) = free_ports(1)
    launchers = [c10d(job, port, 2, "--nproc-per-node", n, name=f"l{n}") for n in (1, 2)]
    for launcher in launchers:
        assert launcher.wait(20) == 2, launcher.err
        assert re.search(r"the launcher on host \S+ \(pid \d+\) has --nproc-per-node \d but", launcher.err)
    assert not ups(job)
