"""Tensor parallelism in smp (SageMaker v1's API): GPT-2 from a config with tp 2, tp 2 x pp 2 and
tp 2 x pp 2 x dp 2 trains to the losses and parameters of one process, on the CPU and on the test
accelerator; bf16 within a bound; checkpoints across layouts; bad input on every rank. The rank
layouts are checked against SageMaker's tables in test_mp_units.py; mp_tp_worker.py has the checks."""

import shutil
import tempfile

import pytest

from harness import HERE, assert_all_passed, run_job

WORKER = HERE / "mp_tp_worker.py"


@pytest.mark.parametrize("world_size, suites", [
    (2, ["early_module", "errors", "registration", "parity:tp=2,pp=1", "parity:tp=2,pp=1,prescaled=1",
         "half:tp=2"]),
    (4, ["parity:tp=2,pp=2", "parity:tp=2,pp=2,prescaled=1", "checkpoints"]),
    (8, ["parity:tp=2,pp=2"]),
    (4, ["parity:tp=2,pp=2,device=1"]),
    (4, ["sharded:kind=zero1", "sharded:kind=sdp"]),
], ids=["tp2", "tp2xpp2", "tp2xpp2xdp2", "tp2xpp2-device", "tp2xrdp2-sharded"])
def test_gpt2_tensor_parallel_layouts_train_as_one_process(world_size, suites):
    d = tempfile.mkdtemp(prefix="shoal-mp-tp-")
    try:
        passed = assert_all_passed(run_job("tp", world_size, args=suites, worker=WORKER, timeout=900,
                                           env={"TEST_CKPT_DIR": d}))
    finally:
        shutil.rmtree(d, ignore_errors=True)
    assert passed == suites, passed
