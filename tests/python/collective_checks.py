"""What a test rank checks its collectives with (worker.py's suites and the
other workers): seeded inputs that every rank can make for every other rank,
references computed locally, tolerances, and one check per operation, each
run on shoal and, where Gloo supports the call, on a Gloo group of the same
ranks (Ctx.both)."""

import datetime
import os
import zlib

import torch
import torch.distributed as dist

RANK = int(os.environ["RANK"])
WS = int(os.environ["WORLD_SIZE"])


# ----------------------------------------------------------------- inputs

FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INTS = (torch.int8, torch.uint8, torch.int32, torch.int64)


def make(seed, rank, shape, dtype, op=None):
    g = torch.Generator().manual_seed(seed * 1009 + rank)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) < 0.5
    if dtype.is_complex:
        return torch.randn(shape, generator=g, dtype=dtype)
    if dtype.is_floating_point:
        if op == "prod":
            return (torch.rand(shape, generator=g) + 0.5).to(dtype)
        return torch.randn(shape, generator=g).to(dtype)
    lo, hi = (1, 3) if op == "prod" else ((0, 60) if dtype == torch.uint8 else (-40, 40))
    if dtype == torch.int8 and op not in ("prod",):
        lo, hi = -20, 20
    return torch.randint(lo, hi, shape, generator=g).to(dtype)


def tol(dtype):
    return {torch.float16: (1e-2, 1e-2), torch.bfloat16: (3e-2, 3e-2),
            torch.float32: (1e-5, 1e-5), torch.float64: (1e-10, 1e-10),
            torch.complex64: (1e-5, 1e-5)}.get(dtype, (0, 0))


def close(got, want, what=""):
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    rtol, atol = tol(got.dtype)
    if rtol == 0:
        ok = torch.equal(got, want)
    else:
        ok = torch.allclose(got.to(torch.complex128 if got.is_complex() else torch.float64),
                            want.to(torch.complex128 if want.is_complex() else torch.float64),
                            rtol=rtol, atol=atol * max(1, WS))
    if not ok:
        raise AssertionError(f"{what}: mismatch\n got {got.flatten()[:8]}\nwant {want.flatten()[:8]}")


OPS = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
       "max": dist.ReduceOp.MAX, "band": dist.ReduceOp.BAND, "bor": dist.ReduceOp.BOR,
       "bxor": dist.ReduceOp.BXOR, "avg": dist.ReduceOp.AVG}


def ref_reduce(ts, op):
    acc = ts[0].clone()
    for t in ts[1:]:
        if op == "sum" or op == "avg":
            acc = (acc | t) if acc.dtype == torch.bool else acc + t
        elif op == "prod":
            acc = (acc & t) if acc.dtype == torch.bool else acc * t
        elif op == "min":
            acc = torch.minimum(acc, t)
        elif op == "max":
            acc = torch.maximum(acc, t)
        elif op == "band":
            acc = acc & t
        elif op == "bor":
            acc = acc | t
        elif op == "bxor":
            acc = acc ^ t
    if op == "avg":
        acc = acc / len(ts)
    return acc


def ref_reduce_hp(ts, op):
    """Reference in high precision for low-precision floats (shoal accumulates in f32)."""
    if ts[0].dtype in (torch.float16, torch.bfloat16):
        return ref_reduce([t.double() for t in ts], op).to(ts[0].dtype)
    return ref_reduce(ts, op)


def noncontig(t):
    """A non-contiguous tensor with t's values (a strided view of a bigger one)."""
    big = torch.zeros((t.numel(), 2), dtype=t.dtype)
    v = big[:, 1]
    v.copy_(t.flatten())
    assert not v.is_contiguous() or t.numel() <= 1
    return v.view(t.shape) if t.dim() <= 1 else v.reshape(t.shape)


class Ctx:
    def __init__(self):
        self.gloo = dist.new_group(backend="gloo")

    def both(self, fn):
        """Runs fn(group) on shoal (default group) then on the Gloo group; returns both."""
        a = fn(None)
        try:
            b = fn(self.gloo)
        except (RuntimeError, ValueError) as e:
            if "not support" in str(e) or "Unsupported" in str(e) or "Cannot use" in str(e) \
                    or "not implemented" in str(e).lower() or "Invalid" in str(e):
                b = None  # Gloo cannot do it: the local reference decides
            else:
                raise
        return a, b


# ----------------------------------------------------------------- checks

