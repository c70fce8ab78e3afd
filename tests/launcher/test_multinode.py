"""Several launchers on loopback, each playing one node (--same-host-nodes:
on one machine, a loopback master address is what the job means)."""
import json
import signal
import time

import pytest

from conftest import REPO, assert_ranks_reported, free_ports

WORKER = r"""#!/bin/bash
touch "$JOB_DIR/up.$RANK"
echo "rank $RANK of $WORLD_SIZE node $GROUP_RANK local $LOCAL_RANK/$LOCAL_WORLD_SIZE port $MASTER_PORT restart $SHOAL_RESTART_COUNT"
if [ "$RANK" = "${FAIL_RANK-x}" ] || [ "$RANK" = "${KILL_RANK-x}" ]; then
  while [ "$(ls "$JOB_DIR" | grep -c '^up\.')" -lt "$WORLD_SIZE" ]; do sleep 0.02; done
  [ "$RANK" = "${KILL_RANK-x}" ] && kill -9 $$
  exit "${FAIL_CODE-3}"
fi
[ -n "$HOLD" ] && { sleep 60 & wait $!; }
exit 0
"""


def start_nodes(job, nnodes, nproc=1, extra=(), env=None, per_node_args=None, script="./w.sh", order=None):
    master_port, rdzv_port = free_ports(2)
    launchers = {}
    for node in order or range(nnodes):
        args = ["--nnodes", nnodes, "--node-rank", node, "--master-port", master_port, "--rdzv-port", rdzv_port,
                "--same-host-nodes", *extra]
        if nproc is not None:
            args += ["--nproc-per-node", nproc]
        if per_node_args:
            args += per_node_args(node)
        launchers[node] = job.start(*args, "--no-python", script, env=env or job.env(), name=f"node{node}")
    return [launchers[n] for n in range(nnodes)], master_port


def test_two_nodes_environment(job):
    job.script("w.sh", WORKER)
    (n0, n1), port = start_nodes(job, 2, nproc=2, order=[1, 0])  # node 1 waits for node 0's store
    assert n0.wait() == 0, n0.err
    assert n1.wait() == 0, n1.err
    out = n0.out + n1.out
    for rank in range(4):
        node, local = divmod(rank, 2)
        assert f"[{rank}]: rank {rank} of 4 node {node} local {local}/2 port {port} restart 0" in out
    assert "[2]:" in n1.out and "[2]:" not in n0.out


def test_three_nodes_real_allreduce(job):
    exe = REPO / "build" / "bin" / "example-allreduce"
    if not exe.exists():
        pytest.skip("build/bin/example-allreduce is not built")
    launchers, _ = start_nodes(job, 3, script=str(exe))
    for node, launcher in enumerate(launchers):
        assert launcher.wait(60) == 0, launcher.err
        # The workers' store (master port) and the launchers' (rdzv port) coexist.
        assert f"[{node}]: rank {node} of 3: grad[0] = 1" in launcher.out


def test_nproc_mismatch_names_the_node(job):
    job.script("w.sh", WORKER)
    launchers, _ = start_nodes(job, 2, nproc=None, per_node_args=lambda n: ["--nproc-per-node", 2 + n])
    for launcher in launchers:
        assert launcher.wait() == 2, launcher.err
        assert "node 1 (host" in launcher.err and "has --nproc-per-node 3 but node 0" in launcher.err
    assert not list(job.dir.glob("up.*"))


@pytest.mark.parametrize("fail_rank", [3, 0])
def test_worker_failure_on_one_node_stops_every_node(job, fail_rank):
    job.script("w.sh", WORKER)
    env = job.env(FAIL_RANK=fail_rank, FAIL_CODE=3, HOLD=1)
    launchers, _ = start_nodes(job, 3, nproc=2, env=env)
    for launcher in launchers:
        assert launcher.wait(20) == 3, launcher.err
    node, local = divmod(fail_rank, 2)
    failed = launchers[node]
    assert f"rank {fail_rank} (local rank {local}, pid" in failed.err and "exited with code 3" in failed.err
    assert "job failed: first failure on node" in failed.err
    for other in set(range(3)) - {node}:
        err = launchers[other].err
        assert f"node {node} (host" in err and f"failed: rank {fail_rank} (local rank {local}" in err, err
        assert launchers[other].ended - failed.ended < 5


