"""shoal.modelparallel: a lost rank breaks its data-parallel replica, not the others
(mp_fault_worker.py). 2 partitions x 2 replicas on 4 ranks; rank 3 (replica 1)
is SIGKILLed after two training steps. Its pipeline partner's step fails naming
it; replica 0's pipeline runs a step with the reference's loss and gradients,
its gradient average then fails naming rank 3, its PP and MP groups go on
working, and rank 1 recovers its DP group without rank 3."""
import json
import os
import subprocess
import sys
from datetime import timedelta

import torch.distributed as dist

from harness import HERE, ROOT, free_port

WORKER = HERE / "mp_fault_worker.py"


def run(n=4, timeout=180):
    # the store lives outside the ranks (as under shoalrun): no rank's exit takes it down
    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,  # noqa: F841
                          timeout=timedelta(seconds=timeout))
    procs = []
    for r in range(n):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(n),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCHELASTIC_USE_AGENT_STORE="True",
                   OMP_NUM_THREADS="1", SHOAL_TIMEOUT_S="60",
                   PYTHONPATH=str(ROOT / "python") + os.pathsep + os.environ.get("PYTHONPATH", ""))
        procs.append(subprocess.Popen([sys.executable, str(WORKER)], env=env, cwd=ROOT,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return [p.returncode for p in procs], outs


def result(out):
    lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    assert lines, out[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


def test_a_rank_lost_in_one_replica_leaves_the_others_pipelines_working():
    codes, outs = run()
    assert codes[3] == -9, outs[3][-4000:]
    for r in range(3):
        res = result(outs[r])
        assert not res["failed"], f"rank {r}: {json.dumps(res['failed'], indent=1)}"
        assert codes[r] == 0, outs[r][-4000:]
    assert len(result(outs[0])["passed"]) == 5, outs[0][-4000:]
    assert len(result(outs[1])["passed"]) == 6, outs[1][-4000:]
    assert len(result(outs[2])["passed"]) == 2, outs[2][-4000:]