def check_allreduce(ctx, dtype, op, n, contiguous=True, async_op=False):
    seed = zlib.crc32(f"{dtype} {op} {n}".encode()) % 100000
    ins = [make(seed, r, (n,), dtype, op) for r in range(WS)]
    want = ref_reduce_hp(ins, op)

    def run(group):
        t = ins[RANK].clone() if contiguous else noncontig(ins[RANK])
        w = dist.all_reduce(t, op=OPS[op], group=group, async_op=async_op)
        if async_op:
            fut = w.get_future()
            res = fut.wait()
            assert isinstance(res, list) and res[0] is not None
            if group is None:
                assert w.is_completed()
                close(res[0], want, "future value")
        return t

    a, b = ctx.both(run)
    close(a, want, f"shoal allreduce {dtype} {op} n={n}")
    if b is not None and op != "avg" and contiguous:  # Gloo mishandles non-contiguous
        close(a, b, f"shoal vs gloo allreduce {dtype} {op}")


def check_premul_sum():
    for dtype in (torch.float32, torch.float64):
        ins = [make(77, r, (33,), dtype) for r in range(WS)]
        t = ins[RANK].clone()
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(2.5))
        close(t, sum(x * 2.5 for x in ins), "premul_sum scalar")
        t = ins[RANK].clone()
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(torch.tensor([0.5], dtype=dtype)))
        close(t, sum(x * 0.5 for x in ins), "premul_sum tensor factor")


def check_allreduce_coalesced(ctx):
    shapes = [(3,), (2, 5), (0,), (7,)]
    ins = [[make(11 + i, r, s, torch.float32) for i, s in enumerate(shapes)] for r in range(WS)]
    mine = [t.clone() for t in ins[RANK]]
    mine[1] = noncontig(mine[1])
    dist.all_reduce_coalesced(mine)
    g = [t.clone() for t in ins[RANK]]
    dist.all_reduce_coalesced(g, group=ctx.gloo)
    for i in range(len(shapes)):
        close(mine[i], ref_reduce([ins[r][i] for r in range(WS)], "sum"), f"coalesced[{i}]")
        close(mine[i], g[i], f"coalesced vs gloo [{i}]")
    # through the ProcessGroup object, async with a future
    pg = dist.distributed_c10d._get_default_group()
    mine = [t.clone() for t in ins[RANK]]
    w = pg.allreduce_coalesced(mine)
    w.wait()
    for i in range(len(shapes)):
        close(mine[i], ref_reduce([ins[r][i] for r in range(WS)], "sum"), f"pg coalesced[{i}]")


def check_broadcast(ctx, dtype, n, contiguous=True):
    got = []
    for root in range(WS):
        ins = [make(root + 3, r, (n,), dtype) for r in range(WS)]

        def run(group):
            t = ins[RANK].clone() if contiguous else noncontig(ins[RANK])
            dist.broadcast(t, src=root, group=group)
            return t
        got.append((root, ins) + ctx.both(run))
    for root, ins, a, b in got:  # asserts after every rank ran every collective
        close(a, ins[root], f"broadcast {dtype} root {root}")
        if b is not None and contiguous:  # Gloo mishandles non-contiguous tensors
            close(a, b, "broadcast vs gloo")


def check_reduce(ctx, dtype, op):
    got = []
    for root in range(WS):
        ins = [make(root + 5, r, (19,), dtype, op) for r in range(WS)]

        def run(group):
            t = ins[RANK].clone()
            dist.reduce(t, dst=root, op=OPS[op], group=group)
            return t
        got.append((root, ins) + ctx.both(run))
    for root, ins, a, b in got:
        if RANK == root:
            close(a, ref_reduce_hp(ins, op), f"reduce {dtype} {op} root {root}")
            if b is not None:
                close(a, b, "reduce vs gloo")
        else:
            close(a, ins[RANK], "reduce leaves non-root inputs unchanged")


def check_all_gather(ctx, dtype, n):
    ins = [make(21, r, (n, 3), dtype) for r in range(WS)]

    def run(group):
        outs = [torch.empty((n, 3), dtype=dtype) for _ in range(WS)]
        outs[-1] = noncontig(outs[-1])
        dist.all_gather(outs, ins[RANK], group=group)
        return torch.stack(outs)
    a, b = ctx.both(run)
    close(a, torch.stack(ins), f"all_gather {dtype}")
    if b is not None:
        close(a, b, "all_gather vs gloo")
    # uneven sizes (allgatherv)
    ins = [make(22, r, (r + 1,), dtype) for r in range(WS)]
    outs = [torch.empty((r + 1,), dtype=dtype) for r in range(WS)]
    w = dist.all_gather(outs, ins[RANK], async_op=True)
    w.wait()
    for r in range(WS):
        close(outs[r], ins[r], f"uneven all_gather [{r}]")