def test_worker_sigkill_on_one_node(job):
    job.script("w.sh", WORKER)
    (n0, n1), _ = start_nodes(job, 2, env=job.env(KILL_RANK=1, HOLD=1))
    assert n1.wait(20) == 137, n1.err
    assert n0.wait(20) == 137, n0.err
    assert "node 1 (host" in n0.err and "was killed by SIGKILL" in n0.err


@pytest.mark.serial  # the survivors stop within 5.5 s: 3 s of heartbeat silence and the teardown
def test_node_launcher_killed(job):
    job.script("w.sh", WORKER)
    (n0, n1, n2), _ = start_nodes(job, 3, nproc=2, env=job.env(HOLD=1))
    job.wait_files("up.*", 6)
    n1.signal(signal.SIGKILL)
    killed_at = time.monotonic()
    assert n0.wait(20) == 1, n0.err
    assert n2.wait(20) == 1, n2.err
    for launcher in (n0, n2):
        assert "node 1 (host" in launcher.err and "is lost" in launcher.err, launcher.err
        assert launcher.ended - killed_at < 5.5  # 3 s heartbeat silence + teardown


@pytest.mark.serial  # the survivor stops within 5 s
def test_master_launcher_killed(job):
    job.script("w.sh", WORKER)
    (n0, n1), _ = start_nodes(job, 2, nproc=2, env=job.env(HOLD=1))
    job.wait_files("up.*", 4)
    n0.signal(signal.SIGKILL)
    killed_at = time.monotonic()
    assert n1.wait(20) == 1, n1.err
    assert "lost the master node 0" in n1.err, n1.err
    assert n1.ended - killed_at < 5


def test_missing_node_times_out_naming_it(job):
    job.script("w.sh", WORKER)
    master_port, rdzv_port = free_ports(2)
    launchers = [
        job.start("--nnodes", 3, "--node-rank", node, "--master-port", master_port, "--rdzv-port", rdzv_port,
                  "--same-host-nodes", "--rdzv-timeout", 1.5, "--no-python", "./w.sh", name=f"node{node}")
        for node in (0, 2)
    ]
    for launcher in launchers:
        assert launcher.wait(20) == 1, launcher.err
        assert "node 1 of 3 never arrived" in launcher.err, launcher.err


def test_duplicate_node_rank(job):
    job.script("w.sh", WORKER)
    master_port, rdzv_port = free_ports(2)
    launchers = [
        job.start("--nnodes", 3, "--node-rank", node, "--master-port", master_port, "--rdzv-port", rdzv_port,
                  "--same-host-nodes", "--no-python", "./w.sh", name=f"launcher{i}") for i, node in enumerate([0, 1, 1])
    ]
    for launcher in launchers:
        assert launcher.wait(20) == 2, launcher.err
        assert "node rank 1 was given to two launchers" in launcher.err, launcher.err
    assert not list(job.dir.glob("up.*"))


def test_missing_master_times_out(job):
    job.script("w.sh", WORKER)
    master_port, rdzv_port = free_ports(2)
    r = job.run("--nnodes", 2, "--node-rank", 1, "--master-port", master_port, "--rdzv-port", rdzv_port,
                "--same-host-nodes", "--rdzv-timeout", 1, "--no-python", "./w.sh")
    assert r.rc == 1 and "node 0 never arrived" in r.err, r.err


def test_restart_on_every_node(job):
    job.script("flaky.sh", r"""#!/bin/bash
echo "rank $RANK attempt $SHOAL_RESTART_COUNT"
[ "$RANK" = 1 ] && [ "$SHOAL_RESTART_COUNT" = 0 ] && exit 7
exit 0
""")
    (n0, n1), _ = start_nodes(job, 2, extra=["--max-restarts", 1], script="./flaky.sh")
    assert n0.wait() == 0, n0.err
    assert n1.wait() == 0, n1.err
    assert "[0]: rank 0 attempt 1" in n0.out and "[1]: rank 1 attempt 1" in n1.out
    assert "restarting the workers on every node (restart 1 of 1)" in n0.err


