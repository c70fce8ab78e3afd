"""examples/train_elastic.py under shoalrun --fault-tolerance shrink: rank 0 (the rank that would
host the store without the launcher's) is SIGKILLed in the middle of a step; the survivors name it,
recover (agree + dist.shrink_group), redo the step with 3 ranks and finish; the final state equals
(sha256) that of a fresh 3-rank job started from the same step's commit; nothing is left behind.
Under --fault-tolerance replace, the launcher's replacement joins (shoal.torch.join/grow) at the
step boundary, and the job ends in the state of a run that lost nobody."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[2]
SHOALRUN = ROOT / "build" / "bin" / "shoalrun"
EXAMPLE = ROOT / "examples" / "train_elastic.py"

pytestmark = pytest.mark.skipif(not hasattr(dist, "shrink_group"), reason="torch has no dist.shrink_group")


def _run(n, *args, ft="shrink"):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"), SHOAL_TIMEOUT_S="60", SHOAL_TRACE_DIR=os.environ.get(
        "TMPDIR", "/tmp"))
    cmd = [str(SHOALRUN), "--standalone", "--nproc-per-node", str(n), *(["--fault-tolerance", ft] if ft else []),
           "--no-python", sys.executable, str(EXAMPLE), *map(str, args)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    return proc.returncode, proc.stdout + proc.stderr


def test_survivors_of_a_killed_rank_0_finish_as_a_fresh_smaller_job(tmp_path):
    commit, lost, fresh = tmp_path / "commit.pt", tmp_path / "lost.sha", tmp_path / "fresh.sha"
    code, out = _run(4, "--kill-rank", 0, "--kill-step", 4, "--steps", 10, "--save-state", commit, "--save-at", 4,
                     "--final", lost)
    assert code == 0, out[-4000:]
    redone = re.findall(r"rank (\d): step 4 failed \(.*peer lost: rank 0 .*\); recovered in \d+ ms: 4 -> 3 ranks", out)
    assert sorted(redone) == ["1", "2", "3"], out[-4000:]
    assert "done: 10 steps on 3 ranks" in out and "going on without rank 0: 3 of 4 ranks are left" in out, out[-3000:]
    code, out = _run(3, "--resume", commit, "--steps", 10, "--final", fresh, ft=None)
    assert code == 0, out[-4000:]
    assert lost.read_text() == fresh.read_text(), "the survivors' final state differs from a fresh 3-rank job's"
    left = subprocess.run(["pgrep", "-f", str(EXAMPLE)], capture_output=True, text=True).stdout.split()
    assert not left, f"processes left behind: {left}"


def test_a_replacement_joins_and_the_job_ends_as_if_nobody_was_lost(tmp_path):
    replaced, plain = tmp_path / "replaced.sha", tmp_path / "plain.sha"
    code, out = _run(4, "--kill-rank", 1, "--kill-step", 4, "--steps", 10, "--final", replaced, ft="replace")
    assert code == 0, out[-4000:]
    assert "starting a replacement for rank 1" in out, out[-3000:]
    assert re.search(r"rank 1: replacement 1 joined at step 4 in \d+ ms as rank 3 of 4", out), out[-3000:]
    grew = re.findall(r"rank (\d): grew at step 4 in \d+ ms: 3 -> 4 ranks", out)
    assert sorted(grew) == ["0", "2", "3"], out[-3000:]
    assert "done: 10 steps on 4 ranks" in out, out[-3000:]
    code, out = _run(4, "--steps", 10, "--final", plain, ft=None)
    assert code == 0, out[-4000:]
    assert replaced.read_text() == plain.read_text(), "the job with a replacement ends elsewhere than one without loss"
    left = subprocess.run(["pgrep", "-f", str(EXAMPLE)], capture_output=True, text=True).stdout.split()
    assert not left, f"processes left behind: {left}"
