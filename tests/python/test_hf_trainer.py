"""transformers.Trainer on smddp: the route docs/torch.md ("Hugging Face Trainer") documents.

Two jobs of 2 ranks under shoalrun run tests/python/hf_trainer_worker.py: a
tiny GPT-2 (random weights from a config, seeded) trains for 4 steps on a
synthetic dataset, once on Gloo and once on smddp (shoal's engine), each time
with the script making the process group before TrainingArguments(use_cpu=True).
The logged losses and the trained weights must be bitwise equal: each step's
gradients are allreduced over 2 ranks (a sum of two addends is the same
whatever the algorithm) and the logged loss is an all_gather then a local mean,
so any difference is a communication bug, not rounding.

Needs transformers and accelerate (tools/setup/deps.sh --python installs the
pinned versions); skipped, with the reason, without them.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

missing = [m for m in ("transformers", "accelerate") if importlib.util.find_spec(m) is None]
if missing:
    pytest.skip(f"{' and '.join(missing)} not installed (tools/setup/deps.sh --python installs them)",
                allow_module_level=True)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
WORKER = HERE / "hf_trainer_worker.py"
WORLD = 2
STEPS = 4
SAMPLES = 16


def shoalrun_path():
    return Path(os.environ.get("SHOALRUN", ROOT / "build" / "bin" / "shoalrun"))


def job_env(out):
    """The caller's environment without anything that says how to launch or where it runs
    (SageMaker's SM_*, accelerate's ACCELERATE_*, torchrun's ranks), and with this tree's package first."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SM_", "ACCELERATE_", "SMDATAPARALLEL_", "TORCHELASTIC_"))
           and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                         "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES")}
    env.update(SHOAL_PYTHON=sys.executable, OMP_NUM_THREADS="1", SHOAL_TIMEOUT_S="60",
               PYTHONPATH=str(ROOT / "python") + os.pathsep + os.environ.get("PYTHONPATH", ""),
               HF_HOME=str(out / "hf-home"), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return env


def run_trainer_job(backend, out, seed=1234, timeout=150):
    """shoalrun --standalone --nproc-per-node 2 hf_trainer_worker.py; returns each rank's report."""
    exe = shoalrun_path()
    if not exe.exists():
        pytest.fail(f"{exe} is not built (ninja -C build shoalrun), or set SHOALRUN")
    out.mkdir(parents=True)
    log_path = out / "job.log"
    cmd = [str(exe), "--standalone", "--nproc-per-node", str(WORLD), str(WORKER),
           "--backend", backend, "--out", str(out), "--seed", str(seed)]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, env=job_env(out), cwd=out, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        try:
            rc = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()  # the workers die with it (parent-death signal)
            proc.wait()
            rc = f"killed after {timeout} s"
    text = log_path.read_text(errors="replace")
    assert rc == 0, f"{backend} job: shoalrun exit {rc}\n{text[-6000:]}"
    reports = []
    for r in range(WORLD):
        p = out / f"rank{r}.json"
        assert p.exists(), f"{backend} job: rank {r} wrote no report\n{text[-6000:]}"
        reports.append(json.loads(p.read_text()))
    return reports


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    base = tmp_path_factory.mktemp("hf-trainer")
    return {b: run_trainer_job(b, base / b) for b in ("gloo", "smddp")}


@pytest.mark.parametrize("backend", ["gloo", "smddp"])
def test_trainer_trains_ddp_on_the_scripts_group(jobs, backend):
    for r, rep in enumerate(jobs[backend]):
        assert rep["rank"] == r and rep["world_size"] == WORLD
        assert rep["group_backend"] == backend
        # The Trainer adopted the group: DDP over it, distributed mode, both ranks counted.
        assert rep["wrapper"] == "DistributedDataParallel"
        assert rep["ddp_group_backend"] == backend
        assert rep["parallel_mode"] == "ParallelMode.DISTRIBUTED"
        assert rep["args_world_size"] == WORLD
        assert len(rep["losses"]) == STEPS
        assert all(0.0 < x < 100.0 for x in rep["losses"]), rep["losses"]
    # Data parallel: each rank trained on its own half of the samples.
    seen = [set(rep["samples"]) for rep in jobs[backend]]
    assert all(len(rep["samples"]) == STEPS * 2 for rep in jobs[backend])
    assert not seen[0] & seen[1] and seen[0] | seen[1] == set(range(SAMPLES)), seen
    # DDP kept the replicas equal, and the logged loss is the same on every rank.
    assert jobs[backend][0]["weights"] == jobs[backend][1]["weights"]
    assert jobs[backend][0]["losses"] == jobs[backend][1]["losses"]


def test_losses_and_weights_equal_gloos_bitwise(jobs):
    gloo, smddp = jobs["gloo"], jobs["smddp"]
    for r in range(WORLD):
        assert smddp[r]["samples"] == gloo[r]["samples"], f"rank {r} was fed other samples"
        # Exact float equality (JSON keeps every bit of a double).
        assert smddp[r]["losses"] == gloo[r]["losses"], \
            f"rank {r}: smddp {smddp[r]['losses']} gloo {gloo[r]['losses']}"
        assert smddp[r]["weights"] == gloo[r]["weights"], f"rank {r}: trained weights differ"


def test_what_accelerate_and_transformers_do_with_the_name(jobs):
    """The limits docs/torch.md states, for the pinned versions (tools/setup/deps.sh).

    A version bump that changes one of these must change that table too."""
    for rep in jobs["smddp"]:
        # TrainingArguments' argument parser offers no other backend.
        assert "smddp" not in rep["ddp_backend_choices"] and "gloo" in rep["ddp_backend_choices"]
        # accelerate derives the CPU backend itself (gloo, or mpi) and refuses any other name.
        assert rep["ddp_backend_error"] == \
            "ValueError: Your assigned backend smddp is not available, please use gloo"
        # It labels the adopted group "gloo" whatever it is.
        assert rep["accelerate_backend_label"] == "gloo"
        # Without use_cpu on a machine without an accelerator: no distributed mode, no DDP.
        assert rep["without_use_cpu_parallel_mode"] == "ParallelMode.NOT_PARALLEL"
