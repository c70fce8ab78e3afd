"""shoal under torchft (python/shoal/torchft.py, docs/torchft.md).

torchft's own tests run on ProcessGroupShoal where they apply: its
process-group checks (process_group_test.py: every collective at 3 ranks, the
one-rank API and DDP check, functional collectives, a lost rank) and its
Manager integration tests (manager_integ_test.py: DDP healthy, recovering,
multi-rank, without init sync; the Manager's allreduce),
with ProcessGroupShoal in place of the ProcessGroupGloo they build. Then the
proof with processes: three replicas of torchft's DDP example loop, one
SIGKILLed mid-step: that step is not committed, the restarted replica heals
from the others, and all three end with equal models. And one check of
device tensors on the test accelerator.

Skipped, with the reason, without torchft (pip install 'shoal[torchft]').
"""

import inspect
import json
import os
import signal
import subprocess
import sys
import threading
import time
import unittest
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from unittest.mock import patch

import pytest

pytest.importorskip("torchft", reason="torchft is not installed (pip install 'shoal[torchft]'; docs/torchft.md)")
pytest.importorskip("parameterized", reason="torchft's own tests need parameterized (pip install parameterized)")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from parameterized import parameterized  # noqa: E402
from torch.distributed import TCPStore  # noqa: E402

import torchft.manager_integ_test as upstream_manager  # noqa: E402
import torchft.process_group as tft_pg  # noqa: E402
import torchft.process_group_test as upstream  # noqa: E402

from harness import HERE  # noqa: E402
from shoal.torchft import ProcessGroupShoal  # noqa: E402

sys.path.insert(0, str(HERE))
import torchft_worker  # noqa: E402

WORKER = HERE / "torchft_worker.py"


def _store():
    return TCPStore(host_name="localhost", port=0, is_master=True, wait_for_workers=False)


def test_configure_takes_torchfts_arguments():
    """The configure contract of the installed torchft, argument for argument."""
    ours = inspect.signature(ProcessGroupShoal.configure).parameters
    theirs = inspect.signature(tft_pg.ProcessGroup.configure).parameters
    assert [(p.name, p.default) for p in ours.values()] == [(p.name, p.default) for p in theirs.values()]
    assert issubclass(ProcessGroupShoal, tft_pg.ProcessGroup)
    assert ProcessGroupShoal().getBackendName() == "torchft-shoal"


def test_one_rank_every_api_and_ddp():
    """torchft's test_gloo_apis (cpu) on shoal: every collective its _test_pg
    issues, none skipped as unsupported, then a DDP forward and backward."""
    store = _store()
    pg = ProcessGroupShoal()
    pg.configure(f"localhost:{store.port}/prefix", "0", 0, 1)
    assert pg.size() == 1
    works = upstream._test_pg(pg, torch.tensor([2]))
    assert set(works) == {"allreduce", "allreduce_coalesced", "allgather", "allgather_into_tensor_coalesced",
                          "alltoall_base", "barrier", "broadcast", "broadcast_one", "reduce_scatter",
                          "reduce_scatter_tensor_coalesced"}
    m = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 4), process_group=pg)
    m(torch.rand(2, 3)).sum().backward()
    assert pg.errored() is None
    pg.shutdown()


def test_missing_peer_fails_within_the_timeout_and_names_it():
    """torchft's test_gloo_timeout, as shoal does it: shoal connects lazily, so
    configure returns at once and the first collective fails after the
    timeout, naming the rank that never came; wait() returns False, the
    future and errored() carry the cause."""
    store = _store()
    pg = ProcessGroupShoal(timeout=timedelta(seconds=0.3))
    pg.configure(f"localhost:{store.port}/prefix", "0", 0, 2)
    t0 = time.monotonic()
    work = pg.allreduce([torch.ones(3)], dist.ReduceOp.SUM)
    assert work.wait() is False
    assert time.monotonic() - t0 < 10
    with pytest.raises(Exception, match="addr/1.*timeout"):
        work.get_future().wait()
    assert "addr/1" in str(pg.errored())


