"""Running one step's schedule on this rank.

The executor walks this rank's task list (schedule.py) in order:

- F(i, s): receive the values segment s needs from other segments (blocking
  receives, transfer.py; from a segment of this same rank they are handed over
  locally, detached the same way), run the segment's nodes, and start sending
  its values to the segments that consume them (non-blocking sends). The
  segment that produces the model's output is run by calling the user's step
  function for microbatch i: its model call returns the output, and
  ``model.backward(loss)`` records the loss for B(i, s).
- B(i, s): receive the gradients of what segment s sent (only for edges that
  carried a tensor requiring grad), run ``torch.autograd.backward`` from those
  tensors (and from the recorded loss, scaled by 1/microbatches and, with fp16,
  by the optimizer's loss scale), and send the
  gradients of the segment's received inputs back to their producers.

Received tensors are leaves, so each segment's autograd graph ends at its own
inputs and a backward never runs into another segment's graph. Values every
partition can compute from the inputs (stages.py, replicated nodes) are
computed where needed.

Tags: the value of edge e for microbatch i travels with tag (i * E + e) * 2
and its gradient with tag (i * E + e) * 2 + 1 (E edges), on the replica's own
group. After the tasks, the rank that ran the step function sends its results
to the other ranks of the replica, the sends are waited for, and the DP
gradient averaging is completed (grads.py).
"""

from __future__ import annotations

import contextlib
from typing import Any, Dict, List, Tuple

import torch
from torch.fx.node import map_arg

from . import graph as G
from . import timeline
from . import transfer
from ..mpcommon.errors import SMPValidationError
from ..mpcommon.schedule import Schedule
from .stages import Plan, Segment

_RESULTS_TAG = 1 << 28          # transfer tags use 4t..4t+2, and c10d tags are 32-bit ints


