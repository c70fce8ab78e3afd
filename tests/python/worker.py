"""One rank of a test job (see harness.py). Usage: worker.py SUITE.

Every check runs its collectives on shoal and, where Gloo supports the same
call, on a Gloo group of the same ranks with the same inputs, and compares
both with a reference computed locally (every rank can generate every other
rank's input: inputs are seeded by (check, rank)). Checks record failures and
go on; assertions come after a check's collectives so that one failing check
does not leave the ranks out of step. The checks and their inputs are in
collective_checks.py; the suites here run them.
"""

import datetime
import os
import sys
import warnings

import torch
import torch.distributed as dist

warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", message=".*deprecated.*", category=UserWarning)

SUITES = {}


def suite(name):
    def reg(fn):
        SUITES[name] = fn
        return fn
    return reg


from harness import Checks  # noqa: E402

from collective_checks import (Ctx, FLOATS, INTS, RANK, WS, check_all_gather,
                               check_all_gather_into_tensor, check_allreduce,
                               check_allreduce_coalesced, check_alltoall, check_barriers,
                               check_broadcast, check_futures, check_gather_coalesced,
                               check_gather_scatter, check_odd_dtypes, check_premul_sum,
                               check_reduce, check_reduce_scatter, check_reduce_scatter_coalesced,
                               check_p2p, check_subgroups, close, expect_error)  # noqa: E402


@suite("collectives")
def collectives():
    dist.init_process_group("shoal", timeout=datetime.timedelta(seconds=60))
    ctx = Ctx()
    c = Checks()
    # allreduce: every op x dtype family, sizes 0/1/odd/large
    for dtype in FLOATS:
        for op in ("sum", "prod", "min", "max", "avg"):
            c.run(f"allreduce {dtype} {op}", check_allreduce, ctx, dtype, op, 13)
    for dtype in INTS:
        for op in ("sum", "prod", "min", "max", "band", "bor", "bxor"):
            c.run(f"allreduce {dtype} {op}", check_allreduce, ctx, dtype, op, 13)
    for op in ("sum", "prod", "min", "max"):
        c.run(f"allreduce bool {op}", check_allreduce, ctx, torch.bool, op, 9)
    for n in (0, 1, 1031, 1 << 18):
        c.run(f"allreduce f32 n={n}", check_allreduce, ctx, torch.float32, "sum", n)
    c.run("allreduce non-contiguous", check_allreduce, ctx, torch.float32, "sum", 100, False)
    c.run("allreduce async+future", check_allreduce, ctx, torch.float32, "sum", 100, True, True)
    c.run("allreduce premul_sum", check_premul_sum)
    c.run("allreduce_coalesced", check_allreduce_coalesced, ctx)
    for dtype in (torch.float32, torch.int64, torch.bfloat16, torch.bool):
        c.run(f"broadcast {dtype}", check_broadcast, ctx, dtype, 17)
    c.run("broadcast non-contiguous", check_broadcast, ctx, torch.float32, 17, False)
    c.run("broadcast large", check_broadcast, ctx, torch.float32, 1 << 18)
    for dtype, op in ((torch.float32, "sum"), (torch.int32, "max"), (torch.float64, "prod"),
                      (torch.float16, "sum")):
        c.run(f"reduce {dtype} {op}", check_reduce, ctx, dtype, op)
    for dtype in (torch.float32, torch.int8):
        c.run(f"all_gather {dtype}", check_all_gather, ctx, dtype, 4)
        c.run(f"all_gather_into_tensor {dtype}", check_all_gather_into_tensor, ctx, dtype)
        c.run(f"gather/scatter {dtype}", check_gather_scatter, ctx, dtype)
        c.run(f"all_to_all {dtype}", check_alltoall, ctx, dtype)
    c.run("all_gather empty", check_all_gather, ctx, torch.float32, 0)
    c.run("all_gather_coalesced", check_gather_coalesced, ctx)
    for dtype, op in ((torch.float32, "sum"), (torch.int64, "max"), (torch.float32, "avg"),
                      (torch.bfloat16, "sum")):
        c.run(f"reduce_scatter {dtype} {op}", check_reduce_scatter, ctx, dtype, op)
    c.run("reduce_scatter_tensor_coalesced", check_reduce_scatter_coalesced)
    c.run("p2p", check_p2p)
    c.run("barriers", check_barriers)
    c.run("futures", check_futures)
    c.run("odd dtypes", check_odd_dtypes, ctx)
    c.run("subgroups", check_subgroups, ctx)
    dist.barrier()
    dist.destroy_process_group()
    return c.report()


