"""One rank of the bad-input job (tests/python/test_bad_input.py); see harness.py.

Only rank 0 makes the bad calls, between two good collectives that every rank
makes. Each bad call must raise from the call itself (RuntimeError, ValueError
or TypeError) with a message naming the argument — shoal's own checks also
name the rank and the collective, "shoal rank 0: <collective>: <argument>: ..."
— and must send nothing: the other ranks, which made no such call, still
agree with rank 0 on the next collectives, and rank 0's group sequence number
did not move. The table extends the few bad-input checks of worker.py's
"errors" suite to every collective and every kind of bad argument.
"""

import datetime
import json
import os
import traceback
import warnings

import torch
import torch.distributed as dist

import shoal.torch  # noqa: F401  (registers the backend)

warnings.filterwarnings("ignore")

RANK = int(os.environ["RANK"])
WS = int(os.environ["WORLD_SIZE"])


def f(n=4, dtype=torch.float32):
    return torch.ones(n, dtype=dtype)


def opts(cls, **kw):
    o = cls()
    for k, v in kw.items():
        setattr(o, k, v)
    return o


def table(pg, be):
    """(name, call, words the message must hold). `be` is the shoal backend
    object itself (the ProcessGroup dispatches by device, so a tensor on
    another device must be handed to the backend directly)."""
    W = WS
    meta = torch.empty(4, device="meta")
    shoal = "shoal rank 0: "
    rows = [
        # ---- wrong device (and devices mixed within one call)
        ("allreduce on meta", lambda: be.allreduce([meta]),
         [shoal + "allreduce: tensor:", "meta", "cpu"]),
        ("broadcast on meta", lambda: be.broadcast([meta], opts(dist.BroadcastOptions, rootRank=0)),
         [shoal + "broadcast: tensor:", "meta"]),
        ("allgather output on meta", lambda: be.allgather([[meta] * W], [f()]),
         [shoal + "allgather: output_list[0]:", "meta"]),
        ("allgather_into_tensor output on meta",
         lambda: be._allgather_base(torch.empty(4 * W, device="meta"), f()),
         [shoal + "allgather_into_tensor: output:", "meta"]),
        ("alltoall_base input on meta",
         lambda: be.alltoall_base(torch.empty(W), torch.empty(W, device="meta"), [], [], dist.AllToAllOptions()),
         [shoal + "alltoall_base: input:", "meta"]),
        ("send on meta", lambda: be.send([meta], 1 % W, 0), [shoal + "send: tensor:", "meta"]),
        # ---- mixed dtypes in lists (and between input and output)
        ("gather list dtypes differ",
         lambda: pg.gather([[f() for _ in range(W - 1)] + [f(dtype=torch.int32)]], [f()],
                           opts(dist.GatherOptions, rootRank=0)),
         [shoal + f"gather: gather_list[{W - 1}]:", "dtype int32 differs"]),
        ("scatter list dtypes differ",
         lambda: pg.scatter([f()], [[f(dtype=torch.float64)] + [f() for _ in range(W - 1)]],
                            opts(dist.ScatterOptions, rootRank=0)),
         [shoal + "scatter: scatter_list[0]:", "dtype float64 differs"]),
        ("reduce_scatter list dtypes differ",
         lambda: pg.reduce_scatter([f()], [[f() for _ in range(W - 1)] + [f(dtype=torch.float16)]],
                                   dist.ReduceScatterOptions()),
         [shoal + f"reduce_scatter: input_list[{W - 1}]:", "float16"]),
        ("all_to_all list dtypes differ",
         lambda: pg.alltoall([f() for _ in range(W)], [f(dtype=torch.int64)] + [f() for _ in range(W - 1)],
                             dist.AllToAllOptions()),
         [shoal + "alltoall: output_tensor_list[0]: dtype float32 differs from input_tensor_list[0]'s int64"]),
        ("allgather_coalesced dtypes differ",
         lambda: pg.allgather_coalesced([[f(2), f(2)] for _ in range(W)],
                                        [f(2), f(2, dtype=torch.bfloat16)]),
         [shoal + "allgather_coalesced:", "bfloat16"]),
        ("allgather_into_tensor dtypes differ",
         lambda: pg._allgather_base(torch.empty(4 * W, dtype=torch.float64), f()),
         [shoal + "allgather_into_tensor: output:", "dtype float64 differs from input's float32"]),
        ("reduce_scatter_tensor dtypes differ",
         lambda: pg._reduce_scatter_base(torch.empty(4, dtype=torch.int32), f(4 * W),
                                         dist.ReduceScatterOptions()),
         [shoal + "reduce_scatter_tensor: output:", "dtype int32 differs"]),
        # ---- roots out of range
        ("broadcast root -1", lambda: pg.broadcast([f()], opts(dist.BroadcastOptions, rootRank=-1)),
         [shoal + "broadcast: root: -1 is out of range for a group of"]),
        ("reduce root = world", lambda: pg.reduce([f()], opts(dist.ReduceOptions, rootRank=W)),
         [shoal + f"reduce: root: {W} is out of range"]),
        ("gather root = world",
         lambda: pg.gather([[f() for _ in range(W)]], [f()], opts(dist.GatherOptions, rootRank=W)),
         [shoal + f"gather: root: {W} is out of range"]),
        ("scatter root -3",
         lambda: pg.scatter([f()], [[f() for _ in range(W)]], opts(dist.ScatterOptions, rootRank=-3)),
         [shoal + "scatter: root: -3 is out of range"]),
        ("reduce root_tensor", lambda: pg.reduce([f()], opts(dist.ReduceOptions, rootRank=0, rootTensor=1)),
         [shoal + "reduce: root_tensor: must be 0"]),
        # ---- split sizes
        ("split sizes negative",
         lambda: dist.all_to_all_single(torch.empty(W), torch.ones(W), [1] * W, [2] + [-1] + [1] * (W - 2)),
         [shoal + "alltoall_base: input_split_sizes: entry 1 is negative"]),
        ("output split sizes short",
         lambda: dist.all_to_all_single(torch.empty(W), torch.ones(W), [1] * (W - 1), [1] * W),
         [shoal + "alltoall_base: output_split_sizes: has", "entries, expected one per rank"]),
        ("output split sizes sum",
         lambda: dist.all_to_all_single(torch.empty(W), torch.ones(W), [2] * W, [1] * W),
         [shoal + "alltoall_base: output_split_sizes: sums to", "but output has"]),
        ("equal split does not divide",
         lambda: dist.all_to_all_single(torch.empty(W * 2 + 1), torch.ones(W * 2 + 1)),
         [shoal + "alltoall_base: input:", "split equally"]),
        ("0-dim tensor split",
         lambda: dist.all_to_all_single(torch.tensor(1.0), torch.tensor(1.0), [1] * W, [1] * W),
         [shoal + "alltoall_base:", "0-dim tensor cannot be split"]),
        # ---- list lengths
        ("scatter list too long",
         lambda: pg.scatter([f()], [[f() for _ in range(W + 1)]], opts(dist.ScatterOptions, rootRank=0)),
         [shoal + "scatter: scatter_list: has", f"{W + 1} entries"]),
        ("gather list too short",
         lambda: pg.gather([[f() for _ in range(W - 1)]], [f()], opts(dist.GatherOptions, rootRank=0)),
         [shoal + "gather: gather_list: has", f"{W - 1} entries"]),
        ("reduce_scatter list too long",
         lambda: pg.reduce_scatter([f()], [[f() for _ in range(W + 1)]], dist.ReduceScatterOptions()),
         [shoal + "reduce_scatter: input_list: has", f"{W + 1} entries"]),
        ("all_to_all output list too long",
         lambda: pg.alltoall([f() for _ in range(W + 1)], [f() for _ in range(W)], dist.AllToAllOptions()),
         ["shoal rank 0: alltoall:", f"{W + 1} entries"]),
        ("allreduce two tensors", lambda: pg.allreduce([f(), f()]),
         [shoal + "allreduce: tensors: expected exactly one tensor", "got 2"]),
        ("allreduce_coalesced empty", lambda: be.allreduce_coalesced([], dist.AllreduceCoalescedOptions()),
         [shoal + "allreduce_coalesced: tensors: empty list"]),
        # ---- element counts
        # (uneven lists are fine: reduce_scatterv; this rank's own entry must fit its output)
        ("reduce_scatter own entry count",
         lambda: pg.reduce_scatter([f()], [[f(5)] + [f() for _ in range(W - 1)]], dist.ReduceScatterOptions()),
         [shoal + "reduce_scatter: output: has 4 elements but this rank's input_list entry has 5"]),
        ("all_to_all_single output size",
         lambda: dist.all_to_all_single(torch.empty(W * 2 + 2), torch.ones(W * 2)),
         [shoal + "alltoall_base: output:", "elements"]),
        # ---- ops that do not fit the dtype
        ("avg on bool", lambda: pg.allreduce([torch.ones(3, dtype=torch.bool)],
                                             opts(dist.AllreduceOptions, reduceOp=dist.ReduceOp.AVG)),
         [shoal + "allreduce: op: avg is not defined for bool"]),
        ("premul_sum on int",
         lambda: pg.allreduce([torch.ones(3, dtype=torch.int32)],
                              opts(dist.AllreduceOptions, reduceOp=dist._make_nccl_premul_sum(2.0))),
         [shoal + "allreduce: op: premul_sum needs a floating dtype, got int32"]),
        ("max on complex", lambda: pg.allreduce([torch.ones(3, dtype=torch.complex64)],
                                                opts(dist.AllreduceOptions, reduceOp=dist.ReduceOp.MAX)),
         [shoal + "allreduce: tensor: op max is not defined for complex"]),
        ("bxor in reduce_scatter_tensor on float",
         lambda: pg._reduce_scatter_base(f(), f(4 * W), opts(dist.ReduceScatterOptions, reduceOp=dist.ReduceOp.BXOR)),
         [shoal + "reduce_scatter_tensor: op: bitwise"]),
        ("sparse all_gather", lambda: be.allgather([[f() for _ in range(W)]], [f().to_sparse()]),
         [shoal + "allgather:", "dense"]),
        # ---- peers and tags
        ("send to world", lambda: pg.send([f()], W, 0), [shoal + f"send: dst: {W} is not another rank"]),
        ("recv from -2", lambda: pg.recv([f()], -2, 0), [shoal + "recv: src: -2 is not another rank"]),
        ("send negative tag", lambda: pg.send([f()], 1 % W, -5), [shoal + "send: tag: must be >= 0, got -5"]),
        ("recv any negative tag", lambda: pg.recv_anysource([f()], -1), [shoal + "recv: tag: must be >= 0"]),
        # ---- overlapping input and output (the core's check, through the adapter)
        ("all_gather_into_tensor input overlaps output",
         lambda: pg._allgather_base(OVERLAP, OVERLAP[1:5]),
         ["shoal rank 0: allgather: recv: overlaps send"]),
        # ---- outputs whose elements share memory (expand()ed): nothing can be written to them
        ("all_reduce of an expanded tensor", lambda: dist.all_reduce(torch.zeros(1).expand(4)),
         [shoal + "allreduce: tensor:", "share memory"]),
        ("all_gather_into_tensor into an expanded output",
         lambda: dist.all_gather_into_tensor(torch.zeros(1).expand(4 * W), f()),
         [shoal + "allgather_into_tensor: output:", "share memory"]),
        ("broadcast of an expanded tensor", lambda: dist.broadcast(torch.zeros(1).expand(4), 1 % W),
         [shoal + "broadcast: tensor:", "share memory"]),
    ]
    return rows


