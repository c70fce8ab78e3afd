"""shoal's device path on a real GPU: tests/python/device_worker.py's suites on
CUDA, and the example's DDP training against NCCL's.

    .venv/bin/python -m pytest -q tests/gpu

Skipped, with the reason, when torch has no CUDA device. The ranks share the
GPUs there are (two processes may share one). CI has no GPU: there the same
suites run on the test accelerator (tests/python/test_device.py).
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "python"))

from harness import assert_all_passed, run_job  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA device (torch.cuda.is_available() is False)")

WORKER = ROOT / "tests" / "python" / "device_worker.py"
CUDA = {"SHOAL_TEST_DEVICE": "cuda"}
SMALL_PIECES = {**CUDA, "SHOAL_DEVICE_CHUNK_BYTES": "65536", "SHOAL_DEVICE_STAGING_BYTES": "262144"}


@pytest.mark.parametrize("world_size", [2, 3])
def test_every_operation_on_the_gpu(world_size):
    assert_all_passed(run_job("device", world_size, worker=WORKER, env=SMALL_PIECES, timeout=300))


def test_stream_semantics_on_the_gpu():
    assert_all_passed(run_job("streams", 2, worker=WORKER, env=SMALL_PIECES, timeout=300))


def test_bad_input_on_the_gpu():
    assert_all_passed(run_job("device_errors", 2, worker=WORKER, env=CUDA))


def test_ddp_and_fsdp2_on_the_gpu_train_as_on_cpu():
    assert_all_passed(run_job("device_ddp", 2, worker=WORKER, env=CUDA, timeout=300))


def _example_losses(backend):
    cmd = [str(ROOT / "build" / "bin" / "shoalrun"), "--standalone", "--nproc-per-node", "2",
           str(ROOT / "examples" / "train_ddp.py"), "--backend", backend, "--device", "cuda",
           "--epochs", "3", "--min-accuracy", "0", "--checkpoint", f"build/test-scratch/gpu-{backend}.pt"]
    env = dict(os.environ, SHOAL_PYTHON=sys.executable, PYTHONPATH=str(ROOT / "python"))
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return [float(x) for x in re.findall(r"train loss ([0-9.]+)", out.stdout)]


def test_example_trains_as_with_nccl():
    shoal, nccl = _example_losses("shoal"), _example_losses("nccl")
    assert len(shoal) == len(nccl) == 3, (shoal, nccl)
    assert shoal == pytest.approx(nccl, rel=1e-3, abs=1e-3), (shoal, nccl)
