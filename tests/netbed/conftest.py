"""Fixtures for the net bed tests (tools/netbed, imported as a package from the repository
root: pyproject.toml puts the root on pytest's path).

`bed` is one 2-host bed (network namespaces on a bridge, 10 Gbit/s links) shared by
the module; it is removed by the fixture's finalizer whatever the tests do. Where a
bed cannot be built (not root, no iproute2, `ip netns add` refused), every test that
needs one is skipped, naming what failed.
"""
import os
import subprocess
from pathlib import Path

import pytest

from tools import netbed

REPO = Path(__file__).resolve().parents[2]

SHOAL_PERF = REPO / "build" / "bin" / "shoal-perf"
VENV_PY = REPO / ".venv" / "bin" / "python"


def root_network_state():
    """The root namespace's links, IPv4 addresses and routes, as text (to compare)."""
    out = {}
    for key, argv in (("links", ["ip", "-o", "link", "show"]),
                      ("addrs", ["ip", "-o", "-4", "addr", "show"]),
                      ("routes", ["ip", "-4", "route", "show", "table", "all"])):
        out[key] = subprocess.run(argv, capture_output=True, text=True, timeout=20).stdout
    return out


@pytest.fixture(scope="session")
def netns_ok():
    why = netbed.probe()
    if why is not None:
        pytest.skip(f"net bed unavailable: {why}")


@pytest.fixture(scope="session")
def shoal_perf():
    if not SHOAL_PERF.exists():
        pytest.fail(f"{SHOAL_PERF} not found: build it first (make build)")
    return SHOAL_PERF


@pytest.fixture(scope="module")
def root_before():
    return root_network_state()


@pytest.fixture(scope="module")
def bed(netns_ok, root_before):
    b = netbed.NetBed(hosts=2, rate="10gbit", delay_us=50)
    try:
        b.up()
    except netbed.NetBedUnavailable as e:
        pytest.skip(f"net bed unavailable: {e.reason}")
    try:
        yield b
    finally:
        b.down()
        left = [n for n in netbed.list_netns() if n.startswith(b.prefix + "-")]
        assert not left, f"namespaces left behind: {left}"


@pytest.fixture(scope="session")
def venv_python():
    if not VENV_PY.exists():
        pytest.skip(f"{VENV_PY} not found (make setup-python)")
    r = subprocess.run([str(VENV_PY), "-c", "import shoal.torch"], capture_output=True,
                       text=True, timeout=120, cwd="/")
    if r.returncode != 0:
        pytest.skip("`import shoal.torch` fails in the venv: "
                    + (r.stderr.strip().splitlines() or ["?"])[-1])
    return VENV_PY


def assert_every_rank(res, world):
    """The job ran exactly ranks 0..world-1: a check looping over res.ranks (or
    JobResult.ok, true for no ranks at all) says nothing about the ranks that never started."""
    got = sorted(r.rank for r in res.ranks)
    assert got == list(range(world)), f"ranks of the job: {got}, want 0..{world - 1}"


def env_without(*names):
    return {k: v for k, v in os.environ.items() if k not in names}