# ----------------------------------------------------------------- bad input

@suite("errors")
def errors():
    dist.init_process_group("shoal", timeout=datetime.timedelta(seconds=60))
    c = Checks()
    pg = dist.distributed_c10d._get_default_group()
    f = torch.ones(4)

    def bad_root_bcast():
        opts = dist.BroadcastOptions()
        opts.rootRank = WS + 3
        pg.broadcast([f], opts)
    c.run("bad root", expect_error, bad_root_bcast, "broadcast", "root", "out of range")
    two = [torch.ones(4) for _ in range(WS)]
    two[-1] = torch.ones(4, dtype=torch.float64)
    # torch's Python layer checks some of these itself; the ProcessGroup object
    # goes straight to the backend.
    c.run("dtypes differ in all_gather", expect_error,
          lambda: pg.allgather([two], [torch.ones(4)]), f"output_list[{WS - 1}]", "dtype float64")
    c.run("dtypes differ in coalesced", expect_error,
          lambda: pg.allreduce_coalesced([torch.ones(2), torch.ones(2, dtype=torch.int32)]),
          "tensors[1]", "dtype int32")
    c.run("wrong list length", expect_error,
          lambda: pg.allgather([[torch.ones(4)] * (WS + 1)], [torch.ones(4)]), "output_list",
          f"{WS + 1} entries")
    c.run("bad split sizes", expect_error,
          lambda: dist.all_to_all_single(torch.empty(WS * 2), torch.ones(WS * 2),
                                         [2] * WS, [1] * WS),
          "input_split_sizes", "sums to")
    c.run("split sizes wrong length", expect_error,
          lambda: dist.all_to_all_single(torch.empty(WS * 2), torch.ones(WS * 2),
                                         [2] * WS, [2] * (WS + 1)),
          "input_split_sizes", "entries")
    c.run("wrong output size", expect_error,
          lambda: dist.all_gather_into_tensor(torch.empty(WS * 4 + 1), torch.ones(4)),
          "output", "elements")
    c.run("reduce_scatter_tensor sizes", expect_error,
          lambda: dist.reduce_scatter_tensor(torch.empty(3), torch.ones(WS * 3 + 1)),
          "input", "elements")
    c.run("bitwise op on float", expect_error,
          lambda: dist.all_reduce(torch.ones(3), op=dist.ReduceOp.BAND), "op", "integer")
    c.run("int16 reduction", expect_error,
          lambda: dist.all_reduce(torch.ones(3, dtype=torch.int16)), "int16", "cannot be reduced")
    def broken_group_recovered():
        # Every rank alive, the group broken (aborted): recover() replaces it.
        import shoal.torch as st
        g = dist.new_group(list(range(WS)), backend="shoal", pg_options=st.Options(own_connections=True))
        g._get_backend(torch.device("cpu")).abort_because("test")
        expect_error(lambda: dist.all_reduce(torch.ones(2), group=g), "aborted", "test")
        fresh = st.recover(g, window=5.0)
        t = torch.ones(2)
        dist.all_reduce(t, group=fresh)
        assert fresh is not g and torch.equal(t, torch.full((2,), float(WS))), (fresh is g, t)
    c.run("a broken group of live ranks is recovered", broken_group_recovered)
    backend = pg._get_backend(torch.device("cpu"))
    c.run("wrong device", expect_error,
          lambda: backend.allreduce([torch.ones(3, device="meta")]), "tensor", "meta", "cpu")
    # Sparse tensors: all_reduce sums them, its bad input is in parity_worker.py;
    # torch's dispatcher refuses them for the other collectives before shoal.
    if WS > 1:
        c.run("send to self", expect_error, lambda: pg.send([torch.ones(1)], RANK, 0), "dst")
    if RANK == 0:  # checked on the root before anything is sent: the others issue nothing
        c.run("gather list on root", expect_error,
              lambda: dist.gather(torch.ones(2), [torch.ones(3)] * WS, dst=0),
              "gather_list[0]", "elements")
        c.run("scatter list on root", expect_error,
              lambda: dist.scatter(torch.ones(2), [torch.ones(3)] * WS, src=0),
              "scatter_list[0]", "elements")
    # nothing reached the wire: the group still works, and agrees
    t = torch.ones(3)
    dist.all_reduce(t)
    c.run("still usable", close, t, torch.full((3,), float(WS)), "after errors")
    dist.destroy_process_group()
    return c.report()


