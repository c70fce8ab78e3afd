"""PyTorch's own distributed test suite
(torch.testing._internal.distributed.distributed_test) run against shoal,
with shoal admitted to every test Gloo is admitted to.

The suite keys its gates on the BACKEND environment variable, on
DistTestCases.backend_feature and on Gloo's name in a few places. shoal is
added to the "ddp", "subgroup" and "plugin" features before the suite is
imported, and the suite's module is loaded from its source with its Gloo
gates widened to shoal (_admit_as_gloo): `BACKEND != "gloo"` and
`BACKEND == "gloo"`, require_backend_is_available sets that name Gloo, and
the lists of backends whose profiler events it checks. Nothing else of the
suite changes. Every test runs, at 2 and 3 ranks; those that need CUDA, NCCL
or MPI, or more ranks, skip as they do for Gloo (docs/torch.md lists them).
Each test starts WORLD_SIZE rank processes (setUp, as upstream's
test_distributed_spawn.py does) that rendezvous through a file:// init method.

PyTorch's `_test_all_reduce_helper` (torch 2.13) never compares the reduced
tensor with its expected value, so a wrong sum passes every all_reduce test;
TestShoalBackend runs it and then checks the value itself.

A runner that starts no rank makes every test pass without running anything,
so each test also checks, after joining, that WORLD_SIZE processes ran and
that every one of them exited cleanly or with the same skip code as rank 0
(upstream checks rank 0's exit code only).
"""

import importlib.util
import os
import shutil
import sys
import tempfile
import types

import pytest
import torch
import torch.distributed as dist

pytest.importorskip("expecttest", reason="PyTorch's test suite needs expecttest (pip install expecttest)")

os.environ["BACKEND"] = "shoal"
os.environ.setdefault("WORLD_SIZE", "2")
# The forkserver imports this module by name: it must find it.
_HERE = os.path.dirname(os.path.abspath(__file__))
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_HERE, os.environ.get("PYTHONPATH")) if p)
_TEMP_DIR = tempfile.mkdtemp(prefix="shoal-torch-suite-")
os.environ.setdefault("TEMP_DIR", _TEMP_DIR)
os.environ.setdefault("OMP_NUM_THREADS", "1")

import shoal.torch  # noqa: E402,F401  (registers the backend, in the rank processes too)
from torch.testing._internal.common_distributed import TEST_SKIPS, DistTestCases  # noqa: E402

for _feature in ("ddp", "subgroup", "plugin"):
    DistTestCases.backend_feature[_feature].add("shoal")



def _admit_as_gloo():
    """The suite's module, loaded from its source with its Gloo gates admitting shoal."""
    spec = importlib.util.find_spec("torch.testing._internal.distributed.distributed_test")
    with open(spec.origin) as f:
        src = f.read()
    gates = [
        ('BACKEND != "gloo"', 'BACKEND not in ("gloo", "shoal")'),
        ('BACKEND == "gloo"', 'BACKEND in ("gloo", "shoal")'),
        ("    if BACKEND not in backends:\n",
         "    if BACKEND not in backends and not (BACKEND == 'shoal' and 'gloo' in backends):\n"),
        ("    dist.Backend.GLOO,\n", "    dist.Backend.GLOO,\n    'shoal',\n"),  # profiler allowlists
    ]
    for old, new in gates:
        assert old in src, f"torch's suite no longer has {old!r}: review _admit_as_gloo"
        src = src.replace(old, new)
    module = types.ModuleType(spec.name)
    module.__file__ = spec.origin
    sys.modules[spec.name] = module
    exec(compile(src, spec.origin, "exec"), module.__dict__)  # noqa: S102
    return module


_suite = _admit_as_gloo()
DistributedTest, TestDistBackend = _suite.DistributedTest, _suite.TestDistBackend

# The suite skips its "*_group" tests below 8 ranks: these run at 8.
GROUP_TESTS = [
    "test_broadcast_group", "test_all_reduce_group_sum", "test_reduce_group_sum", "test_all_gather_group",
    "test_gather_group", "test_scatter_group", "test_barrier_group",
]
# conftest.py deselects, in a class listed here, the tests not listed.
SELECTION = {"TestShoalBackendEightRanks": GROUP_TESTS}


class _WouldRun(BaseException):
    pass


def _would_run(*args, **kwargs):
    raise _WouldRun


# Upstream's rank-side gates (torch.testing._internal.common_distributed):
# wrappers that either call the test or sys.exit() with a skip code, deciding
# from this host's GPUs, BACKEND and WORLD_SIZE alone, and change nothing.
_GATES = ("skip_if_lt_x_gpu.", "skip_if_no_gpu.", "skip_if_small_worldsize.", "skip_if_odd_worldsize.",
          "nccl_skip_if_lt_x_gpu.", "require_n_gpus_for_nccl_backend.")


