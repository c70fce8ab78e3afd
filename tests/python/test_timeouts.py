"""Timeouts of the torch backend as PyTorch defines them (timeout_worker.py):
0 fails at once, unset means the group's timeout, a failed monitored barrier
leaves its communicators working once its own deadline is long past, and a
timed-out barrier fails within its timeout, naming the rank that never came;
and a rank late to a group's first collective leaves the others' stderr free of
torch's store warnings."""

import pytest

from harness import HERE, assert_all_passed, run_job


@pytest.mark.serial  # a timed-out barrier fails within 0.95-1.35 s
def test_timeouts_as_pytorch_defines_them():
    passed = assert_all_passed(run_job("timeouts", 3, worker=HERE / "timeout_worker.py", timeout=120))
    assert len(passed) == 5, passed