def test_functional_collectives():
    """torchft's test_functional_collectives: register() and a functional all_reduce."""
    from torch._C._distributed_c10d import _resolve_process_group
    from torch.distributed import _functional_collectives
    ours = not dist.is_initialized()
    if ours:  # register() makes its group through torch.distributed (as upstream's dummy_init_pg)
        dist.init_process_group(backend="gloo", rank=0, world_size=1, store=dist.HashStore())
    store = _store()
    pg = ProcessGroupShoal().register("shoal_test_func_col")
    pg.configure(f"localhost:{store.port}/prefix", "0", 0, 1)
    try:
        assert _resolve_process_group(pg.group_name) is pg
        out = _functional_collectives.all_reduce(torch.full((10,), 2.0), "sum", pg)
        assert torch.equal(_functional_collectives.wait_tensor(out), torch.full((10,), 2.0))
    finally:
        pg.unregister()
        if ours:
            dist.destroy_process_group()


class ShoalMultiPgTest(upstream.MultiPgBaseTest):
    """torchft's MultiPgBaseTest at 3 ranks (threads of this process) on
    ProcessGroupShoal: every collective of its table, including the three it
    skips for Gloo (alltoall_base, reduce_scatter, reduce_scatter_tensor_coalesced)."""

    BACKEND = "shoal"
    WORLD_SIZE = 3

    @classmethod
    def _create_pg(cls, backend):
        return ProcessGroupShoal(timeout=timedelta(seconds=30))

    @parameterized.expand(upstream._ALL_COLLECTIVES)
    def test_collective(self, collective):
        self._run_parallel(collective, device="cpu")


class ShoalResiliencyTest(upstream.MultiPgBaseTest):
    """torchft's _run_with_resiliency on shoal, then what torchft does next.

    As upstream: the ranks reconfigure, run the collective, the last rank
    shuts its group down, and the others' collective fails ("not equal": as
    with NCCL, wait() does not raise), or passes on a rank whose part did not
    need the lost one (upstream's "no error"). Upstream then expects errored()
    to say "aborted" (ProcessGroupNCCL's text); shoal's names the lost rank
    instead, and at least one survivor must have seen it.
    Beyond upstream: the survivors configure a group of two under a new
    prefix, and the collective passes there."""

    BACKEND = "shoal"
    WORLD_SIZE = 3

    @classmethod
    def _create_pg(cls, backend):
        return ProcessGroupShoal(timeout=timedelta(seconds=30))

    @parameterized.expand(["allreduce", "allgather", "broadcast", "alltoall_base"])
    def test_collective_with_resiliency(self, collective):
        test = upstream._COLLECTIVE_TO_FUNC[collective]
        fault = self.WORLD_SIZE - 1
        base = f"localhost:{self.store.port}/resiliency_{collective}"

        def worker(rank):
            pg = self.pg_pool[rank]
            pg.set_timeout(timedelta(seconds=30))
            pg.configure(base, "0", rank, self.WORLD_SIZE)
            test(pg, rank, torch.tensor([rank + 1]))
            if rank == fault:
                pg.shutdown()
                return None
            pg.set_timeout(timedelta(seconds=1))
            # As upstream, a rank whose part did not need the lost one may pass ("no error").
            with self.assertRaisesRegex(Exception, "not equal|not close|peer lost|timed out|no error"):
                test(pg, rank, torch.tensor([rank + 1]))
                raise RuntimeError("no error")
            err = pg.errored()
            if err is not None:
                self.assertRegex(str(err), f"rank {fault}")
            # torchft's next quorum: the survivors, a fresh prefix, a fresh communicator.
            pg.set_timeout(timedelta(seconds=30))
            pg.configure(base + "/survivors", "0", rank, self.WORLD_SIZE - 1)
            self.assertIsNone(pg.errored())
            test(pg, rank, torch.tensor([rank + 1]))
            return err

        futs = [self.executor.submit(worker, r) for r in range(self.WORLD_SIZE)]
        self._collect(futs)
        errors = [f.result() for f in futs[:-1]]
        self.assertTrue(any(errors), "no survivor saw the lost rank")


