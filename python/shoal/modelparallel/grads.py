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

Tensor parallelism: a parameter a tensor-parallel module split
(``p._smp_distributed``) is held, piece by piece, only by its RDP group, so
its buckets are reduced over ``STATE.rdp_grad`` and divided by the DP size
(each tensor-parallel rank read its own batch) or, with ``prescaled_batch``,
by the RDP size (they read the same one); the rest over the DP group as
above. A bucket holds parameters of one route (group and divisor) and dtype;
buckets of both routes launch in one order, the same on every DP rank.
Communication hooks apply to the DP-group buckets.

Optimizer-state sharding (``shard_optimizer_state``, optimizer_shard.py):
every bucket, padded to a multiple of its group's size, is reduce-scattered
instead: rank k of the group receives the average of the k-th contiguous
slice (``_Bucket.shard``), the slice whose optimizer state it owns. The
layout is one for every plan, in reverse parameter order (the owned slices
must not move, and a resumed run must lay them out alike), and the
parameters' ``.grad`` is released (the gradients live in the shards).

Parameters that sharded_dp.py handed to FSDP (``p._smp_sdp``) are reduced by
FSDP over their shard mesh; with tensor parallelism ``finish()`` completes
the rule above for them (FSDP averages over the RDP group only).
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from . import timeline
from ..mpcommon.errors import SMPUnsupportedError
from .state import require


@dataclasses.dataclass(frozen=True)
class Route:
    """Where a parameter's gradient is reduced: `group` (`size` ranks, this rank is `rank` there),
    divided by `divisor` (None: the group's size, with an AVG reduction)."""
    group: object
    size: int
    rank: int
    divisor: Optional[int] = None
    distributed: bool = False


def routes(s) -> Tuple[Route, Route]:
    """(replicated, distributed) routes of this rank (see the module docstring)."""
    rep = Route(s.grad, s.dp_size, s.dp_rank)
    if s.tp_size == 1:
        return rep, rep
    div = s.rdp_size if s.cfg.prescaled_batch else s.dp_size
    return rep, Route(s.rdp_grad, s.rdp_size, s.rdp_rank, None if div == s.rdp_size else div, True)


def is_distributed(p: torch.Tensor) -> bool:
    return bool(getattr(p, "_smp_distributed", False))


@dataclasses.dataclass
class _Bucket:
    params: List[torch.nn.Parameter]
    offsets: List[int]
    flat: torch.Tensor
    route: Route
    shard: Optional[torch.Tensor] = None     # optimizer-state sharding: this rank's slice of `flat`
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


_SHARDED = "sharded"      # the layout key of the one layout under optimizer-state sharding


