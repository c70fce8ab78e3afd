"""What PyTorch's suite and tooling expect of a backend, beyond the collectives
(parity_worker.py): sparse all_reduce, profiler events, monitored_barrier
through torch's function, DDP's log naming the backend, timeout phrases."""

from harness import HERE, assert_all_passed, run_job


def test_held_to_gloos_standard():
    passed = assert_all_passed(run_job("parity", 2, worker=HERE / "parity_worker.py", timeout=120))
    assert len(passed) >= 7, passed