class Executor:
    def __init__(self, rt, ctx, plan: Plan, sched: Schedule, backward: bool, sync_grads: bool = True):
        self.rt = rt
        self.ctx = ctx
        self.plan = plan
        self.sched = sched
        self.backward_on = backward
        self.sync_grads = sync_grads
        s = rt.s
        self.s = s
        self.group = s.pipe
        self.ranks = s.pp_ranks
        self.me = s.pp_rank
        self.m = ctx.m
        self.nedges = max(1, len(plan.edges))
        self.local_in: Dict[Tuple[int, int], Tuple[Any, List[torch.Tensor]]] = {}
        self.sent: Dict[Tuple[int, int], List[torch.Tensor]] = {}
        self.recv_leaves: Dict[Tuple[int, int], List[torch.Tensor]] = {}
        self.grad_in: Dict[Tuple[int, int], List[Any]] = {}
        self.rep: List[Dict[Any, Any]] = [dict() for _ in range(self.m)]
        self.bound = [G.bind(rt.root, c.args, c.kwargs) for c in ctx.calls]
        self.works: List[Any] = []
        self.pending: Dict[int, transfer.Incoming] = {}   # posted receives by tag
        self.scale = 1.0 / self.m if rt.model._smp.average_grads_across_microbatches else 1.0
        if s.optimizers:     # fp16: the loss is scaled (optimizer.py); 1 otherwise
            self.scale *= s.optimizers[0].loss_scale
        self._t_compute = 0.0

    # ------------------------------------------------------------- helpers
    def _tag(self, mb: int, edge: int, grad: bool) -> int:
        return ((mb * self.nedges + edge) * 2 + (1 if grad else 0)) % _RESULTS_TAG

    def _part(self, seg: int) -> int:
        return self.plan.segments[seg].part

    @contextlib.contextmanager
    def _modes(self, i: int):
        call = self.ctx.calls[i]
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.set_grad_enabled(call.grad_enabled))
            for device_type, (enabled, dtype) in call.autocast.items():
                if enabled:
                    stack.enter_context(torch.autocast(device_type, dtype=dtype))
            yield

    def _post(self, src_part: int, tag: int) -> None:
        if tag not in self.pending:
            self.pending[tag] = transfer.Incoming(self.ranks[src_part], tag, self.group, self.rt.device)

    def _recv(self, src_part: int, tag: int, what: str):
        t0 = timeline.now()
        self._post(src_part, tag)
        obj, leaves = self.pending.pop(tag).wait()
        timeline.record(f"recv {what}", "comm", t0, timeline.now(), src=src_part)
        return obj, leaves

    def _advance(self) -> None:
        """Lets posted receives whose header arrived receive their tensors in the background."""
        for inc in self.pending.values():
            inc.advance()

    def _prefetch(self, t) -> None:
        """Posts the receives task `t` will need, so that they complete while this rank computes."""
        seg = self.plan.segments[t.seg]
        if t.kind == "F":
            for eidx in seg.in_edges:
                src = self._part(self.plan.edges[eidx].src)
                if src != self.me:
                    self._post(src, self._tag(t.mb, eidx, False))
        else:
            for eidx in seg.out_edges:
                dst = self._part(self.plan.edges[eidx].dst)
                if dst != self.me and self.sent.get((t.mb, eidx)):
                    self._post(dst, self._tag(t.mb, eidx, True))

    def _send(self, obj: Any, dst_part: int, tag: int, what: str) -> List[torch.Tensor]:
        t0 = timeline.now()
        works, tensors = transfer.isend(obj, self.ranks[dst_part], tag, self.group)
        self.works.extend(works)
        timeline.record(f"send {what}", "comm", t0, timeline.now(), dst=dst_part)
        return tensors

    def _rep_value(self, node, i: int) -> Any:
        memo = self.rep[i]
        if node in memo:
            return memo[node]
        if node.op == "placeholder":
            v = self.bound[i][self.plan.ph_name[node]]
        elif node.op == "get_attr":
            v = self.rt.root
            for part in node.target.split("."):
                v = getattr(v, part)
        else:
            v = self._eval(node, {}, i)
        memo[node] = v
        return v

    def _eval(self, n, env: Dict[Any, Any], i: int) -> Any:
        def look(a):
            if a in env:
                return env[a]
            if a in self.plan.replicated:
                return self._rep_value(a, i)
            raise SMPValidationError(f"smp: internal error: value '{a.name}' is not available for '{n.name}'")
        args = map_arg(n.args, look)
        kwargs = map_arg(n.kwargs, look)
        if n.op == "call_module":
            return self.rt.root.get_submodule(n.target)(*args, **kwargs)
        if n.op == "call_function":
            return n.target(*args, **kwargs)
        if n.op == "call_method":
            return getattr(args[0], n.target)(*args[1:], **kwargs)
        if n.op == "get_attr":
            v = self.rt.root
            for part in n.target.split("."):
                v = getattr(v, part)
            return v
        raise SMPValidationError(f"smp: internal error: cannot run node {n.op} {n.name}")

    # ------------------------------------------------------------- forward
    def forward(self, i: int, seg: Segment) -> Any:
        env: Dict[Any, Any] = {}
        for eidx in seg.in_edges:
            e = self.plan.edges[eidx]
            src = self._part(e.src)
            if src == self.me:
                obj, leaves = self.local_in.pop((i, eidx))
            else:
                obj, leaves = self._recv(src, self._tag(i, eidx, False), f"act mb{i} e{eidx}")
            self.recv_leaves[(i, eidx)] = [t for t in leaves if t.requires_grad]
            env.update(zip(e.values, obj))
        t0 = self._t_compute = timeline.now()
        out = None
        with self._modes(i):
            if self.plan.graph is None:
                call = self.ctx.calls[i]
                out = self.rt.root(*call.args, **call.kwargs)
            else:
                for n in seg.nodes:
                    env[n] = self._eval(n, env, i)
                if seg.index == self.plan.output_seg:
                    out = map_arg(self.plan.output.args[0], lambda a: env[a] if a in env
                                  else self._rep_value(a, i))
                    otype = getattr(self.plan.graph, "_shoal_output_type", None)
                    if otype is not None:  # a ModelOutput or other mapping type, as the forward returned it
                        out = otype(**out)
        if seg.index != self.plan.output_seg:   # (the output segment's event also covers the loss)
            timeline.record(f"F mb{i} s{seg.index}", "compute", t0, timeline.now())
        self._advance()
        for eidx in seg.out_edges:
            e = self.plan.edges[eidx]
            obj = [env[n] for n in e.values]
            dst = self._part(e.dst)
            if dst == self.me:
                new, leaves, tensors = transfer.detached(obj)
                self.local_in[(i, eidx)] = (new, leaves)
            else:
                tensors = self._send(obj, dst, self._tag(i, eidx, False), f"act mb{i} e{eidx}")
            self.sent[(i, eidx)] = [t for t in tensors if t.requires_grad] if self.backward_on else []
        return out

    # ------------------------------------------------------------- backward
    def backward(self, i: int, seg: Segment) -> None:
        acc: Dict[int, List[Any]] = {}

        def add(t: torch.Tensor, g: torch.Tensor):
            if id(t) in acc:
                acc[id(t)][1] = acc[id(t)][1] + g
            else:
                acc[id(t)] = [t, g]
        for eidx in seg.out_edges:
            sent = self.sent.pop((i, eidx), [])
            if not sent:
                continue
            dst = self._part(self.plan.edges[eidx].dst)
            if dst == self.me:
                grads = self.grad_in.pop((i, eidx))
            else:
                grads, _ = self._recv(dst, self._tag(i, eidx, True), f"grad mb{i} e{eidx}")
            for t, g in zip(sent, grads):
                if g is not None:
                    add(t, g)
        if seg.index == self.plan.output_seg:
            rec = self.ctx.records.pop(i, None)
            if rec is None:
                if any(t.grad is not None for k in seg.in_edges for t in self.recv_leaves.get((i, k), [])):
                    raise SMPValidationError("smp: call model.backward(loss) inside the step function, "
                                             "not loss.backward() (the pipeline runs the backward pass)")
            else:
                for t, g in zip(*rec):
                    if t.requires_grad:
                        add(t, (torch.ones_like(t) if g is None else g) * self.scale)
        t0 = timeline.now()
        if acc:
            tensors = [v[0] for v in acc.values()]
            grads = [v[1] for v in acc.values()]
            with self._modes(i):
                torch.autograd.backward(tensors, grads)
        timeline.record(f"B mb{i} s{seg.index}", "compute", t0, timeline.now())
        self._advance()
        for eidx in seg.in_edges:
            leaves = self.recv_leaves.pop((i, eidx), [])
            if not leaves:
                continue
            grads = [t.grad for t in leaves]
            src = self._part(self.plan.edges[eidx].src)
            if src == self.me:
                self.grad_in[(i, eidx)] = grads
            else:
                self._send(grads, src, self._tag(i, eidx, True), f"grad mb{i} e{eidx}")

    # ------------------------------------------------------------- the step
    def run(self) -> List[Any]:
        reducer = self.rt.reducer if self.backward_on and self.sync_grads else None
        overlap = self.rt.model._smp.overlapping_allreduce
        groups = {}
        if reducer is not None and overlap:
            groups = self.rt.final_groups(self.plan, self.sched, self.m)
        if reducer is not None:
            joining = self.rt.model._smp.joining
            reducer.divisor = None
            if joining is not None:       # DistributedModel.join(): replicas may have run out of batches
                n = reducer.active_replicas(True)
                reducer.divisor = None if joining else n
            reducer.begin_step(id(self.plan), list(groups.values()))
        tasks = self.sched.tasks_of(self.me)
        out_part = self._part(self.plan.output_seg)
        for k, t in enumerate(tasks):
            seg = self.plan.segments[t.seg]
            if k + 1 < len(tasks):
                self._prefetch(tasks[k + 1])
            elif self.s.pp_size > 1 and self.me != out_part:
                self._post(out_part, _RESULTS_TAG)
            try:
                if t.kind == "F":
                    if t.seg == self.plan.output_seg:
                        self.ctx.run_user(t.mb, lambda i=t.mb, sg=seg: self.forward(i, sg))
                        timeline.record(f"F mb{t.mb} s{t.seg} (+ step function)", "compute",
                                        self._t_compute, timeline.now())
                    else:
                        self.forward(t.mb, seg)
                else:
                    final = reducer is not None and t.mb == self.m - 1 and t.seg in groups
                    if final:
                        reducer.arm(groups[t.seg])
                    self.backward(t.mb, seg)
                    if final:
                        reducer.task_done(groups[t.seg])
            except BaseException as e:
                if not hasattr(e, "_smp_where"):
                    kind = "forward" if t.kind == "F" else "backward"
                    try:
                        e._smp_where = f"in the {kind} of microbatch {t.mb} through segment {t.seg} " \
                                       f"(partition {seg.part})"
                    except AttributeError:
                        pass
                raise
        results = self._exchange_results()
        t0 = timeline.now()
        for w in self.works:
            w.wait()
        timeline.record("wait sends", "comm", t0, timeline.now())
        if reducer is not None:
            reducer.finish()
        return results

    def _exchange_results(self) -> List[Any]:
        out_part = self._part(self.plan.output_seg)
        if self.s.pp_size == 1:
            return self.ctx.results
        if self.me == out_part:
            for p in range(self.s.pp_size):
                if p != self.me:
                    self._send(self.ctx.results, p, _RESULTS_TAG, "step results")
            return self.ctx.results
        results, _ = self._recv(out_part, _RESULTS_TAG, "step results")
        return results
