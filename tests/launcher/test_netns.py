"""Two nodes in two network namespaces joined by a veth pair.

The test creates its own namespaces (unique names) and addresses (10.231.x.y,
only inside them) and removes everything in a finally block; it is skipped when
namespaces cannot be created here (not root, no iproute2, no CAP_SYS_ADMIN).
"""
import os
import shutil
import subprocess
import uuid

import pytest

from conftest import REPO, free_ports


def ip(*args, check=True):
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=20)


@pytest.fixture
def two_namespaces():
    if shutil.which("ip") is None:
        pytest.skip("iproute2 (ip) is not installed")
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    tag = uuid.uuid4().hex[:6]
    names = [f"shoalrun-{tag}-{i}" for i in range(2)]
    veths = [f"srv{tag}a", f"srv{tag}b"]  # at most 15 characters
    addrs = ["10.231.77.1", "10.231.77.2"]
    created = []
    try:
        for n in names:
            r = ip("netns", "add", n, check=False)
            if r.returncode != 0:
                pytest.skip(f"cannot create a network namespace: {r.stderr.strip()}")
            created.append(n)
        r = ip("link", "add", veths[0], "type", "veth", "peer", "name", veths[1], check=False)
        if r.returncode != 0:
            pytest.skip(f"cannot create a veth pair: {r.stderr.strip()}")
        for n, v, a in zip(names, veths, addrs):
            ip("link", "set", v, "netns", n)
            ip("-n", n, "addr", "add", f"{a}/24", "dev", v)
            ip("-n", n, "link", "set", v, "up")
            ip("-n", n, "link", "set", "lo", "up")
        yield list(zip(names, addrs))
    finally:
        for n in created:
            ip("netns", "del", n, check=False)  # takes its end of the veth pair along
        ip("link", "del", veths[0], check=False)  # in case it never moved


def test_two_nodes_in_two_namespaces(job, two_namespaces):
    exe = REPO / "build" / "bin" / "example-allreduce"
    (ns0, master), (ns1, _) = two_namespaces
    master_port, rdzv_port = free_ports(2)
    if exe.exists():
        command = [str(exe)]
    else:
        # Without the example, a worker that only checks its place in the job.
        job.script("w.sh", '#!/bin/sh\necho "rank $RANK of $WORLD_SIZE: grad[0] = 1.5"\n')
        command = ["./w.sh"]
    launchers = []
    for node, ns in enumerate([ns0, ns1]):
        launchers.append(job.start("--nnodes", 2, "--node-rank", node, "--nproc-per-node", 2, "--master-addr",
                                   master, "--master-port", master_port, "--rdzv-port", rdzv_port, "--no-python",
                                   *command, prefix=("ip", "netns", "exec", ns), name=f"node{node}"))
    for node, launcher in enumerate(launchers):
        assert launcher.wait(60) == 0, launcher.err
        for local in range(2):
            rank = node * 2 + local
            # The average of ranks 0..3.
            assert f"[{rank}]: rank {rank} of 4: grad[0] = 1.5" in launcher.out, launcher.out
