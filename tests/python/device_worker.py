"""One rank of a device-path job (test_device.py) on the test accelerator "fakegpu",
or on a real GPU (tests/gpu: SHOAL_TEST_DEVICE=cuda).

Usage: device_worker.py SUITE. The fake device (tests/fakegpu/fakegpu.cc) runs
each stream's work on a thread of its own, so the stream semantics checked
here are real: a missing stream wait or a tensor freed too early gives a
wrong value. ``set_transfer_delay_ms`` slows host<->device copies so that
such a race is lost every time, not by luck.
"""

import contextlib
import datetime
import os
import sys

import torch

if os.environ.get("SHOAL_TEST_DEVICE", "fakegpu") == "fakegpu":
    import fakegpu
    EXT = fakegpu.load()  # before shoal: the backend then serves "fakegpu"
    DEV = torch.device("fakegpu", 0)
    OTHER = torch.device("fakegpu", 1)
else:  # tests/gpu: a real GPU, shared by the ranks when there is one
    class EXT:  # noqa: N801  (the same helpers, on CUDA)
        @staticmethod
        def set_transfer_delay_ms(ms):
            pass  # real copies take the time they take

        @staticmethod
        def slow_fill_(t, value, ms):
            torch.cuda._sleep(int(ms * 1_000_000))  # ~1 GHz cycles: a long kernel
            t.fill_(value)
    n = torch.cuda.device_count()
    DEV = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % n)
    OTHER = torch.device("cuda", (DEV.index + 1) % n) if n > 1 else None
    torch.cuda.set_device(DEV)

import torch.distributed as dist  # noqa: E402

import shoal.torch  # noqa: E402,F401
from collective_checks import OPS, RANK, WS, close, expect_error, make, ref_reduce_hp  # noqa: E402
from harness import Checks  # noqa: E402
from worker import _bf16_hook  # noqa: E402

SUITES = {}


def suite(fn):
    SUITES[fn.__name__] = fn
    return fn


def init():
    dist.init_process_group("shoal", timeout=datetime.timedelta(seconds=60))
    return dist.distributed_c10d._get_default_group()


def on(t):
    return t.to(DEV)


def inputs(seed, shape, dtype, op=None):
    return [make(seed, r, shape, dtype, op) for r in range(WS)]


# ----------------------------------------------------------------- every operation

def check_all_reduce(dtype, op, n, contiguous=True):
    ins = inputs(11, (n,), dtype, op)
    t = on(ins[RANK])
    if not contiguous:
        t = on(torch.stack([ins[RANK], ins[RANK]], 1))[:, 0]
        assert not t.is_contiguous()
    dist.all_reduce(t, op=OPS[op])
    close(t.cpu(), ref_reduce_hp(ins, op), f"all_reduce {dtype} {op} n={n}")


