"""Bad input to the command-line tools never starts anything (issue 6).

shoalrun: the bad flags, worker counts, scripts and cluster descriptions a
user can produce that test_cli.py does not cover yet: each is one line on
stderr naming the flag or variable, exit code 2, nothing on stdout, and (the
`job` fixture checks it) no process left behind. Overlapping cluster
descriptions that are not contradictions resolve by the documented order
(flags, SageMaker, Slurm, Open MPI) and --dry-run says which one won.

shoal-perf: bad flags, sizes, ops, dtypes, algorithms and roots: a clear
message naming the flag and a non-zero exit, before any rank starts.
"""
import os
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, one_error_line

OK_SCRIPT = "print('ok')\n"


@pytest.mark.parametrize("args,env,expect", [
    # worker counts
    (["--nproc-per-node", "-1", "w.py"], {}, "--nproc-per-node must be at least 1 (got -1)"),
    (["--nproc-per-node", "1.5", "w.py"], {}, "--nproc-per-node: '1.5' is not an integer"),
    # (--dry-run: a launcher without the limit prints instead of forking 100000 workers)
    (["--dry-run", "--nproc-per-node", "100000", "w.py"], {}, "--nproc-per-node: 100000 workers on one node is more"),
    (["--nproc-per-node", "gpu", "w.py"], {"CUDA_VISIBLE_DEVICES": "-1"}, "--nproc-per-node gpu: no GPU"),
    (["--dry-run", "w.py"], {"SM_HOSTS": '["algo-1"]', "SM_CURRENT_HOST": "algo-1", "SM_NUM_GPUS": "5000"},
     "5000 workers on one node is more than"),
    # numbers
    (["--max-restarts", "-1", "w.py"], {}, "--max-restarts: must be >= 0, got -1"),
    (["--term-timeout", "-5", "w.py"], {}, "--term-timeout: must be >= 0, got -5"),
    (["--rdzv-timeout", "0", "w.py"], {}, "--rdzv-timeout: must be > 0, got 0"),
    (["--rdzv-timeout", "soon", "w.py"], {}, "--rdzv-timeout: 'soon' is not a number"),
    (["--master-port", "abc", "w.py"], {}, "--master-port"),
    (["--master-port", "-1", "w.py"], {}, "--master-port -1 is not a TCP port"),
    (["--node-rank", "x", "--nnodes", "2", "w.py"], {}, "--node-rank"),
    (["--nnodes", "2", "--node-rank", "0", "--rdzv-port", "70000", "w.py"], {}, "--rdzv-port 70000 is not a TCP port"),
    (["--nnodes"], {}, "--nnodes"),
    # files
    (["--log-dir", "/proc/nonexistent/x", "w.py"], {}, "--log-dir /proc/nonexistent/x"),
    (["--secret-file", "/nonexistent/secret", "w.py"], {}, "--secret-file /nonexistent/secret: cannot read it"),
    (["sub"], {}, "'sub' is a directory without __main__.py"),
    (["--no-python", "sub"], {}, "command 'sub' not found (or not executable)"),
    (["-m"], {}, "no module given"),
    # contradictory cluster descriptions
    (["--standalone", "--node-rank", "1", "w.py"], {}, "--standalone runs one node; --node-rank must be 0"),
    (["--nnodes", "2", "--node-rank", "1", "--master-addr", "", "w.py"], {}, "--master-addr is empty"),
    (["--nnodes", "3", "--node-rank", "3", "w.py"], {"SM_HOSTS": '["a","b","c"]', "SM_CURRENT_HOST": "a"},
     "--node-rank 3 is out of range for --nnodes 3"),
    (["w.py"], {"SLURM_NODEID": "0", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "n1"}, "lists 1 hosts"),
])
def test_shoalrun_bad_input(job, args, env, expect):
    job.script("w.py", OK_SCRIPT)
    (job.dir / "sub").mkdir()
    r = job.run(*args, env=job.env(**env))
    line = one_error_line(r)
    assert expect in line, line
    assert r.out == ""


