"""TensorFlow 2 on shoal: the ops (tf_worker.py) and the model-parallel API
(smp_tf_worker.py), as multi-process jobs (tests/python/harness.py). Needs
tensorflow and the ops library (`make build` builds it when tensorflow is
installed; `make setup-python` installs it)."""

import pytest

from harness import assert_all_passed, run_job
from pathlib import Path

pytest.importorskip("tensorflow", reason="the TensorFlow tests need tensorflow (make setup-python installs it)")
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
