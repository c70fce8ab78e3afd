"""shoalrun across the net bed: two "hosts" (network namespaces, their own
addresses and host names), the launch lines that SageMaker notebooks and
Kubeflow PyTorchJobs use with torchrun, with `torchrun` replaced by `shoalrun`.

Inside the bed the hosts are called algo-1 and algo-2, as on SageMaker: each
host namespace gets /etc/netns/<namespace>/hosts, which `ip netns exec` shows
its processes as /etc/hosts (removed at the end; the names are the bed's own,
unique per run). The training script is examples/train_ddp.py (the SageMaker
data-parallel guide's DDP script on the smddp backend); the Kubeflow job runs
tests/netbed/torch_check.py (every collective on known tensors).
"""
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import REPO

SHOALRUN = Path(os.environ.get("SHOALRUN", REPO / "build" / "bin" / "shoalrun"))
ALIASES = ["algo-1", "algo-2"]


@pytest.fixture(scope="module")
def named_hosts(bed):
    """The bed's hosts answer to algo-1 and algo-2 (and the master's service name)."""
    made = []
    etc_netns = Path("/etc/netns")
    made_etc_netns = not etc_netns.exists()
    try:
        for ns in bed.namespaces:
            d = Path("/etc/netns") / ns
            d.mkdir(parents=True, exist_ok=False)
            made.append(d)
            lines = ["127.0.0.1 localhost"] + [f"{a} {n}" for a, n in zip(bed.addrs, ALIASES)]
            lines.append(f"{bed.addrs[0]} pytorchjob-master-0")
            (d / "hosts").write_text("\n".join(lines) + "\n")
        yield bed
    finally:
        for d in made:
            shutil.rmtree(d, ignore_errors=True)
        if made_etc_netns:
            try:
                etc_netns.rmdir()
            except OSError:
                pass  # something else put a file there meanwhile


def launch(bed, host, argv, env, out_dir, name):
    out = open(out_dir / f"{name}.out", "wb")
    err = open(out_dir / f"{name}.err", "wb")
    p = bed.run(host, argv, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=out_dir)
    p.files = (out, err, out_dir / f"{name}.out", out_dir / f"{name}.err")
    return p


def finish(procs, timeout):
    deadline = time.monotonic() + timeout
    results = []
    try:
        for p in procs:
            rc = p.wait(max(1, deadline - time.monotonic()))
            for f in p.files[:2]:
                f.close()
            results.append((rc, p.files[2].read_text(errors="replace"), p.files[3].read_text(errors="replace")))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return results


def base_env(venv_python):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SM_", "PET_", "SLURM_", "OMPI_", "SHOAL_")) and k not in ("MASTER_ADDR", "MASTER_PORT")}
    env["PATH"] = f"{Path(venv_python).parent}:{env.get('PATH', '/usr/bin:/bin')}"
    env["OMP_NUM_THREADS"] = "1"
    return env


def test_sagemaker_notebook_launch_line(named_hosts, venv_python, tmp_path):
    bed = named_hosts
    if not SHOALRUN.exists():
        pytest.fail(f"{SHOALRUN} is not built")
    port = bed.next_port()
    procs = []
    for node, host in enumerate(ALIASES):
        env = base_env(venv_python)
        env.update(SM_HOSTS=json.dumps(ALIASES), SM_CURRENT_HOST=host, SM_NUM_GPUS="1")
        # The notebook's line, torchrun -> shoalrun.
        argv = [str(SHOALRUN), "--nproc_per_node=1", "--nnodes=2", f"--node_rank={node}", "--rdzv_id=smddp-job",
                "--rdzv_backend=c10d", f"--rdzv_endpoint={ALIASES[0]}:{port}", str(REPO / "examples" / "train_ddp.py"),
                "--epochs", "1", "--batch-size", "256", "--min-accuracy", "0.3", "--checkpoint", str(tmp_path / f"ck{node}.pt")]
        procs.append(launch(bed, node, argv, env, tmp_path, f"node{node}"))
    results = finish(procs, 240)
    for rc, out, err in results:
        assert rc == 0, f"stdout:\n{out}\nstderr:\n{err}"
    out0, out1 = results[0][1], results[1][1]
    # algo-1 hosts the rendezvous and is node 0: rank 0 (which reports) runs there.
    assert "[0]:" in out0 and "[0]:" not in out1, (out0, out1)
    assert "[0]: train_ddp: backend smddp, 2 workers" in out0 and "[0]: train_ddp: final test accuracy" in out0, out0
    assert (tmp_path / "ck0.pt").exists()


def test_kubeflow_pytorchjob_environment(named_hosts, venv_python, tmp_path):
    bed = named_hosts
    port = bed.next_port()
    procs = []
    for node in range(2):
        env = base_env(venv_python)
        env.update(PET_NNODES="2", PET_NPROC_PER_NODE="1", PET_NODE_RANK=str(node),
                   PET_MASTER_ADDR="pytorchjob-master-0", PET_MASTER_PORT=str(port))
        argv = [str(SHOALRUN), str(REPO / "tests" / "netbed" / "torch_check.py")]
        procs.append(launch(bed, node, argv, env, tmp_path, f"node{node}"))
    results = finish(procs, 180)
    for rc, out, err in results:
        assert rc == 0, f"stdout:\n{out}\nstderr:\n{err}"
    joined = results[0][1] + results[1][1]
    for rank, host in enumerate(["h0", "h1"]):  # each rank on its own host of the bed
        assert f"[{rank}]: torch check ok: rank {rank} of 2 on {bed.prefix}-{host}" in joined, joined