# ----------------------------------------------------------------- DDP

def _model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                               torch.nn.ReLU(), torch.nn.Linear(64, 5))


def _train(group, steps=8, hook=None, state=None, bucket_cap_mb=None):
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = _model(1234 + RANK)  # different on purpose: DDP must broadcast rank 0's
    kw = {} if bucket_cap_mb is None else {"bucket_cap_mb": bucket_cap_mb}
    ddp = DDP(model, process_group=group, **kw)
    if hook is not None:
        ddp.register_comm_hook(state(group) if callable(state) else state, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(99 + RANK)
    for _ in range(steps):
        x = torch.randn(16, 20, generator=g)
        y = torch.randint(0, 5, (16,), generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
    return [p.detach().clone() for p in ddp.parameters()]


def _same_params(a, b, what, rtol=1e-5, atol=1e-6):
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        if not torch.allclose(x, y, rtol=rtol, atol=atol):
            raise AssertionError(f"{what}: parameter {i} differs by {(x - y).abs().max().item()}")


def _replicas_agree(params, group, what):
    for i, p in enumerate(params):
        m = p.clone()
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
        n = p.clone()
        dist.all_reduce(n, op=dist.ReduceOp.MIN, group=group)
        assert torch.equal(m, n), f"{what}: replicas differ at parameter {i}"


def _bf16_hook(group, bucket):
    """torch's bf16_compress_hook, which DDP only accepts with CUDA/NCCL."""
    ws = dist.get_world_size(group)
    buf = bucket.buffer()
    compressed = buf.to(torch.bfloat16).div_(ws)
    fut = dist.all_reduce(compressed, group=group, async_op=True).get_future()

    def decompress(f):
        buf.copy_(f.value()[0])
        return buf
    return fut.then(decompress)


@suite("ddp")
def ddp():
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as dh
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps
    dist.init_process_group("shoal", timeout=datetime.timedelta(seconds=60))
    gloo = dist.new_group(backend="gloo")
    c = Checks()

    def plain():
        a = _train(None)
        b = _train(gloo)
        _same_params(a, b, "DDP shoal vs gloo")
        _replicas_agree(a, None, "DDP shoal")

    def small_buckets():
        a = _train(None, bucket_cap_mb=0.01)
        b = _train(gloo, bucket_cap_mb=0.01)
        _same_params(a, b, "DDP small buckets shoal vs gloo")

    def hooks():
        # (bf16_compress_hook refuses to run without CUDA/NCCL: torch checks it itself.)
        for name, hook in (("allreduce", dh.allreduce_hook), ("fp16", dh.fp16_compress_hook),
                           ("bf16 (same as torch's)", _bf16_hook)):
            a = _train(None, hook=hook, state=lambda g: g)
            b = _train(gloo, hook=hook, state=lambda g: g)
            tol = 1e-5 if name == "allreduce" else 2e-2
            _same_params(a, b, f"hook {name} shoal vs gloo", rtol=tol, atol=tol)
            _replicas_agree(a, None, f"hook {name}")

    def powersgd():
        def st(g):
            return ps.PowerSGDState(process_group=g, matrix_approximation_rank=2,
                                    start_powerSGD_iter=2, random_seed=7)
        a = _train(None, hook=ps.powerSGD_hook, state=st)
        b = _train(gloo, hook=ps.powerSGD_hook, state=st)
        _same_params(a, b, "PowerSGD shoal vs gloo", rtol=1e-3, atol=1e-4)
        _replicas_agree(a, None, "PowerSGD")

    c.run("ddp plain", plain)
    c.run("ddp small buckets", small_buckets)
    c.run("ddp comm hooks", hooks)
    c.run("ddp powerSGD", powersgd)
    dist.destroy_process_group()
    return c.report()


# ----------------------------------------------------------------- compat

@suite("compat")
def compat():
    c = Checks()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import smdistributed.dataparallel.torch.distributed as sdist
        from smdistributed.dataparallel.torch.parallel.distributed import DistributedDataParallel
        assert sdist.is_available()
        sdist.init_process_group()
        assert sdist.is_initialized() and sdist.is_initialized()
        assert dist.get_backend() == "smddp", dist.get_backend()
        assert sdist.get_world_size() == WS and sdist.get_rank() == RANK
        assert sdist.get_local_rank() == int(os.environ["LOCAL_RANK"])
        t = torch.ones(3)
        sdist.all_reduce(t)
        sdist.all_reduce(t, op=sdist.ReduceOp.SUM)
        b = torch.full((2,), float(RANK))
        sdist.broadcast(b, 0)
        outs = [torch.empty(2) for _ in range(WS)]
        sdist.all_gather(outs, b)
        o = torch.empty(WS)
        sdist.all_to_all_single(o, torch.arange(WS, dtype=torch.float32))
        sdist.barrier()
        model = DistributedDataParallel(_model(5 + RANK))
        model(torch.randn(2, 20)).sum().backward()
        model2 = DistributedDataParallel(_model(6), broadcast_buffers=False, bucket_cap_mb=1)
        del model2
    dep = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)
           and "smdistributed" in str(w.message)]
    apis = ["is_available", "init_process_group", "is_initialized", "get_world_size", "get_rank",
            "get_local_rank", "all_reduce", "broadcast", "all_gather", "all_to_all_single",
            "barrier", "ReduceOp", "DistributedDataParallel"]

    def one_warning_each():
        for api in apis:
            n = sum(1 for m in dep if f".{api} is deprecated" in m)
            assert n == 1, f"{api}: {n} DeprecationWarnings (want 1): {dep}"
        assert len(dep) == len(apis), dep

    c.run("one DeprecationWarning per API", one_warning_each)
    c.run("values", lambda: (close(t, torch.full((3,), float(WS * WS)), "all_reduce"),
                             close(b, torch.zeros(2), "broadcast"),
                             close(o, torch.full((WS,), float(RANK)), "all_to_all_single")))
    dist.destroy_process_group()
    return c.report()


