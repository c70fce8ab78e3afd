"""Data-parallel gradient averaging for a partition (config ``ddp: true``).

Every rank of a DP group holds the same partition and runs the same schedule,
so a parameter's gradient is final at the same point on all of them: after the
backward of the last microbatch through the last (in this rank's task order)
segment that uses it. The local parameters are grouped in the order they
become final, cut into buckets of at most ``bucket_cap_mb`` (and of one dtype),
and each bucket is averaged with one asynchronous allreduce (AVG) over the DP
group as soon as all of its parameters are final:

- during that final backward, a post-accumulate-grad hook marks each
  parameter whose gradient has just been accumulated, so buckets are launched
  while the rest of the backward runs (overlap);
- after the task, any parameter of it that received no gradient is marked too;
- buckets are launched strictly in order, the same on every DP rank.

A communication hook (``register_comm_hook``, DDP's interface) replaces the
allreduce of each bucket. Under ``DistributedModel.join()`` a replica that has
run out of batches shadows the others' reductions with zeros (``shadow``); each
synchronising step starts with a count of the replicas that run it. ``finish()`` waits for all buckets at the end of the step and copies the
averages back into ``.grad``. A parameter without a gradient on this rank
contributes zeros; it keeps ``grad = None`` when the average is zero as well.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from . import timeline


@dataclasses.dataclass
class _Bucket:
    params: List[torch.nn.Parameter]
    offsets: List[int]
    flat: torch.Tensor
    ready: int = 0
    had_grad: Optional[List[bool]] = None
    work: object = None


class GradBucket:
    """What a DDP communication hook receives (the methods torch's hooks call)."""

    def __init__(self, index: int, bucket: _Bucket, last: bool):
        self._index, self._b, self._last = index, bucket, last

    def index(self) -> int:
        return self._index

    def buffer(self) -> torch.Tensor:
        return self._b.flat

    def set_buffer(self, t: torch.Tensor) -> None:
        self._b.flat.copy_(t)

    def is_last(self) -> bool:
        return self._last

    def parameters(self) -> List[torch.Tensor]:
        return list(self._b.params)

    def gradients(self) -> List[torch.Tensor]:
        return [self._b.flat[o:o + p.numel()].view_as(p) for p, o in zip(self._b.params, self._b.offsets)]


class GradReducer:
    def __init__(self, params: Sequence[torch.nn.Parameter], group, cap_bytes: int):
        self.group = group
        self.cap = max(1, int(cap_bytes))
        self.params = list(params)
        self.layouts: Dict[tuple, Tuple[List[_Bucket], Dict[int, int]]] = {}
        self.buckets: List[_Bucket] = []
        self.bucket_of: Dict[int, int] = {}
        self.armed: set = set()
        self.done: set = set()
        self.next = 0
        self.comm_hook = None         # (state, hook): DistributedModel.register_comm_hook
        self.divisor: Optional[int] = None   # under join(divide_by_initial_world_size=False): the replicas that stepped
        self.handles = [p.register_post_accumulate_grad_hook(self._hook) for p in self.params]

    def close(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []

    # -- layout
    def begin_step(self, key, groups: Sequence[Sequence[torch.nn.Parameter]]) -> None:
        """groups: the local parameters in the order they become final, one group per
        final task (parameters not in any group are final at finish())."""
        if key not in self.layouts:
            seen, ordered = set(), []
            for grp in list(groups) + [self.params]:
                part = []
                for p in grp:
                    if id(p) not in seen:
                        seen.add(id(p))
                        part.append(p)
                if part:
                    ordered.append(part)
            buckets: List[_Bucket] = []
            for part in ordered:
                cur: List[torch.nn.Parameter] = []
                size = 0
                for p in part:
                    nbytes = p.numel() * p.element_size()
                    if cur and (size + nbytes > self.cap or p.dtype != cur[0].dtype):
                        buckets.append(self._make(cur))
                        cur, size = [], 0
                    cur.append(p)
                    size += nbytes
                if cur:
                    buckets.append(self._make(cur))
            bucket_of = {id(p): i for i, b in enumerate(buckets) for p in b.params}
            self.layouts[key] = (buckets, bucket_of)
        self.buckets, self.bucket_of = self.layouts[key]
        for b in self.buckets:
            b.ready, b.work, b.had_grad = 0, None, None
        self.done = set()
        self.armed = set()
        self.next = 0

    @staticmethod
    def _make(params: List[torch.nn.Parameter]) -> _Bucket:
        offsets, n = [], 0
        for p in params:
            offsets.append(n)
            n += p.numel()
        return _Bucket(params, offsets, torch.zeros(n, dtype=params[0].dtype, device=params[0].device))

    # -- progress
    def arm(self, params: Sequence[torch.nn.Parameter]) -> None:
        self.armed = {id(p) for p in params}

    def _hook(self, p: torch.nn.Parameter) -> None:
        if id(p) in self.armed:
            self._mark(p)
            self._launch_ready()

    def _mark(self, p: torch.nn.Parameter) -> None:
        if id(p) in self.done or id(p) not in self.bucket_of:
            return
        self.done.add(id(p))
        self.buckets[self.bucket_of[id(p)]].ready += 1

    def task_done(self, params: Sequence[torch.nn.Parameter]) -> None:
        for p in params:
            self._mark(p)
        self.armed = set()
        self._launch_ready()

    def _launch_ready(self) -> None:
        while self.next < len(self.buckets):
            b = self.buckets[self.next]
            if b.ready < len(b.params):
                break
            self._launch(b)
            self.next += 1

    def _launch(self, b: _Bucket) -> None:
        t0 = timeline.now()
        b.had_grad = []
        for p, off in zip(b.params, b.offsets):
            view = b.flat[off:off + p.numel()]
            if p.grad is None:
                view.zero_()
                b.had_grad.append(False)
            else:
                view.copy_(p.grad.reshape(-1))
                b.had_grad.append(True)
        if self.comm_hook is not None:
            state, hook = self.comm_hook
            b.work = hook(state, GradBucket(self.buckets.index(b), b, self.next + 1 == len(self.buckets)))
        else:
            op = dist.ReduceOp.AVG if self.divisor is None else dist.ReduceOp.SUM
            b.work = dist.all_reduce(b.flat, op=op, group=self.group, async_op=True)
        timeline.record(f"allreduce start ({b.flat.numel() * b.flat.element_size() / 2**20:.2f} MB)",
                        "comm", t0, timeline.now())

    # -- uneven inputs (DistributedModel.join)
    def active_replicas(self, active: bool) -> int:
        """How many replicas of this DP group run a step now (every member calls it once per step)."""
        flag = torch.tensor([1 if active else 0], dtype=torch.int64, device=self.params[0].device)
        dist.all_reduce(flag, group=self.group)
        return int(flag.item())

    def shadow(self, divide_by_initial_world_size: bool) -> None:
        """This replica has no batch left: it takes part in the other replicas' gradient reduction
        with zeros, bucket by bucket, as they launch them."""
        if not self.buckets:
            self.begin_step("join", [])
        for b in self.buckets:
            b.flat.zero_()
            op = dist.ReduceOp.AVG if divide_by_initial_world_size else dist.ReduceOp.SUM
            if self.comm_hook is not None:
                state, hook = self.comm_hook
                hook(state, GradBucket(self.buckets.index(b), b, b is self.buckets[-1])).wait()
            else:
                dist.all_reduce(b.flat, op=op, group=self.group)

    def finish(self) -> None:
        for p in self.params:
            self._mark(p)
        self._launch_ready()
        t0 = timeline.now()
        for b in self.buckets:
            got = b.work.wait()
            if self.comm_hook is not None:      # a hook's future holds the reduced tensor
                got = got[0] if isinstance(got, (list, tuple)) else got
                if got.data_ptr() != b.flat.data_ptr():
                    b.flat.copy_(got.reshape(-1))
            if self.divisor is not None and self.comm_hook is None:
                b.flat.div_(self.divisor)
            for p, off, had in zip(b.params, b.offsets, b.had_grad):
                avg = b.flat[off:off + p.numel()].view_as(p)
                if p.grad is not None:
                    p.grad.copy_(avg)
                elif had or bool(avg.any()):
                    p.grad = avg.clone()
        if self.buckets:
            timeline.record("allreduce wait", "comm", t0, timeline.now())
