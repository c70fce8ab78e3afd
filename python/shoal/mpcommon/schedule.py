"""Pipeline schedules: which task each partition runs, in which order.

The model is a DAG of *segments* (stages.py): runs of the forward graph that
live on one partition; segment s consumes values of its predecessors. A step
over m microbatches is the set of tasks F(i, s) (forward of microbatch i
through segment s) and, when training, B(i, s), with the dependencies

    F(i, s) after F(i, p)  for every predecessor p of s
    B(i, s) after F(i, s) and B(i, c) for every successor c of s

This module simulates the step on one worker per partition (list scheduling,
forward cost 1 and backward cost 2 per segment unless given) and returns, per
partition, the order in which it ran its tasks. Each rank then runs its list
in that order, receiving what it needs with blocking receives and sending with
non-blocking sends; because every list is consistent with one valid global
execution, this cannot deadlock whatever the real durations are.

Policies (config key ``pipeline``):

- ``"simple"``: fill-drain (GPipe). A partition runs all of its forward tasks
  before any backward task.
- ``"interleaved"``: one-forward-one-backward (1F1B). A ready backward task
  always goes first, and a new microbatch enters the pipeline only while fewer
  than ``active_microbatches`` are in flight (started, not finished).

With p partitions in a chain and m microbatches both take (m + p - 1) slots of
(forward + backward): the bubble, the idle fraction of each partition, is
(p - 1) / (m + p - 1). 1F1B keeps at most min(m, p) microbatches' activations
alive per partition instead of m.

When the segments' real costs are known (``best``: the automatic partition
measured them), the order matters beyond the chain: a model whose segments
leave a partition and come back (GPT-2's tied ``lm_head`` runs on stage 0
after stage 1) has partitions that feed each other, and which ready task goes
first decides how long the other partition waits. ``best`` simulates the
interleaved policy with every in-flight limit up to ``active`` and two orders
among ready tasks (1F1B's, and the longest remaining path first), and keeps
the shortest step, the fewest microbatches in flight on a tie.
"""

from __future__ import annotations

import dataclasses
import heapq
from typing import Dict, List, Optional, Sequence, Tuple


@dataclasses.dataclass(frozen=True, order=True)
class Task:
    kind: str   # "F" or "B"
    mb: int
    seg: int

    def __str__(self) -> str:
        return f"{self.kind}{self.mb}.{self.seg}"


@dataclasses.dataclass
class Schedule:
    order: List[List[Task]]                 # per partition
    start: Dict[Task, float]                # simulated start times
    makespan: float

    def tasks_of(self, partition: int) -> List[Task]:
        return self.order[partition]


def bubble_fraction(partitions: int, microbatches: int) -> float:
    """The idle fraction of a chain pipeline in theory: (p - 1) / (m + p - 1)."""
    return (partitions - 1) / (microbatches + partitions - 1)