@suite("init_methods")
def init_methods():
    """smddp through the current API, with tcp:// then file:// init methods."""
    import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401
    c = Checks()
    port = int(os.environ["MASTER_PORT"])
    for method in (f"tcp://127.0.0.1:{port}", "file://" + os.environ["TEST_INIT_FILE"]):
        dist.init_process_group("smddp", init_method=method, rank=RANK, world_size=WS,
                                timeout=datetime.timedelta(seconds=60))
        t = torch.ones(2)
        dist.all_reduce(t)
        c.run(f"allreduce over {method.split(':')[0]}", close, t, torch.full((2,), float(WS)), method)
        dist.barrier()
        dist.destroy_process_group()
    return c.report()


def _open_fds():
    """What this process has open, as "fd -> target" ("socket:[123]", ...)."""
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.add(f"{fd} -> {os.readlink(f'/proc/self/fd/{fd}')}")
        except OSError:
            pass  # closed meanwhile (listdir's own fd)
    return out


@suite("groups")
def groups():
    """Subgroups reuse the default group's connections (SHOAL_GROUP_CONNECTIONS=shared,
    the default: no new file descriptors), or make their own (=own, or one group's
    pg_options=shoal.torch.Options(own_connections=True)); either way they
    compute the same, p2p uses global ranks, and a Gloo-default job's shoal
    groups share the first shoal group's connections."""
    import shoal.torch  # noqa: F401
    c = Checks()
    shared = os.environ.get("SHOAL_GROUP_CONNECTIONS", "shared") == "shared"
    dist.init_process_group("shoal", timeout=datetime.timedelta(seconds=60))
    g_gloo = dist.new_group([0, WS - 1], backend="gloo")
    if RANK in (0, WS - 1):
        dist.all_reduce(torch.ones(1), group=g_gloo)  # Gloo's sockets open before counting
    # connect every pair on the default group first
    dist.all_to_all_single(torch.empty(WS), torch.arange(WS, dtype=torch.float32))
    before = _open_fds()
    tail = list(range(1, WS))  # group rank = global rank - 1
    g_tail = dist.new_group(tail)
    g_pair = dist.new_group([0, WS - 1])

    def collectives():
        if RANK not in tail:
            return
        outs = [torch.empty(1) for _ in tail]
        dist.all_gather(outs, torch.tensor([float(RANK)]), group=g_tail)
        close(torch.cat(outs), torch.tensor([float(r) for r in tail]), "all_gather on the tail group")
        t = torch.full((1 << 16,), float(RANK + 1))
        dist.all_reduce(t, group=g_tail)
        close(t, torch.full((1 << 16,), float(sum(r + 1 for r in tail))), "all_reduce on the tail group")
        b = torch.full((3,), float(RANK))
        dist.broadcast(b, src=WS - 1, group=g_tail)  # global rank
        close(b, torch.full((3,), float(WS - 1)), "broadcast from a global rank")

    def pair():
        if RANK not in (0, WS - 1):
            return
        x = torch.full((4,), float(RANK))
        dist.all_reduce(x, group=g_pair)
        y = torch.full((4,), float(RANK))
        dist.all_reduce(y, group=g_gloo)
        close(x, y, "pair vs gloo pair")
        # point to point in global ranks; the default group's message with the
        # same tag does not match the group's
        if RANK == 0:
            a, b = torch.zeros(2), torch.zeros(2)
            wa = dist.irecv(a, src=WS - 1, tag=5, group=g_pair)
            wb = dist.irecv(b, src=WS - 1, tag=5)
            wb.wait()
            wa.wait()
            close(a, torch.full((2,), 1.0), "p2p on the group")
            close(b, torch.full((2,), 2.0), "p2p on the default group")
        else:
            dist.send(torch.full((2,), 2.0), dst=0, tag=5)
            dist.send(torch.full((2,), 1.0), dst=0, tag=5, group=g_pair)

    def async_interleaved():
        # alternate the default group and a group without waiting: both run
        # in issue order on every rank
        works, want = [], []
        for i in range(20):
            a = torch.full((4096,), float(RANK + i))
            b = torch.full((8,), float(RANK * i))
            works.append(dist.all_reduce(a, async_op=True))
            want.append((a, float(sum(r + i for r in range(WS)))))
            if RANK in tail:
                works.append(dist.all_reduce(b, group=g_tail, async_op=True))
                want.append((b, float(sum(r * i for r in tail))))
        for w in reversed(works):
            w.wait()
        for k, (t, v) in enumerate(want):
            close(t, torch.full_like(t, v), f"async interleaved [{k}]")

    def descriptors():
        opened = sorted(_open_fds() - before)
        if shared:
            assert not opened, f"opened for shoal subgroups (want nothing): {opened}"
        else:
            assert opened, "SHOAL_GROUP_CONNECTIONS=own made no connections of its own"

    def own_by_options():
        # one group asks for its own connections (pg_options), whatever the knob says
        before_own = _open_fds()
        g_own = dist.new_group([0, WS - 1], pg_options=shoal.torch.Options(own_connections=True))
        if RANK in (0, WS - 1):
            x = torch.full((4,), float(RANK))
            dist.all_reduce(x, group=g_own)
            close(x, torch.full((4,), float(WS - 1)), "all_reduce on a group with its own connections")
            assert sorted(_open_fds() - before_own), "pg_options own_connections made no connections of its own"

    c.run("subgroup collectives", collectives)
    c.run("pair group, p2p, vs gloo", pair)
    c.run("async interleaved", async_interleaved)
    dist.barrier()
    c.run("file descriptors", descriptors)
    c.run("own connections by pg_options", own_by_options)
    dist.destroy_process_group()
    return c.report()