def check_all_gather_into_tensor(ctx, dtype):
    ins = [make(23, r, (5, 2), dtype) for r in range(WS)]

    def run(group):
        out = torch.empty((WS * 5, 2), dtype=dtype)
        dist.all_gather_into_tensor(out, ins[RANK], group=group)
        return out
    a, b = ctx.both(run)
    close(a, torch.cat(ins), "all_gather_into_tensor")
    if b is not None:
        close(a, b, "all_gather_into_tensor vs gloo")
    # stacked output, in place (input is this rank's block of the output)
    out = torch.empty((WS, 5, 2), dtype=dtype)
    out[RANK].copy_(ins[RANK])
    w = dist.all_gather_into_tensor(out, out[RANK], async_op=True)
    fut_val = w.get_future().wait()
    close(out, torch.stack(ins), "in-place all_gather_into_tensor")
    close(fut_val[0], torch.stack(ins), "all_gather_into_tensor future")


def check_gather_coalesced(ctx):
    pg = dist.distributed_c10d._get_default_group()
    shapes = [(4,), (2, 3)]
    ins = [[make(31 + i, r, s, torch.float32) for i, s in enumerate(shapes)] for r in range(WS)]
    outs = [torch.empty((WS * s[0],) + s[1:]) for s in shapes]
    pg.allgather_into_tensor_coalesced(outs, ins[RANK]).wait()
    for i in range(len(shapes)):
        close(outs[i], torch.cat([ins[r][i] for r in range(WS)]), f"allgather_into_tensor_coalesced[{i}]")
    lists = [[torch.empty(s) for s in shapes] for _ in range(WS)]
    dist.all_gather_coalesced(lists, ins[RANK])
    glists = [[torch.empty(s) for s in shapes] for _ in range(WS)]
    dist.all_gather_coalesced(glists, ins[RANK], group=ctx.gloo)
    for r in range(WS):
        for i in range(len(shapes)):
            close(lists[r][i], ins[r][i], f"all_gather_coalesced[{r}][{i}]")
            close(lists[r][i], glists[r][i], "all_gather_coalesced vs gloo")


def check_gather_scatter(ctx, dtype):
    got = []
    for root in range(WS):
        ins = [make(41 + root, r, (6,), dtype) for r in range(WS)]

        def run_gather(group):
            outs = [torch.empty(6, dtype=dtype) for _ in range(WS)] if RANK == root else None
            dist.gather(ins[RANK], gather_list=outs, dst=root, group=group)
            return torch.stack(outs) if outs else None
        ga, gb = ctx.both(run_gather)
        chunks = [make(51 + root, r, (4,), dtype) for r in range(WS)]

        def run_scatter(group):
            out = torch.empty(4, dtype=dtype)
            dist.scatter(out, scatter_list=chunks if RANK == root else None, src=root, group=group)
            return out
        sa, sb = ctx.both(run_scatter)
        got.append((root, ins, chunks, ga, gb, sa, sb))
    for root, ins, chunks, ga, gb, sa, sb in got:
        if RANK == root:
            close(ga, torch.stack(ins), f"gather root {root}")
            if gb is not None:
                close(ga, gb, "gather vs gloo")
        close(sa, chunks[RANK], f"scatter root {root}")
        if sb is not None:
            close(sa, sb, "scatter vs gloo")


def check_reduce_scatter(ctx, dtype, op):
    ins = [[make(61 + j, r, (3, 2), dtype, op) for j in range(WS)] for r in range(WS)]
    want = ref_reduce_hp([ins[r][RANK] for r in range(WS)], op)
    out = torch.empty((3, 2), dtype=dtype)
    dist.reduce_scatter(out, ins[RANK], op=OPS[op])
    close(out, want, f"reduce_scatter {dtype} {op}")
    # tensor form: a real reduce-scatter
    flat = [torch.cat([ins[r][j] for j in range(WS)]) for r in range(WS)]

    def run(group):
        o = torch.empty((3, 2), dtype=dtype)
        dist.reduce_scatter_tensor(o, flat[RANK], op=OPS[op], group=group)
        return o
    a, b = ctx.both(run)
    close(a, want, f"reduce_scatter_tensor {dtype} {op}")
    if b is not None and op != "avg":
        close(a, b, "reduce_scatter_tensor vs gloo")
    # uneven list (reduce_scatterv)
    ins = [[make(71 + j, r, (j + 1,), dtype, op) for j in range(WS)] for r in range(WS)]
    out = torch.empty((RANK + 1,), dtype=dtype)
    dist.reduce_scatter(out, ins[RANK], op=OPS[op])
    close(out, ref_reduce_hp([ins[r][RANK] for r in range(WS)], op), "uneven reduce_scatter")


