"""Bad input to the torch backend never goes out (issue 6).

A table of bad calls (bad_input_worker.py) for every collective of the
`shoal` backend: wrong devices, dtypes mixed within a call, roots and peers
out of range, bad split sizes, wrong list lengths and element counts, ops that
do not fit the dtype, overlapping input and output. Each raises from the call
with a message naming the argument; none sends anything (the other ranks stay
in step, the group's sequence number does not move); non-contiguous tensors
are handled, not refused; calls after an abort or after
destroy_process_group fail with a clear error instead of crashing.
"""

import pytest

from harness import HERE, assert_all_passed, run_job


@pytest.mark.parametrize("world_size", [2, 3])
def test_bad_input_table(world_size):
    results = run_job("bad_input", world_size, worker=HERE / "bad_input_worker.py")
    passed = assert_all_passed(results)
    assert len(passed) > 40, passed  # rank 0 ran the whole table
