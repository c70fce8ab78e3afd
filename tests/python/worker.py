"""One rank of a test job (see harness.py). Usage: worker.py SUITE.

Every check runs its collectives on shoal and, where Gloo supports the same
call, on a Gloo group of the same ranks with the same inputs, and compares
both with a reference computed locally (every rank can generate every other
rank's input: inputs are seeded by (check, rank)). Checks record failures and
go on; assertions come after a check's collectives so that one failing check
does not leave the ranks out of step.
"""

import datetime
import os
import sys
import tempfile
import warnings
import zlib

import torch
import torch.distributed as dist

warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", message=".*deprecated.*", category=UserWarning)

RANK = int(os.environ["RANK"])
WS = int(os.environ["WORLD_SIZE"])
SUITES = {}


def suite(name):
    def reg(fn):
        SUITES[name] = fn
        return fn
    return reg


from harness import Checks  # noqa: E402


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

def expect_error(fn, *words):
    try:
        fn()
    except (RuntimeError, ValueError, TypeError) as e:
        msg = str(e)
        for w in words:
            assert w in msg, f"error message lacks {w!r}: {msg}"
        return msg
    raise AssertionError(f"no error raised (expected one naming {words})")


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
    the default: no new file descriptors), or make their own (=own); either way
    they compute the same, p2p uses global ranks, and a Gloo-default job's
    shoal groups share the first shoal group's connections."""
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

    c.run("subgroup collectives", collectives)
    c.run("pair group, p2p, vs gloo", pair)
    c.run("async interleaved", async_interleaved)
    dist.barrier()
    c.run("file descriptors", descriptors)
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