@pytest.mark.serial  # abort() returns within 1 s
def test_abort_never_waits_for_peers():
    """A rank stuck in a collective whose peer never comes: abort() from
    another thread returns at once (the timeout is 60 s), the collective
    fails with Aborted, errored() says so; a later configure works."""
    store = _store()
    pgs = [ProcessGroupShoal(timeout=timedelta(seconds=60)) for _ in range(2)]
    with ThreadPoolExecutor(2) as ex:
        list(ex.map(lambda r: pgs[r].configure(f"localhost:{store.port}/a", "0", r, 2), range(2)))
        t = torch.ones(4)
        work = pgs[0].allreduce([t], dist.ReduceOp.SUM)  # rank 1 never joins it
        time.sleep(0.2)
        t0 = time.monotonic()
        pgs[0].abort()
        took = time.monotonic() - t0
        assert took < 1.0, f"abort took {took:.2f} s"
        assert work.wait() is False
        with pytest.raises(Exception, match="abort"):
            work.get_future().wait()
        assert "abort" in str(pgs[0].errored())
        list(ex.map(lambda r: pgs[r].configure(f"localhost:{store.port}/b", "0", r, 2), range(2)))
        assert pgs[0].errored() is None
        outs = list(ex.map(lambda r: upstream.run_allreduce_test(pgs[r], r, torch.tensor([r + 1])), range(2)))
        assert outs == [None, None]


class _AnyPortManager(upstream_manager.Manager):
    """upstream's Manager on a port the kernel picks: its loops bind fixed
    ports (19530 + replica), which two pytest workers would both take."""

    def __init__(self, *args, **kwargs):
        kwargs["port"] = 0
        super().__init__(*args, **kwargs)


class _CountingShoal(ProcessGroupShoal):
    created = 0

    def _create_pg(self, *args):
        type(self).created += 1
        return super()._create_pg(*args)


@pytest.mark.parametrize("name", [
    "test_ddp_healthy",
    "test_ddp_recovery_0_async_quorum",
    "test_ddp_recovery_1_sync_quorum",
    "test_ddp_recovery_multi_rank",
    "test_ddp_skip_init_sync",
    "test_manager_allreduce_1",  # the CPU case (the other is CUDA)
])
def test_torchft_manager_integration(name):
    """torchft's manager_integ_test.py, with ProcessGroupShoal in place of the
    ProcessGroupGloo its train loops build (replicas are threads there; its
    lighthouse runs in this process)."""
    _CountingShoal.created = 0
    result = unittest.TestResult()
    with patch.object(upstream_manager, "ProcessGroupGloo", _CountingShoal), \
            patch.object(upstream_manager, "Manager", _AnyPortManager):
        upstream_manager.ManagerIntegTest(name).run(result)
    problems = result.errors + result.failures
    assert not problems, "\n".join(text for _, text in problems)
    assert not result.skipped, result.skipped
    assert _CountingShoal.created > 0, "the test built no ProcessGroupShoal"


@pytest.mark.serial  # the survivors' steps after the kill are found by the kill's time
def test_pipeline_replicas_lose_a_stage_heal_and_end_equal(tmp_path):
    """Two replicas, each a two-stage shoal.modelparallel pipeline (a job of
    two processes with its own store), averaging each stage's gradients with
    the other replica's same stage through torchft on ProcessGroupShoal
    (torchft_pipeline_worker.py). One stage of replica 1 is SIGKILLed (stage
    0 hosts the replica's store and manager server): its other stage fails
    in the pipeline naming the lost rank and exits; both stages of replica 0
    see that step fail naming the lost peer, do not commit it (torchft's
    should_commit is replica-wide) and redo it alone; replica 1 restarts as a
    whole, heals stage by stage from replica 0 and both end at the same step
    with equal model and optimizer state, stage for stage."""
    import torchft_pipeline_worker as tp
    stage = 0  # it hosts the replica's store and manager server (kill_stage=1 passes too)
    res = tp.kill_job(str(tmp_path), kill_stage=stage)
    logs, victim = res["logs"], res["victim"]
    other = 1 - stage
    assert res["killed"] == {stage: -signal.SIGKILL, other: 3}, res["killed"]
    kill = [x for x in logs[(victim, stage)] if x["event"] == "kill"][0]
    broken = [x for x in logs[(victim, other)] if x["event"] == "broken"]
    assert broken and "peer lost" in broken[0]["error"] and f"rank {stage}" in broken[0]["error"], broken
    assert all(c == 0 for c in res["codes"].values()), res["codes"]
    for k in range(tp.STAGES):
        steps = [x for x in logs[(0, k)] if x["event"] == "step"]
        failed = [x for x in steps if not x["committed"]]
        assert [x["step"] for x in failed] == [kill["step"]], f"stage {k}: uncommitted steps {failed}"
        assert failed[0]["participants"] == 2, failed[0]
        # A stage's group names its lost member; the other stage's group (whose member
        # exits on its own a moment later) may first lose its store, when torchft chose
        # the killed stage 0's store for the quorum.
        assert "peer lost" in failed[0]["errored"] or (k != stage and "store" in failed[0]["errored"] and
                                                       "unreachable" in failed[0]["errored"]), failed[0]
        redo = steps[steps.index(failed[0]) + 1]
        assert (redo["step"], redo["committed"], redo["participants"]) == (kill["step"], True, 1), redo
        second_life = logs[(victim, k)]
        second_life = second_life[max(i for i, x in enumerate(second_life) if x["event"] == "start"):]
        first = second_life[1]
        assert first["step"] == 0 and first["after"] > kill["step"] + 1, f"stage {k} did not heal: {first}"
        ends = {r: [x for x in logs[(r, k)] if x["event"] == "end"][-1]["step"] for r in (0, victim)}
        assert ends[0] == ends[victim] >= 8, ends
        a, b = (torch.load(res["states"][(r, k)]) for r in (0, victim))
        assert a["model"].keys() == b["model"].keys() and len(a["model"]) > 1
        for key in a["model"]:
            if torch.is_tensor(a["model"][key]):
                assert torch.equal(a["model"][key], b["model"][key]), f"stage {k}: {key} differs"
        assert a["optim"]["state"].keys() == b["optim"]["state"].keys() and a["optim"]["state"]
        for i, st in a["optim"]["state"].items():
            for name, v in st.items():
                assert torch.equal(torch.as_tensor(v), torch.as_tensor(b["optim"]["state"][i][name])), (k, i, name)