def check_reduce_scatter_coalesced():
    pg = dist.distributed_c10d._get_default_group()
    shapes = [(2,), (3, 2)]
    ins = [[make(81 + i, r, (WS * s[0],) + s[1:], torch.float32) for i, s in enumerate(shapes)]
           for r in range(WS)]
    outs = [torch.empty(s) for s in shapes]
    outs[1] = noncontig(outs[1])
    pg.reduce_scatter_tensor_coalesced(outs, ins[RANK]).wait()
    for i, s in enumerate(shapes):
        total = ref_reduce([ins[r][i] for r in range(WS)], "sum")
        close(outs[i], total.narrow(0, RANK * s[0], s[0]), f"reduce_scatter_tensor_coalesced[{i}]")


def check_alltoall(ctx, dtype):
    # equal split
    ins = [make(91, r, (WS * 3,), dtype) for r in range(WS)]

    def run(group):
        out = torch.empty(WS * 3, dtype=dtype)
        dist.all_to_all_single(out, ins[RANK], group=group)
        return out
    a, b = ctx.both(run)
    want = torch.cat([ins[r][RANK * 3:(RANK + 1) * 3] for r in range(WS)])
    close(a, want, "all_to_all_single equal")
    if b is not None:
        close(a, b, "all_to_all_single vs gloo")

    # split sizes: rank r sends (r + j + 1) rows of 2 to rank j
    def splits(r):
        return [r + j + 1 for j in range(WS)]
    ins = [make(92, r, (sum(splits(r)), 2), dtype) for r in range(WS)]
    in_splits = splits(RANK)
    out_splits = [r + RANK + 1 for r in range(WS)]

    def run2(group):
        out = torch.empty((sum(out_splits), 2), dtype=dtype)
        dist.all_to_all_single(out, ins[RANK], out_splits, in_splits, group=group)
        return out
    a, b = ctx.both(run2)
    pieces = []
    for r in range(WS):
        off = sum(splits(r)[:RANK])
        pieces.append(ins[r][off:off + splits(r)[RANK]])
    close(a, torch.cat(pieces), "all_to_all_single splits")
    if b is not None:
        close(a, b, "all_to_all_single splits vs gloo")
    # list form with uneven sizes
    lin = [[make(93, r * 10 + j, (r + 2 * j + 1,), dtype) for j in range(WS)] for r in range(WS)]
    outs = [torch.empty((r + 2 * RANK + 1,), dtype=dtype) for r in range(WS)]
    dist.all_to_all(outs, lin[RANK])
    for r in range(WS):
        close(outs[r], lin[r][RANK], f"all_to_all list [{r}]")


def check_p2p():
    if WS == 1:
        return
    nxt, prv = (RANK + 1) % WS, (RANK - 1) % WS
    x = make(101, RANK, (10,), torch.float32)
    got = torch.empty(10)
    reqs = [dist.isend(x, nxt, tag=3), dist.irecv(got, prv, tag=3)]
    for q in reqs:
        q.wait()
    close(got, make(101, prv, (10,), torch.float32), "isend/irecv ring")
    # batch_isend_irecv, both directions, two tags
    a, b2 = torch.empty(10), torch.empty(10)
    ops = [dist.P2POp(dist.isend, x, nxt), dist.P2POp(dist.irecv, a, prv),
           dist.P2POp(dist.isend, x * 2, prv), dist.P2POp(dist.irecv, b2, nxt)]
    for q in dist.batch_isend_irecv(ops):
        q.wait()
    close(a, make(101, prv, (10,), torch.float32), "batch_isend_irecv prev")
    close(b2, make(101, nxt, (10,), torch.float32) * 2, "batch_isend_irecv next")
    # blocking send/recv + recv from any source (rank 0 collects from all)
    if RANK == 0:
        seen = set()
        for _ in range(WS - 1):
            t = torch.empty(2, dtype=torch.int64)
            src = dist.recv(t)
            assert t[0].item() == src and t[1].item() == 7, f"recv any: {t} from {src}"
            seen.add(src)
        assert seen == set(range(1, WS)), seen
    else:
        dist.send(torch.tensor([RANK, 7]), 0)
    # non-contiguous receive
    if RANK == 0:
        dist.send(torch.arange(6, dtype=torch.float32), 1 % WS)
    elif RANK == 1:
        t = noncontig(torch.zeros(6))
        dist.recv(t, 0)
        close(t.contiguous(), torch.arange(6, dtype=torch.float32), "non-contiguous recv")