def check_data_movement():
    x = make(3, RANK, (6,), torch.float32)
    xs = inputs(3, (6,), torch.float32)
    b = on(x)
    dist.broadcast(b, src=1 % WS)
    close(b.cpu(), xs[1 % WS], "broadcast")
    r = on(x)
    dist.reduce(r, dst=0)
    if RANK == 0:
        close(r.cpu(), sum(xs), "reduce")
    outs = [torch.empty(6, device=DEV) for _ in range(WS)]
    dist.all_gather(outs, on(x))
    for i in range(WS):
        close(outs[i].cpu(), xs[i], f"all_gather[{i}]")
    uneven = [torch.empty(i + 1, device=DEV) for i in range(WS)]
    dist.all_gather(uneven, torch.full((RANK + 1,), float(RANK), device=DEV))
    for i in range(WS):
        close(uneven[i].cpu(), torch.full((i + 1,), float(i)), f"all_gather uneven[{i}]")
    flat = torch.empty(6 * WS, device=DEV)
    dist.all_gather_into_tensor(flat, on(x))
    close(flat.cpu(), torch.cat(xs), "all_gather_into_tensor")
    rs = torch.empty(3, device=DEV)
    big = [make(5, r, (3 * WS,), torch.float32) for r in range(WS)]
    dist.reduce_scatter_tensor(rs, on(big[RANK]))
    close(rs.cpu(), sum(big)[3 * RANK:3 * RANK + 3], "reduce_scatter_tensor")
    rsl = torch.empty(3, device=DEV)
    dist.reduce_scatter(rsl, [on(c) for c in big[RANK].chunk(WS)])
    close(rsl.cpu(), sum(big)[3 * RANK:3 * RANK + 3], "reduce_scatter")
    a2a = torch.empty(2 * WS, device=DEV)
    src = torch.arange(2 * WS, dtype=torch.float32) + 100 * RANK
    dist.all_to_all_single(a2a, on(src))
    want = torch.cat([torch.arange(2 * RANK, 2 * RANK + 2, dtype=torch.float32) + 100 * r for r in range(WS)])
    close(a2a.cpu(), want, "all_to_all_single")
    send = [torch.full((r + 1,), float(RANK), device=DEV) for r in range(WS)]
    recv = [torch.empty(RANK + 1, device=DEV) for _ in range(WS)]
    dist.all_to_all(recv, send)
    for r in range(WS):
        close(recv[r].cpu(), torch.full((RANK + 1,), float(r)), f"all_to_all[{r}]")
    g = [torch.empty(6, device=DEV) for _ in range(WS)] if RANK == 0 else None
    dist.gather(on(x), g, dst=0)
    if RANK == 0:
        for i in range(WS):
            close(g[i].cpu(), xs[i], f"gather[{i}]")
    sc = torch.empty(6, device=DEV)
    dist.scatter(sc, [on(v) for v in xs] if RANK == 0 else None, src=0)
    close(sc.cpu(), xs[RANK], "scatter")
    co = [on(make(7, RANK, (5,), torch.float32)), on(make(8, RANK, (2, 2), torch.float32))]
    dist.all_reduce_coalesced(co)
    close(co[0].cpu(), sum(inputs(7, (5,), torch.float32)), "all_reduce_coalesced[0]")
    close(co[1].cpu(), sum(inputs(8, (2, 2), torch.float32)), "all_reduce_coalesced[1]")


