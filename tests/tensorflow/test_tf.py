"""TensorFlow 2 on shoal: the ops (tf_worker.py) and the model-parallel API
(smp_tf_worker.py), as multi-process jobs (tests/python/harness.py). Needs
tensorflow and the ops library (`make build` builds it when tensorflow is
installed; `make setup-test` installs it)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness import ROOT, assert_all_passed, free_port, run_job

pytest.importorskip("tensorflow", reason="the TensorFlow tests need tensorflow (make setup-test installs it)")
HERE = Path(__file__).resolve().parent
if not (HERE.parents[1] / "python" / "shoal" / "tensorflow" / "_ops.so").exists():
    pytest.fail("python/shoal/tensorflow/_ops.so is missing: `make build` builds it when tensorflow is installed",
                pytrace=False)
OPS, SMP = HERE / "tf_worker.py", HERE / "smp_tf_worker.py"


@pytest.mark.parametrize("world_size", [2, 3])
def test_collectives(world_size):
    assert len(assert_all_passed(run_job("collectives", world_size, worker=OPS))) == 10


def test_data_parallel_training_equals_one_process():
    assert len(assert_all_passed(run_job("dp", 2, worker=OPS))) == 3


def test_mismatched_shapes_fail_on_every_rank():
    assert_all_passed(run_job("mismatch", 2, worker=OPS))


def test_pipeline_equals_one_process(tmp_path):
    passed = assert_all_passed(run_job("pipeline", 2, worker=SMP, env={"SHOAL_TEST_CKPT": str(tmp_path)}))
    assert len(passed) == 10, passed
    assert (tmp_path / "mp_rank_0" / "checkpoint").exists() and (tmp_path / "mp_rank_1" / "checkpoint").exists()


def test_pipeline_with_replicas_equals_one_process():
    assert len(assert_all_passed(run_job("hybrid", 4, worker=SMP))) == 2


def test_bad_input_is_refused_on_every_rank():
    assert len(assert_all_passed(run_job("bad_input", 2, worker=SMP))) == 6


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs Open MPI's mpirun")
def test_ranks_from_mpirun():
    """Started by mpirun (no RANK / WORLD_SIZE: Open MPI's variables stand in), as
    a Horovod job is; the data-parallel suite runs as under shoalrun."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1",
               SHOAL_TIMEOUT_S="60", PYTHONPATH=f"{ROOT / 'python'}{os.pathsep}{ROOT / 'tests' / 'python'}")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        env.pop(k, None)
    cmd = ["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none", "-x", "MASTER_ADDR", "-x", "MASTER_PORT",
           "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS", "-x", "SHOAL_TIMEOUT_S", sys.executable, str(OPS), "dp"]
    if os.geteuid() == 0:
        cmd[1:1] = ["--allow-run-as-root"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    # mpirun forwards both ranks' output to one stream: two lines may share one
    results, dec, at = [], json.JSONDecoder(), r.stdout.find("RESULT ")
    while at >= 0:
        obj, end = dec.raw_decode(r.stdout, at + len("RESULT "))
        results.append(obj)
        at = r.stdout.find("RESULT ", end)
    assert r.returncode == 0 and len(results) == 2, r.stdout[-3000:] + r.stderr[-3000:]
    results.sort(key=lambda x: x["rank"])
    assert len(assert_all_passed(results)) == 3
