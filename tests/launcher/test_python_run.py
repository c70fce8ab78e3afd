"""`python -m shoal.run`, as `python -m torch.distributed.run` is used.

The package of this checkout (python/) is put first on PYTHONPATH, so that
shoal.run is this tree's; it finds the binary of this tree's build. Workers
run under the interpreter that ran shoal.run.
"""
import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, assert_ranks_reported

SHOW = "import os, sys\nprint(f\"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} python {sys.executable}\")\n"


def run_module(job, python, args, env=None, pythonpath=REPO / "python"):
    e = job.env(PYTHONPATH=pythonpath, **(env or {}))
    return subprocess.run([str(python), "-m", "shoal.run", *map(str, args)], cwd=job.dir, env=e,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_python_m_shoal_run_starts_the_job(job):
    job.script("show.py", SHOW)
    r = run_module(job, sys.executable, ["--nproc_per_node=2", "--standalone", "show.py"])
    assert r.returncode == 0, r.stderr
    assert_ranks_reported(r.stdout, 2)
    assert r.stdout.count(f"python {sys.executable}") == 2, r.stdout


def test_python_m_shoal_run_passes_every_argument(job):
    job.script("w.py", "pass\n")
    r = run_module(job, sys.executable, ["--dry-run", "--nnodes=2", "--node_rank", "1", "--master_addr", "10.0.0.1",
                                         "--rdzv_id", "x", "w.py"])
    assert r.returncode == 0, r.stderr
    got = dict(line.split("=", 1) for line in r.stdout.splitlines())
    assert (got["nnodes"], got["node_rank"], got["master_addr"], got["rdzv_id"]) == ("2", "1", "10.0.0.1", "x")


def test_python_m_shoal_run_without_a_binary(job):
    # A copy of the package where nothing provides shoalrun: not beside it,
    # no build tree, not on PATH, not in the interpreter's prefix.
    pkg = job.dir / "site" / "shoal"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    shutil.copy(REPO / "python" / "shoal" / "run.py", pkg / "run.py")
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        pytest.skip("no system python3 outside the venv")
    prefix_bin = subprocess.run([python, "-c", "import sys; print(sys.prefix)"], capture_output=True,
                                text=True).stdout.strip() + "/bin/shoalrun"
    if os.path.exists(prefix_bin):
        pytest.skip(f"{prefix_bin} exists: the system python finds a shoalrun")
    r = run_module(job, python, ["--standalone", "w.py"], env={"PATH": "/usr/bin:/bin"},
                   pythonpath=job.dir / "site")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("shoal.run: error: no shoalrun binary found"), r.stderr
    assert "build it with `make build`" in lines[0]


def test_the_console_script_does_not_run_itself(job):
    # An install whose binary is missing (here: a copy of the package without
    # one) and whose console script `shoalrun` is on PATH: shoal.run must not
    # take the script for the binary and execute itself again and again.
    pkg = job.dir / "site" / "shoal"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    shutil.copy(REPO / "python" / "shoal" / "run.py", pkg / "run.py")
    bin_dir = job.dir / "bin"
    bin_dir.mkdir()
    script = bin_dir / "shoalrun"
    script.write_text(f"#!{sys.executable}\nimport sys\nfrom shoal.run import main\nsys.exit(main())\n")
    script.chmod(0o755)
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        pytest.skip("no system python3 outside the venv")
    job.script("w.py", "pass\n")
    r = run_module(job, python, ["--standalone", "w.py"], env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
                   pythonpath=job.dir / "site")
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("shoal.run: error: no shoalrun binary found"), r.stderr