def check_coalesced_tensor_forms():
    """allgather_into_tensor_coalesced and reduce_scatter_tensor_coalesced (FSDP's and DTensor's forms)."""
    ins = [on(make(21, RANK, (3,), torch.float32)), on(make(22, RANK, (2,), torch.float32))]
    outs = [torch.empty(3 * WS, device=DEV), torch.empty(2 * WS, device=DEV)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for o, i in zip(outs, ins):
            dist.all_gather_into_tensor(o, i)
    cm.wait()
    close(outs[0].cpu(), torch.cat(inputs(21, (3,), torch.float32)), "allgather_into_tensor_coalesced[0]")
    close(outs[1].cpu(), torch.cat(inputs(22, (2,), torch.float32)), "allgather_into_tensor_coalesced[1]")
    big = [on(make(23, RANK, (2 * WS,), torch.float32)), on(make(24, RANK, (WS,), torch.float32))]
    red = [torch.empty(2, device=DEV), torch.empty(1, device=DEV)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for o, i in zip(red, big):
            dist.reduce_scatter_tensor(o, i)
    cm.wait()
    close(red[0].cpu(), sum(inputs(23, (2 * WS,), torch.float32))[2 * RANK:2 * RANK + 2], "rs coalesced[0]")
    close(red[1].cpu(), sum(inputs(24, (WS,), torch.float32))[RANK:RANK + 1], "rs coalesced[1]")


def check_staging_bounded():
    """The pipelined all_reduces above kept their pieces within SHOAL_DEVICE_STAGING_BYTES."""
    stats = dist.distributed_c10d._get_default_group()._get_backend(DEV).device_staging()
    assert stats is not None and stats["device"] == str(DEV), stats
    assert stats["cap"] == int(os.environ["SHOAL_DEVICE_STAGING_BYTES"]), stats
    assert 0 < stats["high_water"] <= stats["cap"], stats


def check_p2p():
    if WS < 2:
        return
    peer = RANK ^ 1
    if peer >= WS:
        return
    mine = torch.full((5,), float(RANK), device=DEV)
    got = torch.empty(5, device=DEV)
    if RANK % 2 == 0:
        dist.send(mine, peer)
        dist.recv(got, peer)
    else:
        dist.recv(got, peer)
        dist.send(mine, peer)
    close(got.cpu(), torch.full((5,), float(peer)), "send/recv")
    got2 = torch.empty(5, device=DEV)
    ops = [dist.P2POp(dist.isend, mine, peer), dist.P2POp(dist.irecv, got2, peer)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    close(got2.cpu(), torch.full((5,), float(peer)), "batch_isend_irecv")


def check_one_group_both_devices():
    """A CPU barrier, a CPU all_reduce and a device one on the same group, interleaved."""
    d = torch.ones(4, device=DEV)
    w1 = dist.all_reduce(d, async_op=True)
    c = torch.ones(4)
    w2 = dist.all_reduce(c, async_op=True)
    dist.barrier()
    w2.wait()
    w1.wait()
    close(d.cpu(), torch.full((4,), float(WS)), "device all_reduce beside CPU ones")
    close(c, torch.full((4,), float(WS)), "CPU all_reduce beside device ones")


@suite
def device():
    init()
    c = Checks()
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.complex64):
        c.run(f"all_reduce {dtype}", check_all_reduce, dtype, "sum", 33)
    for op in ("max", "min", "prod", "avg"):
        c.run(f"all_reduce {op}", check_all_reduce, torch.float32, op, 17)
    c.run("all_reduce non-contiguous", check_all_reduce, torch.float32, "sum", 40, False)
    # SHOAL_DEVICE_CHUNK_BYTES is 4 KiB in this job: these go in pieces,
    # more of them than the 16 KiB staging cap holds at once.
    c.run("all_reduce pipelined float32", check_all_reduce, torch.float32, "sum", 40_000)
    c.run("all_reduce pipelined bfloat16", check_all_reduce, torch.bfloat16, "sum", 30_001)
    c.run("staging stays within its cap", check_staging_bounded)
    c.run("data movement", check_data_movement)
    c.run("coalesced tensor forms", check_coalesced_tensor_forms)
    c.run("point to point", check_p2p)
    c.run("one group, both devices", check_one_group_both_devices)
    return c.report()


# ----------------------------------------------------------------- stream semantics

def producer_is_seen():
    """A slow kernel queued on the current stream before the call is seen by it."""
    t = torch.zeros(1000, device=DEV)
    EXT.slow_fill_(t, float(RANK + 1), 300)
    dist.all_reduce(t)
    close(t.cpu(), torch.full((1000,), WS * (WS + 1) / 2), "all_reduce after a slow producer")


def consumer_after_wait():
    """Work queued on the current stream after wait() sees the result; the host is not made to wait for the copy back."""
    t = torch.full((1000,), float(RANK + 1), device=DEV)
    w = dist.all_reduce(t, async_op=True)
    w.wait()
    seen = t.clone()  # queued on the current stream, behind the slow copy back
    close(seen.cpu(), torch.full((1000,), WS * (WS + 1) / 2), "clone queued after wait()")
    w2 = dist.all_reduce(torch.ones(8, device=DEV), async_op=True)
    w2.synchronize()  # the stream waits; is_completed() may still lag the copy back here
    torch.accelerator.synchronize()
    assert w2.is_completed(), "is_completed() false after the device caught up"


def pipelined_consumer_after_wait():
    t = torch.full((6000,), float(RANK + 1), device=DEV)  # 6 pieces of 4 KiB
    w = dist.all_reduce(t, async_op=True)
    w.wait()
    seen = t.clone()
    close(seen.cpu(), torch.full((6000,), WS * (WS + 1) / 2), "pipelined all_reduce, clone after wait()")


def input_freed_while_running():
    """Dropping an input and allocating again on the same stream must not hand its memory out."""
    x = torch.full((1024,), float(RANK + 1), device=DEV)
    out = torch.empty(1024 * WS, device=DEV)
    w = dist.all_gather_into_tensor(out, x, async_op=True)
    del x  # the slow copy down has not read it yet
    y = torch.empty(1024, device=DEV)  # same size, same stream: the allocator would reuse it
    y.fill_(-1.0)
    w.wait()
    want = torch.cat([torch.full((1024,), float(r + 1)) for r in range(WS)])
    close(out.cpu(), want, "all_gather_into_tensor with its input dropped")
    del y


def output_freed_while_running():
    """The same for a tensor the operation writes: its copy back must not land in new memory."""
    t = torch.full((1024,), float(RANK + 1), device=DEV)
    w = dist.all_reduce(t, async_op=True)
    del t
    keep = torch.full((1024,), 7.0, device=DEV)  # would get t's memory if it were free
    w.wait()
    torch.accelerator.synchronize()
    close(keep.cpu(), torch.full((1024,), 7.0), "new tensor after dropping an all_reduce's output")


def future_on_stream():
    """The future's value is usable on the stream a callback runs on (DDP comm hooks)."""
    t = torch.full((1000,), float(RANK + 1), device=DEV)
    fut = dist.all_reduce(t, async_op=True).get_future()
    doubled = fut.then(lambda f: f.value()[0] * 2).wait()
    close(doubled.cpu(), torch.full((1000,), WS * (WS + 1.0)), "future.then on the device")


@suite
def streams():
    init()
    EXT.set_transfer_delay_ms(int(os.environ.get("FAKEGPU_DELAY_MS", "250")))
    c = Checks()
    c.run("producer before the call is seen", producer_is_seen)
    c.run("consumer after wait() sees the result", consumer_after_wait)
    c.run("pipelined: consumer after wait()", pipelined_consumer_after_wait)
    c.run("input freed while running", input_freed_while_running)
    c.run("output freed while running", output_freed_while_running)
    c.run("future on the stream", future_on_stream)
    EXT.set_transfer_delay_ms(0)
    return c.report()


# ----------------------------------------------------------------- bad input

@suite
def device_errors():
    init()
    c = Checks()

    def mixed():
        outs = [torch.empty(3) for _ in range(WS)]
        expect_error(lambda: dist.all_gather(outs, torch.ones(3, device=DEV)),
                     f"shoal rank {RANK}", "output_list[0]", "cpu", str(DEV))

    def other_device():
        dist.all_reduce(torch.ones(2, device=DEV))  # the group now works on DEV
        expect_error(lambda: dist.all_reduce(torch.ones(2, device=OTHER)), f"shoal rank {RANK}", str(OTHER), str(DEV))

    c.run("CPU and device tensors in one call", mixed)
    if OTHER is not None:
        c.run("a tensor on another device than the group's", other_device)
    # Nothing was sent by the refused calls: the ranks are still in step.
    t = torch.ones(3, device=DEV)
    dist.all_reduce(t)
    c.run("in step after refusals", close, t.cpu(), torch.full((3,), float(WS)), "after errors")
    return c.report()


# ----------------------------------------------------------------- failures

@suite
def device_failures():
    """A rank that is not there is named on a device operation too: rank 1
    stays out of a group's all_reduce (a timeout naming it), then dies while
    rank 0 runs a pipelined all_reduce (an error naming it, not a hang)."""
    init()
    store = dist.distributed_c10d._get_default_store()
    quick = dist.new_group(backend="shoal", timeout=datetime.timedelta(seconds=2))
    c = Checks()
    t = torch.ones(16, device=DEV)
    dist.all_reduce(t)
    c.run("all_reduce before", close, t.cpu(), torch.full((16,), float(WS)), "before")
    if RANK == 1:
        store.wait(["timed-out"])
        c.report()
        sys.stdout.flush()
        os._exit(0)  # dies with the world group's connections open

    def timeout_names_the_rank():
        try:
            dist.all_reduce(torch.ones(100, device=DEV), group=quick)
        except Exception as e:  # noqa: BLE001
            msg = str(e)
            assert "rank 1" in msg or "ranks [1]" in msg or "[1]" in msg, msg
            assert "time" in msg.lower(), msg
            return
        raise AssertionError("no error")

    def death_names_the_rank():
        big = torch.ones(50_000, device=DEV)  # 200 KB: pieces of 4 KiB, more than the pool holds
        try:
            for _ in range(50):  # until the death is seen
                dist.all_reduce(big)
        except Exception as e:  # noqa: BLE001
            assert "rank 1" in str(e) or "[1]" in str(e), str(e)
            return
        raise AssertionError("no error")

    c.run("a timeout on the device names the missing rank", timeout_names_the_rank)
    store.set("timed-out", "1")
    c.run("a peer's death during a pipelined all_reduce names it", death_names_the_rank)
    rc = c.report()
    sys.stdout.flush()
    os._exit(rc)  # the world group is broken: no orderly teardown


# ----------------------------------------------------------------- DDP and FSDP2

@contextlib.contextmanager
def _no_cuda_sync_for_cpu_buckets():
    """torch's PowerSGD hook calls torch.cuda.synchronize(bucket device) whenever
    CUDA is available, which raises for a CPU bucket: the CPU reference run on
    a GPU machine. There, synchronizing a CPU device does nothing."""
    real = torch.cuda.synchronize

    def synchronize(device=None):
        if device is None or torch.device(device).type == "cuda":
            real(device)
    torch.cuda.synchronize = synchronize
    try:
        yield
    finally:
        torch.cuda.synchronize = real


def _train(device, hook=None, steps=6):
    # The CPU reference on a GPU machine: torch's PowerSGD hook would sync a CPU bucket.
    cpu_beside_cuda = str(device) == "cpu" and torch.cuda.is_available()
    with _no_cuda_sync_for_cpu_buckets() if cpu_beside_cuda else contextlib.nullcontext():
        return _train_in(device, hook, steps)


def _train_in(device, hook, steps):
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(device)
    ddp = DDP(model, bucket_cap_mb=0.001)  # several buckets
    if hook is not None:
        ddp.register_comm_hook(*hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    losses = []
    for step in range(steps):
        g = torch.Generator().manual_seed(100 * step + RANK)
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
        loss = torch.nn.functional.mse_loss(ddp(x.to(device)), y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in model.parameters()]


def _train_fsdp2(device, steps=4):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh(torch.device(device).type, (WS,))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(device)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(steps):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(10 * step + RANK)).to(device)
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, [p.full_tensor().detach().cpu() for p in model.parameters()]


@suite
def device_ddp():
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    init()
    c = Checks()

    def same(hook_dev, hook_cpu, what, rtol=1e-5, atol=1e-6):
        ld, pd = _train(DEV, hook_dev)
        lc, pc = _train("cpu", hook_cpu)
        close(torch.tensor(ld), torch.tensor(lc), f"{what}: losses")
        for i, (a, b) in enumerate(zip(pd, pc)):
            assert torch.allclose(a, b, rtol=rtol, atol=atol), f"{what}: parameter {i} differs"

    c.run("DDP, default hook", same, None, None, "default")
    c.run("DDP, fp16 compression", same, (None, default_hooks.fp16_compress_hook),
          (None, default_hooks.fp16_compress_hook), "fp16")
    # (torch gates its own bf16 hook to NCCL and XCCL; worker.py's is the same hook, ungated)
    c.run("DDP, bf16 compression", same, (None, _bf16_hook), (None, _bf16_hook), "bf16")

    def powersgd():
        mk = lambda: psgd.PowerSGDState(process_group=None, matrix_approximation_rank=1,  # noqa: E731
                                        start_powerSGD_iter=2, random_seed=0)
        same((mk(), psgd.powerSGD_hook), (mk(), psgd.powerSGD_hook), "powerSGD", rtol=1e-4, atol=1e-5)
    c.run("DDP, PowerSGD", powersgd)

    def fsdp2():
        ld, pd = _train_fsdp2(DEV)
        lc, pc = _train_fsdp2("cpu")
        close(torch.tensor(ld), torch.tensor(lc), "FSDP2: losses")
        for i, (a, b) in enumerate(zip(pd, pc)):
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), f"FSDP2: parameter {i} differs"
    c.run("FSDP2 (fully_shard)", fsdp2)
    return c.report()


if __name__ == "__main__":
    sys.exit(SUITES[sys.argv[1]]())
