"""Training that survives a lost rank (recovery_worker.py): DDP on 4 ranks,
rank 3 SIGKILLed at step 30, the survivors recover through
shoal.torch.recover (agreement, then dist.shrink_group on shoal) and train
to step 100; the final state dict equals (sha256) that of a fresh 3-rank
job started from the same step-29 state with the same data order."""
import os
import subprocess
import sys

import pytest
import torch.distributed as dist

from harness import HERE, free_port

pytestmark = pytest.mark.skipif(not hasattr(dist, "shrink_group"), reason="torch has no dist.shrink_group")


def run(mode, n, out):
    port = free_port()
    procs = []
    for r in range(n):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(n),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, str(HERE / "recovery_worker.py"), mode, str(out)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=120)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return [p.returncode for p in procs], outs


def test_ddp_survives_a_killed_rank_and_matches_a_fresh_job(tmp_path):
    codes, outs = run("kill", 4, tmp_path)
    assert codes[3] == -9, outs[3]
    assert codes[:3] == [0, 0, 0], "\n".join(outs)
    assert all("recovered_after" in o and "None" not in o.split("recovered_after")[1][:6] for o in outs[:3]), outs
    codes, fresh = run("fresh", 3, tmp_path)
    assert codes == [0, 0, 0], "\n".join(fresh)
    assert (tmp_path / "kill.sha256").read_text() == (tmp_path / "fresh.sha256").read_text()