OVERLAP = torch.zeros(4 * WS)


def run_table(pg, be, report):
    for name, fn, words in table(pg, be):
        try:
            w = fn()
            if hasattr(w, "wait"):
                w.wait()
            report["failed"][name] = "no error raised"
            continue
        except (RuntimeError, ValueError, TypeError) as e:
            msg = str(e).splitlines()[0] if str(e) else repr(e)
            missing = [w for w in words if w not in str(e)]
            if missing:
                report["failed"][name] = f"message lacks {missing}: {msg}"
                continue
        except Exception as e:  # noqa: BLE001
            report["failed"][name] = f"unexpected {type(e).__name__}: {e}"
            continue
        report["passed"].append(name)


def close(a, b, what):
    if not torch.equal(a, b):
        raise AssertionError(f"{what}: {a} != {b}")


def main():
    dist.init_process_group("shoal", timeout=datetime.timedelta(seconds=60))
    pg = dist.distributed_c10d._get_default_group()
    be = pg._get_backend(torch.device("cpu"))
    report = {"rank": RANK, "passed": [], "failed": {}}

    def check(name, fn):
        try:
            fn()
            report["passed"].append(name)
        except Exception as e:  # noqa: BLE001
            report["failed"][name] = f"{type(e).__name__}: {e}\n{traceback.format_exc()[-1200:]}"

    t = torch.ones(3)
    dist.all_reduce(t)
    seq_before = be._get_sequence_number_for_group()
    if RANK == 0:
        run_table(pg, be, report)

    # ---- nothing reached the wire: every rank agrees on what comes next
    moved = be._get_sequence_number_for_group() - seq_before
    s = torch.tensor([moved], dtype=torch.int64)
    dist.all_reduce(s, op=dist.ReduceOp.MAX)

    def same_sequence_number():
        assert moved == 0, f"the bad calls moved this rank's group sequence number by {moved}"
        assert s.item() == 0, f"the bad calls moved some rank's group sequence number by {s.item()}"
    check("bad calls consumed no sequence number", same_sequence_number)

    def still_in_step():
        x = torch.full((5,), float(RANK + 1))
        dist.all_reduce(x)
        close(x, torch.full((5,), float(WS * (WS + 1) // 2)), "all_reduce after the bad calls")
        inp = torch.arange(WS, dtype=torch.int32) + 100 * RANK
        out = torch.empty(WS, dtype=torch.int32)
        dist.all_to_all_single(out, inp)
        close(out, torch.arange(WS, dtype=torch.int32) * 100 + RANK, "all_to_all_single after the bad calls")
        if WS > 1:  # a bad send would be matched by this receive
            y = torch.full((2,), float(RANK))
            if RANK == 0:
                dist.send(y, 1, tag=0)
            elif RANK == 1:
                dist.recv(y, 0, tag=0)
                close(y, torch.zeros(2), "recv after the bad calls")
    check("still in step", still_in_step)

    # ---- non-contiguous tensors are not bad input: handled, right results
    def non_contiguous():
        base = torch.zeros(4 * WS, 2)
        out = base[:, 0]  # stride 2
        dist.all_gather_into_tensor(out, torch.full((4,), float(RANK)))
        close(out, torch.arange(WS, dtype=torch.float32).repeat_interleave(4), "all_gather_into_tensor")
        src = torch.arange(2 * WS, dtype=torch.float32).reshape(2, WS).t()  # not contiguous
        res = torch.empty(WS, 2)
        dist.all_to_all_single(res, src + 10 * RANK)
        want = torch.stack([torch.tensor([RANK, WS + RANK], dtype=torch.float32) + 10 * r for r in range(WS)])
        close(res, want, "all_to_all_single of a transposed input")
    check("non-contiguous handled", non_contiguous)

    # ---- a broken communicator: every later call fails at once, naming why
    sub = dist.new_group(list(range(WS)), backend="shoal")
    if RANK == 0:
        def after_abort():
            sub._get_backend(torch.device("cpu")).abort()
            for name, call in [("all_reduce", lambda: dist.all_reduce(f(), group=sub)),
                               ("broadcast", lambda: dist.broadcast(f(), 0, group=sub)),
                               ("all_gather", lambda: dist.all_gather([f() for _ in range(WS)], f(), group=sub)),
                               ("barrier", lambda: dist.barrier(group=sub))]:
                try:
                    call()
                except (RuntimeError, dist.DistBackendError) as e:
                    assert "aborted" in str(e), f"{name}: {e}"
                    continue
                raise AssertionError(f"{name} after abort raised nothing")
        check("calls after abort fail", after_abort)

    dist.barrier()
    dist.destroy_process_group()

    # ---- after destroy_process_group: clear errors, no crash
    def after_destroy():
        for name, call, words in [
                ("dist.all_reduce", lambda: dist.all_reduce(f()), ["not been initialized"]),
                ("kept ProcessGroup", lambda: pg.allreduce([f()]).wait(), []),
                ("kept backend", lambda: be.allreduce([f()]).wait(), ["shoal rank", "shut down"]),
        ]:
            try:
                call()
            except (RuntimeError, ValueError, dist.DistBackendError) as e:
                missing = [w for w in words if w not in str(e)]
                assert not missing, f"{name}: message lacks {missing}: {e}"
                continue
            raise AssertionError(f"{name} after destroy_process_group raised nothing")
    check("calls after destroy_process_group fail", after_destroy)

    print("RESULT " + json.dumps(report), flush=True)
    return 1 if report["failed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
