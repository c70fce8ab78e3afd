"""shoal's device path on a real GPU: tests/python/device_worker.py's suites on
CUDA, and the example's DDP training against NCCL's (Gloo's CUDA path where
there is one GPU: NCCL refuses two ranks on one device).

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


def test_failures_on_the_gpu_name_the_rank():
    assert_all_passed(run_job("device_failures", 2, worker=WORKER, env=SMALL_PIECES, timeout=120))


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


def test_example_trains_as_with_the_reference_backend():
    reference = "nccl" if torch.cuda.device_count() >= 2 else "gloo"
    shoal, ref = _example_losses("shoal"), _example_losses(reference)
    assert len(shoal) == len(ref) == 3, (reference, shoal, ref)
    assert shoal == pytest.approx(ref, rel=1e-3, abs=1e-3), (reference, shoal, ref)


# ----------------------------------------------------------------- the model-parallel library on the GPU

MP_WORKER = ROOT / "tests" / "python" / "mp_device_worker.py"


def test_smp_partitions_on_the_gpu_train_as_on_cpu(tmp_path):
    passed = assert_all_passed(run_job("place:2", 2, worker=MP_WORKER, env={**CUDA, "TEST_CKPT_DIR": str(tmp_path)},
                                       timeout=400))
    assert len(passed) == 4, passed


def test_smp_fp16_bf16_and_overflow_on_the_gpu():
    passed = assert_all_passed(run_job("half", 2, args=["overflow"], worker=MP_WORKER, env=CUDA, timeout=600))
    assert len(passed) == 3, passed


@pytest.mark.parametrize("script", ["auto_partition.py", "manual_partition.py", "gpt2.py"])
def test_smp_example_scripts_run_unchanged_on_the_gpu(script):
    cmd = [str(ROOT / "build" / "bin" / "shoalrun"), "--standalone", "--nproc-per-node", "2",
           str(ROOT / "examples" / "smp" / script)]
    env = dict(os.environ, SHOAL_PYTHON=sys.executable, PYTHONPATH=str(ROOT / "python"))
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "done:" in out.stdout