def check_barriers():
    dist.barrier()
    w = dist.barrier(async_op=True)
    w.wait()
    pg = dist.distributed_c10d._get_default_group()
    pg.monitored_barrier(datetime.timedelta(seconds=30), True)
    pg.monitored_barrier(datetime.timedelta(seconds=30), False)


def check_futures():
    t = torch.full((4,), float(RANK + 1))
    fut = dist.all_reduce(t, async_op=True).get_future()
    chained = fut.then(lambda f: f.value()[0] * 2)
    total = WS * (WS + 1) / 2
    close(chained.wait(), torch.full((4,), 2 * total), "future.then")
    # many in flight, completion in issue order
    ts = [torch.full((1000,), float(i + RANK)) for i in range(20)]
    works = [dist.all_reduce(x, async_op=True) for x in ts]
    futs = [w.get_future() for w in works[::2]]
    torch.futures.wait_all(futs)
    for w in works:
        w.wait()
    for i, x in enumerate(ts):
        close(x, torch.full((1000,), float(WS * i + total - WS)), f"in flight [{i}]")
    # wait with a timeout, is_completed, result
    w = dist.all_reduce(torch.ones(3), async_op=True)
    assert w.wait(datetime.timedelta(seconds=30))
    assert w.is_completed() and w.is_success()
    close(w.result()[0], torch.full((3,), float(WS)), "work.result")


def check_subgroups(ctx):
    # every rank creates every group, in the same order
    evens = list(range(0, WS, 2))
    tail = list(range(1, WS))
    g_even = dist.new_group(evens)
    g_tail = dist.new_group(tail) if tail else None
    g_even_gloo = dist.new_group(evens, backend="gloo")
    if RANK in evens:
        t = torch.full((5,), float(RANK + 1))
        dist.all_reduce(t, group=g_even)
        close(t, torch.full((5,), float(sum(r + 1 for r in evens))), "subgroup allreduce")
        u = torch.full((5,), float(RANK + 1))
        dist.all_reduce(u, group=g_even_gloo)
        close(t, u, "subgroup vs gloo subgroup")
        b = torch.full((3,), float(RANK))
        dist.broadcast(b, src=evens[-1], group=g_even)  # global rank
        close(b, torch.full((3,), float(evens[-1])), "subgroup broadcast")
    if g_tail is not None and RANK in tail:
        outs = [torch.empty(2) for _ in tail]
        dist.all_gather(outs, torch.full((2,), float(RANK)), group=g_tail)
        close(torch.stack(outs), torch.stack([torch.full((2,), float(r)) for r in tail]),
              "subgroup all_gather")
    # interleave world, subgroup and gloo collectives
    t = torch.ones(2)
    dist.all_reduce(t)
    dist.all_reduce(t, group=ctx.gloo)
    close(t, torch.full((2,), float(WS * WS)), "world after subgroups")


def check_odd_dtypes(ctx):
    # data movement of dtypes shoal has no kernel for (they travel as bytes)
    for dtype in (torch.int16, torch.complex64, torch.float64):
        ins = [make(111, r, (4,), dtype) for r in range(WS)]
        t = ins[RANK].clone()
        dist.broadcast(t, src=0)
        close(t, ins[0], f"broadcast {dtype}")
        outs = [torch.empty(4, dtype=dtype) for _ in range(WS)]
        dist.all_gather(outs, ins[RANK])
        close(torch.stack(outs), torch.stack(ins), f"all_gather {dtype}")
    # complex sum
    ins = [make(112, r, (6,), torch.complex64) for r in range(WS)]
    t = ins[RANK].clone()
    dist.all_reduce(t)
    close(t, sum(ins[1:], ins[0].clone()), "complex allreduce")


def expect_error(fn, *words):
    try:
        fn()
    except (RuntimeError, ValueError, TypeError) as e:
        msg = str(e)
        for w in words:
            assert w in msg, f"error message lacks {w!r}: {msg}"
        return msg
    raise AssertionError(f"no error raised (expected one naming {words})")