@pytest.mark.serial  # the survivors' steps after the kill are found by the kill's time
def test_killed_replica_heals_and_replicas_end_equal(tmp_path):
    """Three replicas of torchft's DDP example loop (torchft_worker.py), each
    its own process. Replica 2 is SIGKILLed at step 3 after its quorum formed:
    the survivors' step 3 fails (shoal names the lost rank) and is not
    committed, step 3 is redone by two replicas, the restarted replica heals
    from them (it jumps to their step) and all three stop at the same step with
    equal model and optimizer state."""
    res = torchft_worker.kill_job("shoal", str(tmp_path), kill_at=3, steps=8)
    logs = res["logs"]
    assert res["killed_code"] == -signal.SIGKILL
    assert res["codes"] == [0, 0, 0]
    for r in (0, 1):
        steps = [x for x in logs[r] if x["event"] == "step"]
        failed = [x for x in steps if not x["committed"]]
        assert [x["step"] for x in failed] == [3], f"replica {r}: uncommitted steps {failed}"
        assert failed[0]["participants"] == 3
        assert "peer lost" in failed[0]["errored"] and "rank" in failed[0]["errored"], failed[0]["errored"]
        redo = steps[steps.index(failed[0]) + 1]
        assert (redo["step"], redo["committed"], redo["participants"]) == (3, True, 2)
    second_life = [x for x in logs[2] if x["event"] in ("start", "step", "end")]
    second_life = second_life[max(i for i, x in enumerate(second_life) if x["event"] == "start"):]
    first = second_life[1]
    assert first["step"] == 0 and first["after"] > 4, f"the restarted replica did not heal: {first}"
    ends = [[x for x in logs[r] if x["event"] == "end"][-1]["step"] for r in range(3)]
    assert ends[0] == ends[1] == ends[2] >= 8, ends
    states = [torch.load(res["states"][r]) for r in range(3)]
    for r in (1, 2):
        torch.testing.assert_close(states[r], states[0], rtol=0, atol=0)


def test_device_tensors_on_the_test_accelerator():
    """torchft's collective checks on "fakegpu" tensors (two ranks, threads)."""
    build = os.environ.get("SHOAL_CMAKE_BUILD_DIR") or str(HERE.parents[1] / "build")
    if not list((HERE.parents[1] / build / "tests" / "fakegpu").glob("_fakegpu*.so")):
        pytest.skip("the fakegpu extension is not built (make build)")
    env = dict(os.environ, PYTHONPATH=str(HERE.parents[1] / "python") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, str(WORKER), "device"], env=env, capture_output=True, text=True, timeout=240)
    results = [json.loads(line[len("RESULT "):]) for line in p.stdout.splitlines() if line.startswith("RESULT ")]
    assert p.returncode == 0 and results, p.stdout[-4000:] + p.stderr[-4000:]
    assert not results[0]["failed"], results[0]["failed"]
    assert len(results[0]["passed"]) == len(upstream._COLLECTIVE_TO_FUNC) + 1, results[0]["passed"]