@suite("groups_bad_knob")
def groups_bad_knob():
    """A bad SHOAL_GROUP_CONNECTIONS is an error naming it on every rank, not a wait."""
    import shoal.torch  # noqa: F401
    c = Checks()

    def init():
        try:
            dist.init_process_group("shoal", timeout=datetime.timedelta(seconds=60))
        except (RuntimeError, ValueError) as e:
            assert "SHOAL_GROUP_CONNECTIONS: 'bogus' is not one of shared, own" in str(e), str(e)
            return
        raise AssertionError("init_process_group accepted SHOAL_GROUP_CONNECTIONS=bogus")
    c.run("bad SHOAL_GROUP_CONNECTIONS", init)
    return c.report()


@suite("mixed")
def mixed():
    """Gloo as the default backend, shoal for a subgroup; and both in one backend string."""
    import shoal.torch  # noqa: F401
    c = Checks()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    sh = dist.new_group(backend="shoal")
    t = torch.ones(3)
    dist.all_reduce(t, group=sh)
    dist.all_reduce(t)
    c.run("gloo default + shoal group", close, t, torch.full((3,), float(WS * WS)), "mixed")
    dist.destroy_process_group()
    return c.report()


def main():
    name = sys.argv[1]
    if name not in ("compat", "init_methods", "mixed"):
        import shoal.torch  # noqa: F401
    return SUITES[name]()


if __name__ == "__main__":
    sys.exit(main())
