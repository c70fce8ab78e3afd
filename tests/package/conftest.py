"""Fixtures for the package tests: shoal as users install it (docs/install.md).

- `wheel`: `pip wheel . --no-build-isolation --no-deps` of this checkout, run by
  the development venv (.venv, which has torch). It builds from the
  development tree (SHOAL_CMAKE_BUILD_DIR, default build/; `make
  test-package` builds it first), so nothing is compiled again here: what is
  tested is what the wheel holds and how it installs, not the compiler.
- `venv`: a fresh virtual environment with the same torch, installed by pip
  from the machine's wheel (pip's own configuration; no torch is built or
  pulled from elsewhere), and the wheel installed into it. Removed at the end.
- `prefix`: `cmake --install` of the development tree into a temporary prefix.

Commands for the installed shoal run from / with an environment that holds
nothing of the checkout (no PYTHONPATH, no LD_LIBRARY_PATH, PATH = the venv's
bin and the system's). Temporary files go under TMPDIR (the Makefile's
scratch folder).
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # tests/ports.py
from ports import free_port, free_ports  # noqa: E402,F401

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("SHOAL_CMAKE_BUILD_DIR", REPO / "build")).resolve()
DEV_PYTHON = REPO / ".venv" / "bin" / "python"


def run(args, *, env=None, cwd="/", timeout=120, check=True):
    """Runs a command, returns the CompletedProcess; fails the test with its output if it fails."""
    r = subprocess.run([str(a) for a in args], env=env, cwd=cwd, capture_output=True, text=True,
                       timeout=timeout, stdin=subprocess.DEVNULL)
    if check and r.returncode != 0:
        pytest.fail(f"{' '.join(map(str, args))} exited with {r.returncode}\n"
                    f"--- stdout\n{r.stdout[-6000:]}\n--- stderr\n{r.stderr[-6000:]}")
    return r


def outside_env(bin_dir=None, **extra):
    """An environment that holds nothing of the checkout."""
    keep = ("HOME", "LANG", "LC_ALL", "TMPDIR", "PIP_CONFIG_FILE", "PIP_CACHE_DIR", "SHOAL_TEST_JOB")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env["PATH"] = (f"{bin_dir}:" if bin_dir else "") + "/usr/local/bin:/usr/bin:/bin"
    env.update(extra)
    return env


def dev_torch_version():
    return run([DEV_PYTHON, "-c", "import torch; print(torch.__version__)"]).stdout.strip()


@pytest.fixture(scope="session")
def wheel(tmp_path_factory):
    if not (BUILD / "CMakeCache.txt").exists():
        pytest.fail(f"{BUILD} is not a configured build tree (make build)")
    out = tmp_path_factory.mktemp("dist")
    env = dict(os.environ, SHOAL_CMAKE_BUILD_DIR=str(BUILD))
    run([DEV_PYTHON, "-m", "pip", "wheel", REPO, "--no-build-isolation", "--no-deps", "--no-cache-dir", "-q",
         "-w", out], env=env, cwd=REPO, timeout=900)
    wheels = list(out.glob("shoal-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="session")
def venv(tmp_path_factory, wheel):
    root = tmp_path_factory.mktemp("venv") / "env"
    base = getattr(sys, "_base_executable", None) or shutil.which("python3")
    run([base, "-m", "venv", root])
    torch_version = dev_torch_version()
    env = outside_env(root / "bin")
    run([root / "bin" / "pip", "install", "-q", f"torch=={torch_version}"], env=env, timeout=600)
    # With its dependencies: the wheel's torch requirement must be met by the torch there.
    run([root / "bin" / "pip", "install", "-q", wheel], env=env, timeout=300)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def prefix(tmp_path_factory):
    p = tmp_path_factory.mktemp("prefix")
    run(["cmake", "--install", BUILD, "--prefix", p])
    return p
