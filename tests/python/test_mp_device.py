"""shoal.modelparallel with the partitions on an accelerator: the test device "fakegpu"
(tests/fakegpu: CPU memory, asynchronous streams), as a CUDA GPU runs them (tests/gpu runs
the same worker on CUDA). See mp_device_worker.py for what each job checks."""

import shutil
import tempfile

import pytest

from harness import HERE, assert_all_passed, run_job

WORKER = HERE / "mp_device_worker.py"


@pytest.mark.parametrize("world_size, partitions", [(2, 2), (4, 2)])
def test_partitions_live_on_the_device_and_train_as_on_the_cpu(world_size, partitions):
    d = tempfile.mkdtemp(prefix="shoal-mp-device-")
    try:
        passed = assert_all_passed(run_job(f"place:{partitions}", world_size, worker=WORKER, timeout=400,
                                           env={"TEST_CKPT_DIR": d}))
    finally:
        shutil.rmtree(d, ignore_errors=True)
    assert len(passed) == 4, passed


def test_fp16_and_bf16_follow_fp32_and_an_overflow_skips_the_step_everywhere():
    passed = assert_all_passed(run_job("half", 2, args=["overflow"], worker=WORKER, timeout=600))
    assert len(passed) == 3, passed
