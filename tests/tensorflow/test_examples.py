"""The TensorFlow examples run as users run them, through shoalrun: the
SageMaker model-parallel library's three MNIST scripts (automatic and manual
partitioning, the Horovod hybrid) and the data-parallel one, on fewer images;
each exits 1 unless it reaches its accuracy bar."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tensorflow", reason="the TensorFlow tests need tensorflow (make setup-test installs it)")
ROOT = Path(__file__).resolve().parents[2]
SHOALRUN = ROOT / "build" / "bin" / "shoalrun"


@pytest.mark.parametrize("script,nproc,args", [
    ("smp_tf2_auto.py", 2, ["--epochs", "2"]),
    ("smp_tf2_manual.py", 2, ["--epochs", "2"]),
    ("smp_tf2_hvd.py", 4, ["--epochs", "2"]),
    ("sdp_tf2_mnist.py", 2, ["--steps", "50"]),
])
def test_example(script, nproc, args, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"), OMP_NUM_THREADS="1", SHOAL_TIMEOUT_S="120")
    env.pop("SM_HP_MP_PARAMETERS", None)
    cmd = [str(SHOALRUN), "--standalone", "--nproc-per-node", str(nproc), "--no-python", sys.executable,
           str(ROOT / "examples" / "tensorflow" / script), "--samples", "1024", *args]
    if script.startswith("smp_tf2_auto"):
        cmd += ["--checkpoint-dir", str(tmp_path)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"{script} exited with {r.returncode}:\n{out[-4000:]}"
    assert "accuracy" in r.stdout, r.stdout
