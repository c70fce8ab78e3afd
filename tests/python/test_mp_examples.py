"""The SageMaker model-parallel v1 example scripts (examples/smp) run as users run them, through
shoalrun, on 2 processes:

- the auto- and manual-partition scripts, written for a GPU (``torch.cuda.set_device``,
  ``.to(device)``, ``torch.autocast("cuda")``), on the test accelerator with only the device
  name changed ("cuda" -> "fakegpu"); tests/gpu runs them unchanged on CUDA;
- the GPT-2 script (pipeline, fp16 with dynamic loss scaling, activation checkpointing,
  smp.nn.FusedLayerNorm, clip_master_grads, a partial checkpoint) trains, then resumes from
  its checkpoint where it left off; with tensor parallelism (the model turned into
  smp.nn.DistributedTransformerLMHead) it trains too.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHOALRUN = ROOT / "build" / "bin" / "shoalrun"
EXAMPLES = ROOT / "examples" / "smp"


def _run(args, timeout=600):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "python"), str(ROOT / "tests" / "python")]),
               OMP_NUM_THREADS="1", SHOAL_TIMEOUT_S="120")
    cmd = [str(SHOALRUN), "--standalone", "--nproc-per-node", "2", "--no-python", sys.executable, *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(map(str, args))} failed ({proc.returncode}):\n{out[-4000:]}"
    return out


@pytest.mark.parametrize("script", ["auto_partition.py", "manual_partition.py"])
def test_gpu_scripts_run_on_the_test_device_with_the_device_name_changed(script, tmp_path):
    text = (EXAMPLES / script).read_text()
    assert "torch.cuda.set_device(smp.local_rank())" in text and '.to(device)' in text
    copy = tmp_path / script
    copy.write_text(text.replace("cuda", "fakegpu"))
    (tmp_path / "synthetic.py").write_text((EXAMPLES / "synthetic.py").read_text())
    load = f"import fakegpu, runpy, sys; fakegpu.load(); sys.argv = [{str(copy)!r}]; " \
           f"sys.path.insert(0, {str(tmp_path)!r}); " \
           f"runpy.run_path({str(copy)!r}, run_name='__main__')"
    out = _run(["-c", load])
    done = re.search(r"done: loss ([\d.]+) -> ([\d.]+)", out)
    assert done, out[-3000:]
    assert float(done.group(2)) < 0.5 * float(done.group(1))


def test_gpt2_script_trains_in_fp16_and_resumes_from_its_checkpoint(tmp_path):
    ck = tmp_path / "ckpt"
    out = _run([str(EXAMPLES / "gpt2.py"), "--steps", "25", "--checkpoint-dir", str(ck)])
    first, last = map(float, re.search(r"done: 25 steps, loss ([\d.]+) -> ([\d.]+) \(ok\)", out).groups())
    assert (ck / "newest").read_text() == "step25"
    out = _run([str(EXAMPLES / "gpt2.py"), "--steps", "3", "--checkpoint-dir", str(ck), "--resume", "1"])
    assert "resumed at step 25" in out
    again = float(re.search(r"done: 28 steps, loss ([\d.]+)", out).group(1))
    # the first step after resuming starts from the checkpoint's model, not from a fresh one's loss
    assert again < 0.5 * first, (first, last, again)


def test_gpt2_script_trains_with_tensor_parallelism():
    out = _run([str(EXAMPLES / "gpt2.py"), "--pipeline-parallel-degree", "1", "--tensor-parallel-degree", "2",
                "--microbatches", "2", "--steps", "20", "--layers", "2"])
    assert "tensor-parallel 2 x 1 replicas" in out, out[-2000:]
    assert re.search(r"done: 20 steps, loss [\d.]+ -> [\d.]+ \(ok\)", out), out[-3000:]