@pytest.mark.parametrize("env,source,nnodes", [
    # flags first, then SageMaker, then Slurm (docs/launcher.md)
    ({"SM_HOSTS": '["a","b","c"]', "SM_CURRENT_HOST": "b"}, "flags", 2),
    ({}, "flags", 2),
])
def test_shoalrun_flags_win_over_the_environment(job, env, source, nnodes):
    job.script("w.py", OK_SCRIPT)
    r = job.run("--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1", "--dry-run", "w.py",
                env=job.env(**env))
    assert r.rc == 0, r.err
    assert f"source={source}\n" in r.out and f"nnodes={nnodes}\n" in r.out


def test_shoalrun_sagemaker_wins_over_slurm(job):
    job.script("w.py", OK_SCRIPT)
    r = job.run("--dry-run", "w.py", env=job.env(SM_HOSTS='["a","b"]', SM_CURRENT_HOST="b", SLURM_NODEID="2",
                                                  SLURM_NNODES="3", SLURM_JOB_NODELIST="n[1-3]"))
    assert r.rc == 0, r.err
    assert "source=sagemaker\n" in r.out and "nnodes=2\n" in r.out and "node_rank=1\n" in r.out


# ---------------------------------------------------------------- shoal-perf

def shoal_perf_path():
    return Path(os.environ.get("SHOAL_PERF", REPO / "build" / "bin" / "shoal-perf"))


@pytest.mark.parametrize("args,expect", [
    (["-b", "-5"], "-b: '-5' is not a size"),
    (["-b", "nan"], "-b: 'nan' is not a size"),
    (["-e", "1e30"], "-e: '1e30' is not a size"),
    (["-e", "8X"], "-e: unknown suffix 'X'"),
    (["-b", "64", "-e", "8"], "-e (8) is smaller than -b (64)"),
    (["-b", "0", "-e", "0"], "-e: 0 bytes leaves no size to measure"),
    (["--dtype", "float33"], "--dtype: unknown dtype 'float33'"),
    (["--redop", "avgg"], "--redop: unknown op 'avgg'"),
    (["--redop", "band", "--dtype", "float32"], "--redop band: bitwise op 'band' is not defined for float32"),
    (["--redop", "premul_sum", "--dtype", "int32"], "--redop premul_sum: premul_sum needs a floating dtype, got int32"),
    (["--redop", "avg", "--dtype", "bool", "--op", "reduce_scatter"], "--redop avg: avg is not defined for bool"),
    (["--algo", "bogus"], "--algo bogus: not an algorithm of allreduce (known: ring"),
    (["--op", "barrier", "--algo", "ring"], "--algo ring: not an algorithm of barrier"),
    (["--op", "sendrecv", "--algo", "ring"], "--algo: sendrecv has no algorithms"),
    (["--op", "allgatherv"], "--op"),
    (["--np", "0"], "--np"),
    (["--root", "-1"], "--root"),
    (["-f", "1"], "--stepfactor"),
    (["--iters", "0"], "--iters"),
    (["--format", "xml"], "--format"),
    (["unexpected"], "unexpected"),
    (["--op", "broadcast", "--root", "2", "-b", "8", "-e", "8"], "--root 2 is out of range for 2 ranks"),
])
def test_shoal_perf_bad_input(args, expect):
    exe = shoal_perf_path()
    if not exe.exists():
        pytest.fail(f"{exe} is not built (ninja -C build shoal-perf), or set SHOAL_PERF")
    argv = [str(exe), *args] if "--np" in args else [str(exe), "--np", "2", *args]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert p.returncode != 0, p.stdout + p.stderr
    assert expect in p.stderr, p.stderr
    assert "#wrong" not in p.stdout or "--root" in expect  # refused before any measurement


def test_shoal_perf_outside_a_job_names_the_variable():
    exe = shoal_perf_path()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    p = subprocess.run([str(exe), "-b", "8", "-e", "8"], capture_output=True, text=True, timeout=60, env=env,
                       stdin=subprocess.DEVNULL)
    assert p.returncode != 0
    assert "RANK: not set" in p.stderr, p.stderr