def skip_before_ranks(cls, name):
    """Why the test `name` of `cls` would skip in its rank processes on this
    host before running anything, or None.

    Each of the test's wrappers that is one of _GATES is called here, as its
    rank would call it, with what it wraps replaced by a stub: a gate that
    exits with a skip code without reaching the stub would skip in every rank.
    conftest.py skips such a test, with upstream's reason, without starting
    its ranks (each start costs an init_process_group and two file barriers).
    Other wrappers are not called (with_dist_debug_levels sets the
    environment); a gate that reaches the stub or raises decides nothing."""
    fn = getattr(cls, name, None)
    saved = os.environ.get("WORLD_SIZE")
    os.environ["WORLD_SIZE"] = str(cls.RANKS)
    try:
        while fn is not None and getattr(fn, "__wrapped__", None) is not None:
            inner = fn.__wrapped__
            code = getattr(fn, "__code__", None)
            if code is not None and fn.__closure__ and code.co_filename.endswith("common_distributed.py") \
                    and code.co_qualname.startswith(_GATES):
                cells = tuple(types.CellType(_would_run) if c.cell_contents is inner else c for c in fn.__closure__)
                probe = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, cells)
                try:
                    probe(types.SimpleNamespace())
                except SystemExit as e:
                    if e.code in _SKIP_REASONS:
                        return _SKIP_REASONS[e.code]
                except BaseException:  # noqa: BLE001 (_WouldRun, or anything else: the ranks decide)
                    pass
            fn = inner
    finally:
        if saved is None:
            os.environ.pop("WORLD_SIZE", None)
        else:
            os.environ["WORLD_SIZE"] = saved
    return None


_SKIP_CODES = {s.exit_code for s in TEST_SKIPS.values()}
_SKIP_REASONS = {s.exit_code: s.message for s in TEST_SKIPS.values()}


class TestShoalBackend(TestDistBackend, DistributedTest._DistTestBase):
    RANKS = 2

    @property
    def world_size(self):
        return str(self.RANKS)

    def setUp(self):
        super().setUp()
        # Fresh rank processes for every test, as upstream's spawn runner
        # starts them, but forked from a forkserver that has imported this
        # module (torch, the suite, shoal) once: a rank starts in a fraction
        # of a second instead of importing torch anew.
        ctx = torch.multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload([__name__])  # (a failed preload is silent: see _HERE)
        self._start_processes(ctx.Process)

    def _start_processes(self, proc):
        # A forked rank has the forkserver's environment, not this process's
        # as it is now (the suite sets TEMP_DIR, MASTER_PORT ... per test and
        # reads them in the ranks): hand it over.
        env = dict(os.environ, WORLD_SIZE=str(self.RANKS))

        def process(*args, kwargs=None, **kw):
            return proc(*args, kwargs=dict(kwargs or {}, env=env), **kw)

        super()._start_processes(process)

    @classmethod
    def _run(cls, rank, test_name, file_name, pipe, env=None, **kwargs):
        os.environ.clear()
        os.environ.update(env)
        super()._run(rank, test_name, file_name, pipe, **kwargs)

    def _test_all_reduce_helper(self, group, group_id, rank, op, master_value, worker_value, expected_value,
                                cuda=False, rank_to_GPU=None, dtype=torch.float, async_op=False):
        super()._test_all_reduce_helper(group, group_id, rank, op, master_value, worker_value, expected_value,
                                        cuda=cuda, rank_to_GPU=rank_to_GPU, dtype=dtype, async_op=async_op)
        for src in group:
            t = torch.full((src + 2, 3), master_value if rank == src else worker_value, dtype=dtype)
            work = dist.all_reduce(t, op, group_id, async_op=async_op)
            if async_op:
                work.wait()
            self.assertEqual(t, torch.full_like(t, expected_value), msg=f"all_reduce {op} from rank {rank}")

    def _check_return_codes(self, fn, elapsed_time):
        want = int(self.world_size)
        codes = [p.exitcode for p in self.processes]
        assert len(codes) == want, f"{self.id()}: {len(codes)} rank processes ran, expected {want}"
        super()._check_return_codes(fn, elapsed_time)
        # Rank 0 passed, or every rank skipped: the others must agree.
        bad = [(r, c) for r, c in enumerate(codes) if c != codes[0] and not (c in _SKIP_CODES and codes[0] in _SKIP_CODES)]
        assert not bad, f"{self.id()}: rank 0 exited {codes[0]}, but " + \
            ", ".join(f"rank {r} exited {c}" for r, c in bad)


class TestShoalBackendThreeRanks(TestShoalBackend):
    """Every test on 3 ranks."""

    RANKS = 3


class TestShoalBackendEightRanks(TestShoalBackend):
    """The group tests on 8 ranks."""

    RANKS = 8
