"""The executor of one ``@smp.step`` on one rank.

Each microbatch is a forward task F(m) and, when the step function asked for
gradients, a backward task B(m). F(m) runs the step function on microbatch m
under a persistent tf.GradientTape with the layer hook (context.py) active:
unit calls of this partition run, others return stand-ins; a value a unit of
another partition consumes is sent to it (ShoalSend returns once issued) and
received there (ShoalRecv, watched by the tape). The model's outputs are sent
from their partition to every other rank of the pipeline, so the step
function's loss and returned values are real on every rank.

B(m) walks F(m)'s transfers backwards: for a value it sent it receives the
gradient, for a value it received it sends the gradient, computing with the
tape's gradient() only what the next send needs (targets since the last one).
Gradients with respect to this rank's variables accumulate over the calls.

Task order: ``simple`` runs every F before any B (deadlock-free for any
placement); ``interleaved`` is one-forward-one-backward with p - 1 - stage
forwards first, used when the partitions never decrease along the unit calls
(a chain); otherwise the simple order is used. Everything runs in program
order, eagerly or inside tf.function alike (the ops are stateful, so
TensorFlow keeps them in order).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import tensorflow as tf

from ...mpcommon.errors import SMPTraceError, SMPValidationError
from .. import ops
from . import context as X
from . import trace as T

_GRAD_TAG = 1 << 40
_OUT_CALL = (1 << 20) - 1


def _tag(m: int, k: int, i: int) -> int:
    return ((m << 20 | k) << 12) | (i & 0xFFF)


class _MB:
    """What F(m) leaves for B(m)."""

    def __init__(self, m: int):
        self.m = m
        self.tape: Optional[tf.GradientTape] = None
        self.events: List[Tuple[str, Any, int, int]] = []   # (send|recv, tensor, peer, tag)
        self.loss = None                                      # the target of the deferred gradients
        self.var_lists: List[List[tf.Variable]] = []
        self.grads: List[List[Any]] = []                     # per deferred request, per variable


class StepRun:
    def __init__(self, state, plan_for):
        self.s = state
        self.plan_for = plan_for       # (model, call, args, kwargs) -> Plan
        self.me = state.pp_rank
        self.group = state.pipe
        self.plan: Optional[T.Plan] = None
        self.mbs: Dict[int, _MB] = {}
        self.cur: Optional[_MB] = None
        self.received: Dict[Tuple[int, int], Any] = {}

    # ------------------------------------------------------------- forward
    @tf.autograph.experimental.do_not_convert
    def model_call(self, model, call, args, kwargs):
        mb = self.cur
        if mb is None:
            raise SMPValidationError("smp: the model was called outside the step's microbatches")
        if self.plan is None:
            self.plan = self.plan_for(model, call, args, kwargs)
        plan = self.plan
        counter = [0]
        seen: Dict[Tuple[Any, int], Any] = {}

        def hook(layer, lcall, largs, lkwargs):
            if layer is model or X.in_unit():
                return lcall(*largs, **lkwargs)
            k = counter[0]
            if k >= len(plan.calls) or plan.calls[k].layer is not layer:
                if id(layer) in plan.expanded:
                    return lcall(*largs, **lkwargs)
                raise SMPTraceError(f"smp: {type(model).__name__}.call called layer '{layer.name}' where it "
                                    f"called '{plan.calls[k].layer.name if k < len(plan.calls) else 'nothing'}' "
                                    f"when traced; the calls must not depend on the data")
            counter[0] += 1
            c = plan.calls[k]
            q = plan.part_of_call(k)
            flat = T._flat(largs, lkwargs)
            changed = False
            for i, srcs in enumerate(c.sources):
                p = plan.source_part(srcs)
                if p is None or p == q:
                    continue
                key = (c.same_as[i], q)
                if self.me == p and key not in seen:
                    seen[key] = True
                    self._send(mb, flat[i], q, _tag(mb.m, k, i))
                elif self.me == q:
                    if key not in seen:
                        seen[key] = self._recv(mb, flat[i], p, _tag(mb.m, k, i))
                    flat[i] = seen[key]
                    changed = True
            if self.me != q:
                return T.stand_in(c.out_specs)
            if changed:
                largs, lkwargs = tf.nest.pack_sequence_as((list(largs), dict(lkwargs)), flat)
            with X.inside_unit():
                return lcall(*largs, **lkwargs)

        with X.hooked(hook):
            out = call(*args, **kwargs)
        if counter[0] != len(plan.calls):
            raise SMPTraceError(f"smp: {type(model).__name__}.call made {counter[0]} layer calls, "
                                f"{len(plan.calls)} when traced; the calls must not depend on the data")
        flat = tf.nest.flatten(out)
        for j, srcs in enumerate(plan.out_sources):
            p = plan.source_part(srcs)
            if p is None:
                continue
            tag = _tag(mb.m, _OUT_CALL, j)
            if self.me == p:
                for r in range(self.s.pp_size):
                    if r != p:
                        ops.send(flat[j], r, tag, self.group)
            else:
                flat[j] = _shaped(ops.recv(p, flat[j].dtype, tag, self.group), flat[j])
        return tf.nest.pack_sequence_as(out, flat)

    def _send(self, mb: _MB, t, q: int, tag: int) -> None:
        ops.send(t, q, tag, self.group)
        mb.events.append(("send", t, q, tag))

    def _recv(self, mb: _MB, like, p: int, tag: int):
        v = _shaped(ops.recv(p, like.dtype, tag, self.group), like)
        if mb.tape is not None:
            mb.tape.watch(v)
        mb.events.append(("recv", v, p, tag))
        return v

    def forward(self, m: int, fn) -> Any:
        mb = self.mbs[m] = _MB(m)
        self.cur = mb
        mb.tape = tf.GradientTape(persistent=True)
        try:
            with X.running(self), mb.tape:
                return fn()
        finally:
            self.cur = None

    def defer_gradients(self, loss, variables) -> List["DeferredGrad"]:
        """The gradient request of the step function for the current microbatch."""
        mb = self.cur
        if mb.loss is not None and mb.loss is not loss:
            raise SMPValidationError("smp: ask for gradients once per step function (one loss)")
        mb.loss = loss
        variables = list(variables)
        mb.var_lists.append(variables)
        idx = len(mb.var_lists) - 1
        return [DeferredGrad(mb.m, idx, j) for j in range(len(variables))]

    # ------------------------------------------------------------- backward
    def backward(self, m: int) -> None:
        mb = self.mbs[m]
        if mb.loss is None:
            mb.tape = None
            return
        local = [v for vs in mb.var_lists for v in vs]
        uniq: List[tf.Variable] = []
        for v in local:
            if all(v is not u for u in uniq):
                uniq.append(v)
        recvd = [ev[1] for ev in mb.events if ev[0] == "recv"]
        acc_v: List[Any] = [None] * len(uniq)
        acc_r: Dict[int, Any] = {}
        pending: List[Tuple[Any, Any]] = [(mb.loss, tf.ones_like(mb.loss))]

        def flush():
            if not pending:
                return
            gs = mb.tape.gradient([t for t, _ in pending], uniq + recvd, output_gradients=[g for _, g in pending])
            pending.clear()
            for i, g in enumerate(gs[:len(uniq)]):
                acc_v[i] = _add(acc_v[i], g)
            for t, g in zip(recvd, gs[len(uniq):]):
                acc_r[id(t)] = _add(acc_r.get(id(t)), g)
        for kind, t, peer, tag in reversed(mb.events):
            if kind == "send":
                pending.append((t, _shaped(ops.recv(peer, t.dtype, tag | _GRAD_TAG, self.group), t)))
            else:
                flush()
                g = acc_r.pop(id(t), None)
                ops.send(tf.zeros_like(t) if g is None else tf.convert_to_tensor(g), peer, tag | _GRAD_TAG,
                         self.group)
        flush()
        for vs in mb.var_lists:
            mb.grads.append([acc_v[next(i for i, u in enumerate(uniq) if u is v)] for v in vs])
        mb.tape = None

    def grad_of(self, d: "DeferredGrad"):
        return self.mbs[d.m].grads[d.req][d.j]

    # ------------------------------------------------------------- the step
    def run(self, n: int, forward_fn) -> List[Any]:
        """forward_fn(m) runs the step function on microbatch m; returns the
        per-microbatch results. F(0) comes first on every rank (it makes the
        plan the order depends on)."""
        results: List[Any] = [None] * n
        results[0] = self.forward(0, lambda: forward_fn(0))
        for kind, m in self.order_after_first(n):
            if kind == "F":
                results[m] = self.forward(m, lambda m=m: forward_fn(m))
            else:
                self.backward(m)
        ops.wait_sends(self.group)
        return results

    def order_after_first(self, n: int) -> List[Tuple[str, int]]:
        p, me = self.s.pp_size, self.me
        if self.s.cfg.pipeline == "simple" or self.plan is None or not self.plan.chain or p == 1:
            return [("F", m) for m in range(1, n)] + [("B", m) for m in range(n)]
        warm = min(n, p - me)          # forwards in flight before the first backward (F(0) included)
        out: List[Tuple[str, int]] = [("F", m) for m in range(1, warm)]
        f, b = warm, 0
        while b < n:
            out.append(("B", b))
            b += 1
            if f < n:
                out.append(("F", f))
                f += 1
        return out


class DeferredGrad:
    """A gradient the step function asked for; StepOutput resolves it after the backward tasks."""

    __slots__ = ("m", "req", "j")

    def __init__(self, m: int, req: int, j: int):
        self.m, self.req, self.j = m, req, j

    def __repr__(self) -> str:
        return f"<smp gradient {self.j} of microbatch {self.m}: available after the step>"


def _shaped(received, like):
    """A received tensor with the static shape of what it stands for (inside tf.function)."""
    if not tf.executing_eagerly():
        received.set_shape(like.shape)
    return received


def _add(a, b):
    if b is None:
        return a
    if a is None:
        return b
    if isinstance(a, tf.IndexedSlices) and isinstance(b, tf.IndexedSlices):
        return tf.IndexedSlices(tf.concat([a.values, b.values], 0), tf.concat([a.indices, b.indices], 0),
                                a.dense_shape)
    return tf.convert_to_tensor(a) + tf.convert_to_tensor(b)