class GradReducer:
    def __init__(self, params: Sequence[torch.nn.Parameter], group, cap_bytes: int):
        s = require()
        self.group = group
        self.cap = max(1, int(cap_bytes))
        params = list(params)
        self.device = params[0].device if params else torch.device("cpu")
        self.sdp_params = [p for p in params if getattr(p, "_smp_sdp", False)]   # reduced by FSDP
        self.params = [p for p in params if not getattr(p, "_smp_sdp", False)]
        rep, tpd = routes(s)
        self.route_rep = dataclasses.replace(rep, group=group)
        self.route_tp = tpd if tpd.distributed else self.route_rep
        self.tp = (s.tpg, s.tp_size, bool(s.cfg.prescaled_batch)) if s.tp_size > 1 else None
        self.sharded = bool(s.cfg.shard_optimizer_state) and s.cfg.sharded_data_parallel_degree == 1
        self.reductions = 0           # sharded: reductions into the shards so far (optimizer_shard.py)
        self.layouts: Dict[tuple, Tuple[List[_Bucket], Dict[int, int]]] = {}
        self.buckets: List[_Bucket] = []
        self.bucket_of: Dict[int, int] = {}
        self.armed: set = set()
        self.done: set = set()
        self.next = 0
        self.comm_hook = None         # (state, hook): DistributedModel.register_comm_hook
        self.divisor: Optional[int] = None   # under join(divide_by_initial_world_size=False): the replicas that stepped
        self.handles = [p.register_post_accumulate_grad_hook(self._hook) for p in self.params]
        if self.sharded:    # one layout, whatever the plan: the owned slices never move
            self.begin_step(_SHARDED, [list(reversed(self.params))])

    def close(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []

    def route(self, p: torch.Tensor) -> Route:
        return self.route_tp if is_distributed(p) else self.route_rep

    # -- layout
    def begin_step(self, key, groups: Sequence[Sequence[torch.nn.Parameter]]) -> None:
        """groups: the local parameters in the order they become final, one group per
        final task (parameters not in any group are final at finish())."""
        if self.sharded and self.layouts:
            key = _SHARDED
        if key not in self.layouts:
            seen, ordered = set(), []
            mine = {id(p) for p in self.params}
            for grp in list(groups) + [self.params]:
                part = []
                for p in grp:
                    if id(p) not in seen and id(p) in mine:
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
                    if cur and (size + nbytes > self.cap or p.dtype != cur[0].dtype
                                or self.route(p) is not self.route(cur[0])):
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

    def _make(self, params: List[torch.nn.Parameter]) -> _Bucket:
        offsets, n = [], 0
        for p in params:
            offsets.append(n)
            n += p.numel()
        route = self.route(params[0])
        shard = None
        if self.sharded:      # padded to a multiple of the group: rank k owns the k-th slice
            chunk = -(-n // route.size)
            n = chunk * route.size
            shard = torch.zeros(chunk, dtype=params[0].dtype, device=params[0].device)
        flat = torch.zeros(n, dtype=params[0].dtype, device=params[0].device)
        return _Bucket(params, offsets, flat, route, shard)

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

    def _op(self, b: _Bucket, joined: Optional[bool] = None):
        """AVG when the group's size divides; SUM when finish() divides by something else."""
        if joined is not None:
            return dist.ReduceOp.AVG if joined and b.route.divisor is None else dist.ReduceOp.SUM
        return dist.ReduceOp.AVG if self.divisor is None and b.route.divisor is None else dist.ReduceOp.SUM

    def _reduce(self, b: _Bucket, op, async_op: bool):
        if b.shard is not None:
            return dist.reduce_scatter_single(b.shard, b.flat, op=op, group=b.route.group, async_op=async_op)
        return dist.all_reduce(b.flat, op=op, group=b.route.group, async_op=async_op)

    def _hooked(self, b: _Bucket) -> bool:
        if self.comm_hook is not None and self.sharded:
            raise SMPUnsupportedError("smp: DistributedModel.register_comm_hook is not supported with "
                                      "shard_optimizer_state (gradients are reduce-scattered)")
        return self.comm_hook is not None and b.route is self.route_rep

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
        if self._hooked(b):
            state, hook = self.comm_hook
            b.work = hook(state, GradBucket(self.buckets.index(b), b, self.next + 1 == len(self.buckets)))
        else:
            b.work = self._reduce(b, self._op(b), True)
        timeline.record(f"allreduce start ({b.flat.numel() * b.flat.element_size() / 2**20:.2f} MB)",
                        "comm", t0, timeline.now())

    def _divisor(self, b: _Bucket) -> Optional[int]:
        """What finish() divides a bucket's sum by (None: the reduction averaged already)."""
        if self.divisor is None:
            return b.route.divisor
        if b.route.distributed and self.tp is not None and self.tp[2]:
            return max(1, self.divisor // self.tp[1])     # replicas that stepped, per tensor-parallel rank
        return self.divisor

    # -- uneven inputs (DistributedModel.join)
    def active_replicas(self, active: bool) -> int:
        """How many replicas of this DP group run a step now (every member calls it once per step)."""
        if self.sharded:
            raise SMPUnsupportedError("smp: DistributedModel.join() is not supported with shard_optimizer_state "
                                      "(every replica steps its own slice of the optimizer state)")
        flag = torch.tensor([1 if active else 0], dtype=torch.int64, device=self.device)
        dist.all_reduce(flag, group=self.group)
        return int(flag.item())

    def shadow(self, divide_by_initial_world_size: bool) -> None:
        """This replica has no batch left: it takes part in the other replicas' gradient reduction
        with zeros, bucket by bucket, as they launch them."""
        if not self.buckets:
            self.begin_step("join", [])
        for b in self.buckets:
            b.flat.zero_()
            if self._hooked(b):
                state, hook = self.comm_hook
                hook(state, GradBucket(self.buckets.index(b), b, b is self.buckets[-1])).wait()
            else:
                self._reduce(b, self._op(b, bool(divide_by_initial_world_size)), False)

    def finish(self) -> None:
        for p in self.params:
            self._mark(p)
        self._launch_ready()
        t0 = timeline.now()
        for b in self.buckets:
            got = b.work.wait()
            hooked = self._hooked(b)
            if hooked:      # a hook's future holds the reduced tensor
                got = got[0] if isinstance(got, (list, tuple)) else got
                if got.data_ptr() != b.flat.data_ptr():
                    b.flat.copy_(got.reshape(-1))
            div = None if hooked else self._divisor(b)
            if b.shard is not None:
                if div is not None:
                    b.shard.div_(div)
                for p in b.params:
                    p.grad = None
                continue
            if div is not None:
                b.flat.div_(div)
            for p, off, had in zip(b.params, b.offsets, b.had_grad):
                avg = b.flat[off:off + p.numel()].view_as(p)
                if p.grad is not None:
                    p.grad.copy_(avg)
                elif had or bool(avg.any()):
                    p.grad = avg.clone()
        self.reductions += int(self.sharded)
        if self.tp is not None and self.sdp_params:
            self._complete_sdp()
        if self.buckets:
            timeline.record("allreduce wait", "comm", t0, timeline.now())

    def _complete_sdp(self) -> None:
        """FSDP averaged the sharded parameters' gradients over the RDP group; the rule wants the DP
        average for replicated parameters (one more average over the TP group) and, without
        prescaled batches, the DP divisor for distributed ones."""
        tpg, tp_size, prescaled = self.tp
        for p in self.sdp_params:
            if p.grad is None:
                continue
            g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
            if not is_distributed(p):
                dist.all_reduce(g, op=dist.ReduceOp.AVG, group=tpg)
            elif not prescaled:
                g.div_(tp_size)