def build(parts: Sequence[int], preds: Sequence[Sequence[int]], partitions: int, microbatches: int, *,
          backward: bool = True, policy: str = "interleaved", active: Optional[int] = None,
          fwd_cost: Optional[Sequence[float]] = None, bwd_cost: Optional[Sequence[float]] = None,
          priority: str = "1f1b") -> Schedule:
    """Simulates one step; see the module docstring.

    priority (interleaved only): "1f1b", a ready backward first, then the
    oldest microbatch; "critical", the task with the longest path of
    remaining work after it first (a backward on a tie).

    parts[s]: the partition of segment s; preds[s]: the segments whose values s
    consumes (all smaller than s). Segments are numbered in a topological order.
    """
    nseg = len(parts)
    if policy not in ("simple", "interleaved"):
        raise ValueError(f"unknown pipeline policy {policy!r}")
    if priority not in ("1f1b", "critical"):
        raise ValueError(f"unknown task priority {priority!r}")
    if microbatches < 1:
        raise ValueError("microbatches must be >= 1")
    for s, ps in enumerate(preds):
        for p in ps:
            if not 0 <= p < s:
                raise ValueError(f"segment {s}: predecessor {p} is not an earlier segment")
    for s, w in enumerate(parts):
        if not 0 <= w < partitions:
            raise ValueError(f"segment {s}: partition {w} is outside 0..{partitions - 1}")
    fc = list(fwd_cost) if fwd_cost is not None else [1.0] * nseg
    bc = list(bwd_cost) if bwd_cost is not None else [2.0] * nseg
    active = microbatches if active is None else max(1, active)
    succs: List[List[int]] = [[] for _ in range(nseg)]
    for s, ps in enumerate(preds):
        for p in set(ps):
            succs[p].append(s)

    deps: Dict[Task, int] = {}
    users: Dict[Task, List[Task]] = {}
    tasks: List[Task] = []
    for i in range(microbatches):
        for s in range(nseg):
            f = Task("F", i, s)
            tasks.append(f)
            deps[f] = len(set(preds[s]))
            for p in set(preds[s]):
                users.setdefault(Task("F", i, p), []).append(f)
            if backward:
                b = Task("B", i, s)
                tasks.append(b)
                deps[b] = 1 + len(succs[s])
                users.setdefault(f, []).append(b)
                for c in succs[s]:
                    users.setdefault(Task("B", i, c), []).append(b)

    # "critical": the longest path of work from the start of a task to the end of
    # its microbatch, over the tasks in reverse topological order (forwards by
    # segment, then backwards by decreasing segment, the whole reversed)
    tail: Dict[Task, float] = {}
    if priority == "critical":
        for t in sorted(tasks, key=lambda q: (q.kind == "B", -q.seg if q.kind == "B" else q.seg), reverse=True):
            own = fc[t.seg] if t.kind == "F" else bc[t.seg]
            tail[t] = own + max((tail[u] for u in users.get(t, ())), default=0.0)

    per_mb = len(tasks) // microbatches if microbatches else 0
    ready: List[List[Task]] = [[] for _ in range(partitions)]
    for t in tasks:
        if deps[t] == 0:
            ready[parts[t.seg]].append(t)
    f_left = [0] * partitions
    for t in tasks:
        if t.kind == "F":
            f_left[parts[t.seg]] += 1
    mb_started = [False] * microbatches
    mb_done = [0] * microbatches
    in_flight = 0

    def pick(w: int) -> Optional[Task]:
        cand = ready[w]
        if not cand:
            return None
        fs = [t for t in cand if t.kind == "F"]
        bs = [t for t in cand if t.kind == "B"]
        if policy == "simple":
            if fs:
                return min(fs, key=lambda t: (t.mb, t.seg))
            if bs and f_left[w] == 0:
                return min(bs, key=lambda t: (t.mb, -t.seg))
            return None
        fs = [t for t in fs if mb_started[t.mb] or in_flight < active]
        if priority == "critical":
            both = bs + fs
            return max(both, key=lambda t: (tail[t], t.kind == "B", -t.mb)) if both else None
        if bs:
            return min(bs, key=lambda t: (t.mb, -t.seg))
        return min(fs, key=lambda t: (t.mb, t.seg)) if fs else None

    order: List[List[Task]] = [[] for _ in range(partitions)]
    start: Dict[Task, float] = {}
    busy: List[Optional[Tuple[float, Task]]] = [None] * partitions
    events: List[Tuple[float, int]] = []
    now, done = 0.0, 0
    while done < len(tasks):
        for w in range(partitions):
            if busy[w] is not None:
                continue
            t = pick(w)
            if t is None:
                continue
            ready[w].remove(t)
            if not mb_started[t.mb]:
                mb_started[t.mb] = True
                in_flight += 1
            if t.kind == "F":
                f_left[w] -= 1
            cost = fc[t.seg] if t.kind == "F" else bc[t.seg]
            busy[w] = (now + cost, t)
            heapq.heappush(events, (now + cost, w))
            order[w].append(t)
            start[t] = now
        if not events:
            raise RuntimeError("schedule simulation stalled (a cycle in the segment graph?)")
        now = events[0][0]
        while events and events[0][0] == now:
            _, w = heapq.heappop(events)
            _, t = busy[w]
            busy[w] = None
            done += 1
            mb_done[t.mb] += 1
            if mb_done[t.mb] == per_mb:
                in_flight -= 1
            for u in users.get(t, ()):
                deps[u] -= 1
                if deps[u] == 0:
                    ready[parts[u.seg]].append(u)
    return Schedule(order=order, start=start, makespan=now)


def best(parts: Sequence[int], preds: Sequence[Sequence[int]], partitions: int, microbatches: int, *,
         backward: bool = True, policy: str = "interleaved", active: Optional[int] = None,
         fwd_cost: Sequence[float], bwd_cost: Sequence[float]) -> Schedule:
    """The fastest schedule under the measured costs (module docstring): for
    "interleaved", every in-flight limit 1..active and both priorities;
    "simple" has one order."""
    if policy == "simple" or not backward:
        return build(parts, preds, partitions, microbatches, backward=backward, policy=policy,
                     active=active, fwd_cost=fwd_cost, bwd_cost=bwd_cost)
    limit = microbatches if active is None else max(1, min(active, microbatches))
    found: Optional[Schedule] = None
    for a in range(1, limit + 1):   # fewer in flight first: a later one must be strictly faster
        for prio in ("1f1b", "critical"):
            sc = build(parts, preds, partitions, microbatches, backward=True, policy=policy, active=a,
                       fwd_cost=fwd_cost, bwd_cost=bwd_cost, priority=prio)
            if found is None or sc.makespan < found.makespan * (1 - 1e-9):
                found = sc
    return found
