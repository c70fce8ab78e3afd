"""The rest of the SageMaker model-parallel v1 surface that real scripts and the Hugging Face
Trainer touch (mp_api_worker.py has the multi-process checks)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import HERE, assert_all_passed, run_job

ROOT = Path(__file__).resolve().parents[2]
WORKER = HERE / "mp_api_worker.py"
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                 "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RUN_ID")


@pytest.mark.parametrize("suite, checks", [
    ("pipeline", 3),      # a v1 script's optimizer surface on 2 partitions, cpu(), the fp16 and join refusals
    ("uneven", 2),        # join() with uneven batches across replicas, both divisors
    ("one_stage", 2),     # one stage outside @smp.step with replicas, and a comm hook
    ("delayed", 1),       # delayed initialisation materialises only the local partition
])
def test_surface_job(suite, checks):
    passed = assert_all_passed(run_job(suite, 2, worker=WORKER, timeout=300))
    assert len(passed) == checks, passed


def test_transformers_trainer_imports_under_the_sagemaker_model_parallel_environment():
    """transformers imports smdistributed.modelparallel.__version__, calls smp.init() and reads
    smp.state.cfg when SM_HP_MP_PARAMETERS and SM_FRAMEWORK_PARAMS say SageMaker MP is on."""
    # one process of its own: no launcher variables from the test runner's environment
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    env.update(PYTHONPATH=str(ROOT / "python"), SHOAL_TIMEOUT_S="60",
               SM_HP_MP_PARAMETERS=json.dumps({"partitions": 1, "microbatches": 2}),
               SM_FRAMEWORK_PARAMS=json.dumps({"sagemaker_mpi_enabled": True}))
    code = ("import transformers.trainer, transformers.modeling_utils\n"
            "from transformers.utils import is_sagemaker_mp_enabled\n"
            "import smdistributed.modelparallel.torch as smp\n"
            "assert is_sagemaker_mp_enabled()\n"
            "assert smp.state.cfg.microbatches == 2 and smp.state.cfg.fp16 is False\n"
            "print('imported')\n")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                          cwd="/", stdin=subprocess.DEVNULL)
    assert proc.returncode == 0 and "imported" in proc.stdout, proc.stderr[-3000:]


def test_a_world_size_without_a_rank_is_a_clear_error_not_a_hang():
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    env.update(PYTHONPATH=str(ROOT / "python"), WORLD_SIZE="2")
    code = "import shoal.modelparallel as smp\nsmp.init({})\n"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, cwd="/")
    assert proc.returncode != 0 and "WORLD_SIZE is 2 but RANK is not set" in proc.stderr, proc.stderr[-2000:]
