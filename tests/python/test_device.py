"""shoal's device path (GPU tensors) on the test accelerator "fakegpu".

CI has no GPU; tests/fakegpu/fakegpu.cc is a PrivateUse1 device whose
streams run asynchronously on threads of their own, with events and a
caching allocator that reuses memory as CUDA's does. The same adapter code
that drives CUDA drives it (c10's device-generic streams and events), so
these jobs exercise the stream semantics for real: each check fails when a
stream wait, a held reference or a record_stream is removed (docs/torch.md,
"GPU tensors", says how that was checked). tests/gpu runs on a real GPU.
"""

import pytest

from harness import HERE, assert_all_passed, run_job

WORKER = HERE / "device_worker.py"
SMALL_PIECES = {"SHOAL_DEVICE_CHUNK_BYTES": "4096", "SHOAL_DEVICE_STAGING_BYTES": "16384"}


@pytest.mark.parametrize("world_size", [2, 3])
def test_every_operation_on_the_device(world_size):
    passed = assert_all_passed(run_job("device", world_size, worker=WORKER, env=SMALL_PIECES, timeout=240))
    assert len(passed) >= 15


def test_stream_semantics():
    assert_all_passed(run_job("streams", 2, worker=WORKER, env=SMALL_PIECES, timeout=240))


def test_bad_device_input_is_rejected_before_sending():
    assert_all_passed(run_job("device_errors", 2, worker=WORKER))


def test_failures_on_the_device_name_the_rank():
    assert_all_passed(run_job("device_failures", 2, worker=WORKER, env=SMALL_PIECES, timeout=120))


def test_ddp_and_fsdp2_on_the_device_train_as_on_cpu():
    assert_all_passed(run_job("device_ddp", 2, worker=WORKER, timeout=300))
