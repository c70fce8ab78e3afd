"""No silent 127.0.0.1 across nodes.

A node of a multi-node job that does not host the launchers' rendezvous and
finds its address resolving to loopback only would wait for a rendezvous that
cannot happen (its peers are on other machines); it stops at once, exit 2,
with one line naming the flag or variable the address came from. Where that
address is meant (node 0 hosting it; c10d with is_host=1; every node on this
machine with --same-host-nodes; one node) nothing is refused.

These run the launcher for real (no --dry-run): without the check it would
wait for the rendezvous, and the test's 10 s limit would fail it.
"""
import json
import socket

import pytest

from conftest import free_ports, one_error_line

NODE1 = ["--nnodes", "2", "--node-rank", "1"]
C10D = ["--nnodes", "2", "--rdzv-backend", "c10d"]


@pytest.mark.parametrize("args,env,names", [
    (NODE1, {}, "the default of --master-addr 127.0.0.1"),
    (NODE1 + ["--master-addr", "localhost"], {}, "--master-addr localhost"),
    ([], {"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "127.0.0.1"}, "PET_MASTER_ADDR 127.0.0.1"),
    (NODE1 + ["--rdzv-endpoint", "127.0.0.1:{port}"], {}, "--rdzv-endpoint 127.0.0.1"),
    ([], {"SM_HOSTS": '["localhost","algo-2"]', "SM_CURRENT_HOST": "algo-2"}, "SM_HOSTS (its first host) localhost"),
    ([], {"SLURM_NODEID": "1", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "localhost,n2"},
     "SLURM_JOB_NODELIST (its first host) localhost"),
    ([], {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"},
     "MASTER_ADDR 127.0.0.1"),
    (C10D + ["--rdzv-endpoint", "localhost:{port}"], {}, "--rdzv-endpoint localhost"),
    (C10D + ["--rdzv-endpoint", "127.0.0.1:{port}", "--rdzv-conf", "is_host=0"], {}, "--rdzv-endpoint 127.0.0.1"),
    ([], {"PET_NNODES": "1:2", "PET_RDZV_BACKEND": "c10d", "PET_RDZV_ENDPOINT": "127.0.0.1:{port}"},
     "PET_RDZV_ENDPOINT 127.0.0.1"),
])
def test_loopback_on_a_node_that_does_not_host_is_an_error_at_once(job, args, env, names):
    port = free_ports(1)[0]
    job.script("w.sh", "#!/bin/sh\ntouch \"$JOB_DIR/ran.$RANK\"\n")
    args = [a.format(port=port) for a in args]
    env = {k: v.format(port=port) for k, v in env.items()}
    r = job.run(*args, "--no-python", "./w.sh", env=job.env(**env), timeout=10)
    line = one_error_line(r)
    assert f"{names} resolves to loopback only (127.0.0.1" in line, line
    assert "the other nodes' launchers cannot be reached there" in line and "--same-host-nodes" in line
    assert r.ended - r.started < 5
    assert not list(job.dir.glob("ran.*"))


def plan(job, *args):
    job.script("w.py", "print('ok')\n")
    r = job.run("--dry-run", *args, "w.py")
    assert r.rc == 0, r.err
    return dict(line.split("=", 1) for line in r.out.splitlines())


@pytest.mark.parametrize("args,hosted", [
    (["--nnodes", "2", "--node-rank", "0"], "yes"),                        # node 0 hosts it there
    (NODE1 + ["--same-host-nodes"], "no"),                                 # every node on this machine
    (C10D + ["--rdzv-endpoint", "127.0.0.1:29400", "--rdzv-conf", "is_host=1"], "yes"),
    (C10D + ["--rdzv-endpoint", "127.0.0.1:29400", "--same-host-nodes"], "yes"),
    (C10D + ["--rdzv-endpoint", socket.gethostname()], "yes"),             # this machine by name
    (["--nnodes", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost"], ""),  # one node
])
def test_loopback_where_it_is_meant(job, args, hosted):
    assert plan(job, *args)["rdzv_hosted_here"] == hosted


def test_same_host_nodes_run_for_real(job):
    # The opt-in is what the loopback tests of test_multinode.py rely on; here
    # its plain form: two static nodes on this machine, default master address.
    master_port, rdzv_port = free_ports(2)
    job.script("w.sh", '#!/bin/sh\necho "rank $RANK of $WORLD_SIZE"\n')
    launchers = [job.start("--nnodes", 2, "--node-rank", n, "--same-host-nodes", "--master-port", master_port,
                           "--rdzv-port", rdzv_port, "--no-python", "./w.sh", name=f"node{n}") for n in (1, 0)]
    for launcher in launchers:
        assert launcher.wait(30) == 0, launcher.err
    assert "[1]: rank 1 of 2" in launchers[0].out and "[0]: rank 0 of 2" in launchers[1].out


def test_resourceconfig_names_the_file(job):
    cfg = job.dir / "rc.json"
    cfg.write_text(json.dumps({"current_host": "b", "hosts": ["localhost", "b"]}))
    job.script("w.sh", "#!/bin/sh\ntrue\n")
    r = job.run("--no-python", "./w.sh", env=job.env(SHOAL_SM_RESOURCE_CONFIG=cfg), timeout=10)
    assert f'{cfg} (the first of its "hosts") localhost resolves to loopback only' in one_error_line(r)