def test_interrupt_one_node(job):
    job.script("w.sh", WORKER)
    (n0, n1), _ = start_nodes(job, 2, env=job.env(HOLD=1))
    job.wait_files("up.*", 2)
    n1.signal(signal.SIGTERM)
    assert n1.wait(20) == 143, n1.err
    assert n0.wait(20) == 143, n0.err
    assert "node 1 (host" in n0.err and "received SIGTERM" in n0.err


def test_static_rendezvous_at_an_endpoint(job):
    # torchrun's static backend with --rdzv-endpoint: node 0 hosts the
    # launchers' store there, and is the workers' MASTER_ADDR.
    job.script("w.sh", WORKER)
    master_port, rdzv_port = free_ports(2)
    launchers = [job.start("--nnodes", 2, "--node_rank", node, "--rdzv_backend=static",
                           f"--rdzv_endpoint=127.0.0.1:{rdzv_port}", "--master-port", master_port, "--same-host-nodes",
                           "--no-python", "./w.sh", name=f"node{node}") for node in (1, 0)]
    for launcher in launchers:
        assert launcher.wait() == 0, launcher.err
    assert f"[1]: rank 1 of 2 node 1 local 0/1 port {master_port} restart 0" in launchers[0].out
    assert f"[0]: rank 0 of 2 node 0 local 0/1 port {master_port} restart 0" in launchers[1].out


def test_slurm_two_nodes(job):
    job.script("w.sh", WORKER)
    master_port, rdzv_port = free_ports(2)  # master_port + 1 may be taken
    launchers = []
    for node in range(2):
        env = job.env(SLURM_NODEID=node, SLURM_NNODES=2, SLURM_JOB_NODELIST="127.0.0.[1-2]")
        launchers.append(job.start("-v", "--master-port", master_port, "--rdzv-port", rdzv_port,
                                   "--same-host-nodes", "--no-python", "./w.sh", env=env, name=f"node{node}"))
    for launcher in launchers:
        assert launcher.wait() == 0, launcher.err
        assert "cluster description from slurm" in launcher.err
    assert_ranks_reported(launchers[0].out + launchers[1].out, 2)
    assert "[1]: rank 1 of 2 node 1" in launchers[1].out


def test_sagemaker_two_nodes(job):
    job.script("w.sh", WORKER)
    master_port, rdzv_port = free_ports(2)  # master_port + 1 may be taken
    hosts = json.dumps(["127.0.0.1", "127.0.0.2"])
    launchers = []
    for node, host in enumerate(["127.0.0.1", "127.0.0.2"]):
        env = job.env(SM_HOSTS=hosts, SM_CURRENT_HOST=host, SM_NUM_GPUS=0, SM_NUM_CPUS=2)
        launchers.append(job.start("--master-port", master_port, "--rdzv-port", rdzv_port, "--same-host-nodes",
                                   "--no-python", "./w.sh", env=env, name=f"node{node}"))
    for launcher in launchers:
        assert launcher.wait() == 0, launcher.err
    assert_ranks_reported(launchers[0].out + launchers[1].out, 4)
    assert "[3]: rank 3 of 4 node 1 local 1/2" in launchers[1].out


def test_openmpi_two_nodes(job):
    job.script("w.sh", WORKER)
    master_port, rdzv_port = free_ports(2)  # master_port + 1 may be taken
    launchers = []
    for node in range(2):
        env = job.env(OMPI_COMM_WORLD_RANK=node, OMPI_COMM_WORLD_SIZE=2, OMPI_COMM_WORLD_LOCAL_SIZE=1)
        launchers.append(job.start("--master-addr", "127.0.0.1", "--master-port", master_port, "--rdzv-port",
                                   rdzv_port, "--same-host-nodes", "--no-python", "./w.sh", env=env,
                                   name=f"node{node}"))
    for launcher in launchers:
        assert launcher.wait() == 0, launcher.err
    assert_ranks_reported(launchers[0].out + launchers[1].out, 2)
    assert "[1]: rank 1 of 2 node 1" in launchers[1].out
