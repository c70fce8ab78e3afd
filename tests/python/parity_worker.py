"""One rank of the parity job (test_parity.py): what PyTorch's suite and
tooling expect of a backend beyond the collectives themselves, as Gloo does
it: sparse COO all_reduce, profiler events, monitored_barrier through
torch's function, the backend's name in DDP's logs, the conventional phrase
in a timeout's message. Prints one RESULT line (harness.py, worker.Checks).
"""

import datetime
import os
import sys

import torch
import torch.distributed as dist

import shoal.torch  # noqa: F401
from collective_checks import RANK, WS, expect_error
from harness import Checks


def sparse(rank, size=(10, 7, 3), empty=False):
    """Rank `rank`'s gradient-like sparse tensor: duplicate indices, a dense dimension."""
    if empty:
        return torch.sparse_coo_tensor(torch.empty(2, 0, dtype=torch.long), torch.empty(0, size[2]), size)
    g = torch.Generator().manual_seed(100 + rank)
    i = torch.randint(0, 7, (2, 9), generator=g)
    i[:, 1] = i[:, 0]  # an index twice
    return torch.sparse_coo_tensor(i, torch.randn(9, size[2], generator=g), size)


def check_sparse_sum():
    t = sparse(RANK, empty=(RANK == 1))
    dist.all_reduce(t)
    want = sum(sparse(r, empty=(r == 1)).to_dense() for r in range(WS))
    assert t.is_sparse and t.is_coalesced(), t
    assert torch.allclose(t.to_dense(), want, atol=1e-6), "sparse all_reduce: wrong sum"
    assert t._nnz() <= sum(sparse(r)._nnz() for r in range(WS)), "not coalesced"


def check_sparse_async_and_future():
    t = sparse(RANK)
    fut = dist.all_reduce(t, async_op=True).get_future()
    out = fut.wait()[0]
    want = sum(sparse(r).to_dense() for r in range(WS))
    assert torch.allclose(out.to_dense(), want, atol=1e-6)


def check_sparse_all_empty():
    t = sparse(RANK, empty=True)
    dist.all_reduce(t)
    assert t._nnz() == 0 and t.shape == (10, 7, 3)


def check_sparse_bad_input():
    expect_error(lambda: dist.all_reduce(sparse(RANK), op=dist.ReduceOp.MAX), f"shoal rank {RANK}", "op", "sum")
    other = sparse(RANK) if RANK == 0 else sparse(RANK, size=(10, 8, 3))
    # Every rank learns of the mismatch (the shapes are compared first) and
    # names the rank that differs; the group stays in step.
    expect_error(lambda: dist.all_reduce(other), f"shoal rank {RANK}", "differs", "size")
    x = torch.ones(3)
    dist.all_reduce(x)
    assert torch.equal(x, torch.full((3,), float(WS)))


def check_profiler_events():
    shapes = []
    with torch.autograd.profiler.profile(record_shapes=True) as prof:
        t = torch.ones(4, 3)
        dist.all_reduce(t)
        shapes.append([[4, 3]])
        outs = [torch.empty(5) for _ in range(WS)]
        dist.all_gather(outs, torch.ones(5))
        shapes.append([[5]])
        dist.broadcast(torch.ones(2), src=0)
        shapes.append([[2]])
        dist.barrier()
        shapes.append([])
    got = [e for e in prof.function_events if e.name.startswith("shoal:")]
    names = [e.name for e in got]
    assert names == ["shoal:all_reduce", "shoal:all_gather", "shoal:broadcast", "shoal:barrier"], names
    for e, want in zip(got, shapes):
        assert e.is_async and e.count == 1, (e.name, e.is_async, e.count)
        assert e.input_shapes == want, (e.name, e.input_shapes, want)


def check_monitored_barrier():
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=30))
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=30), wait_all_ranks=True)
    if RANK == 0:
        expect_error(lambda: dist.monitored_barrier(timeout=datetime.timedelta(seconds=0)),
                     "not reached the barrier", "Rank 1 failed to pass monitoredBarrier")


def check_ddp_logs_the_backend():
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = DDP(torch.nn.Linear(3, 2))
    model(torch.ones(2, 3)).sum().backward()
    name = model._get_ddp_logging_data().get("backend_name")
    assert name == "shoal", name


def check_timeout_phrase(quick):
    if RANK != 0:
        return
    try:
        dist.all_reduce(torch.ones(3), group=quick)
    except RuntimeError as e:
        msg = str(e)
        assert " timeout " in msg and "Timed out" in msg and "rank 1" in msg, msg
        return
    raise AssertionError("no error")


def main():
    dist.init_process_group("shoal", timeout=datetime.timedelta(seconds=60))
    quick = dist.new_group(backend="shoal", timeout=datetime.timedelta(seconds=1))
    store = dist.distributed_c10d._get_default_store()
    c = Checks()
    c.run("sparse all_reduce sums (duplicates, an empty rank)", check_sparse_sum)
    c.run("sparse all_reduce async, future", check_sparse_async_and_future)
    c.run("sparse all_reduce of empty tensors", check_sparse_all_empty)
    c.run("sparse all_reduce bad input", check_sparse_bad_input)
    c.run("profiler events", check_profiler_events)
    c.run("dist.monitored_barrier", check_monitored_barrier)
    dist.barrier()
    c.run("DDP logs the backend's name", check_ddp_logs_the_backend)
    # Last: a timeout breaks the group it happens in (rank 1 stays out of it).
    c.run("a timeout says so as torch's tooling expects", check_timeout_phrase, quick)
    # Rank 0 hosts the store: it leaves only once every rank has seen the end.
    if RANK == 0:
        store.set("parity-done", "1")
        store.wait([f"parity-seen-{r}" for r in range(1, WS)])
    else:
        store.wait(["parity-done"])
        store.set(f"parity-seen-{RANK}", "1")
    rc = c.report()
    sys.stdout.flush()
    os._exit(rc)


if __name__ == "__main__":
    main()
