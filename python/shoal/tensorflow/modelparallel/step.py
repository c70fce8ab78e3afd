"""``@smp.step``: the batch split into microbatches, the pipeline run, and one
``StepOutput`` per value the step function returns.

Splitting is strided, as in the SageMaker library's TensorFlow API:
microbatch m holds rows m, m + M, m + 2M, ... of every tensor argument
(along axis 0, or the axis ``input_split_axes`` names), except the arguments
named in ``non_split_inputs``; ``StepOutput.merge()`` puts rows back in the
batch's order. Inside the step function the gradients come from
``optimizer.get_gradients(loss, variables)``, ``optimizer.compute_gradients``
or ``tf.GradientTape().gradient`` (all three are deferred: the values are
filled in once the backward tasks ran).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from typing import Any, Callable, Dict, List, Optional, Sequence

import tensorflow as tf
from tensorflow import keras

from ...mpcommon import outputs as core_outputs
from ...mpcommon.errors import SMPValidationError
from .. import ops
from . import runtime as RT
from . import trace as T
from .state import require


# Library code runs as written inside tf.function (autograph would rewrite its Python control flow).
_plain = tf.autograph.experimental.do_not_convert


class StepOutput(core_outputs.StepOutput):
    """One returned value of the step function, per microbatch (reductions: mpcommon/outputs.py)."""

    @staticmethod
    def _sum(values):
        return tf.add_n([tf.convert_to_tensor(o) for o in values])

    @staticmethod
    def _concat(values, dim):
        return tf.concat(values, dim)

    @staticmethod
    def _stack(values, dim):
        return tf.stack(values, dim)

    def accumulate(self, method: str = "variable", var=None):
        """The mean over microbatches (gradients: the batch's gradient); an
        IndexedSlices gradient stays sparse (rows concatenated, scaled)."""
        if method not in ("variable", "add_n", "accumulate_n"):
            raise ValueError(f"smp: StepOutput.accumulate: method must be 'variable', 'add_n' or 'accumulate_n', "
                             f"got {method!r}")
        live = self._live()
        if not live:
            return None
        if len(self.outputs) == 1:
            return self.outputs[0]
        if all(isinstance(o, tf.IndexedSlices) for o in live):
            n = float(len(self.outputs))
            return tf.IndexedSlices(tf.concat([o.values for o in live], 0) / n,
                                    tf.concat([o.indices for o in live], 0), live[0].dense_shape)
        return self.reduce_mean()

    def merge(self, axis: int = 0):
        """The microbatches' rows back in the batch's order (the inverse of the strided split)."""
        if self.outputs and len(self.outputs[0].shape) == 0:
            raise ValueError("smp: StepOutput.merge needs tensors with a batch dimension, not scalars")
        st = tf.stack(self.outputs, axis + 1)          # [..., rows/M, M, ...]
        shape = tf.concat([tf.shape(self.outputs[0])[:axis], [-1], tf.shape(self.outputs[0])[axis + 1:]], 0)
        return tf.reshape(st, shape)


# Library code runs as written inside tf.function (autograph would rewrite its Python control flow).
for _name in ("reduce_sum", "reduce_mean", "concat", "stack", "map", "accumulate", "merge"):
    setattr(StepOutput, _name, _plain(getattr(StepOutput, _name)))


def _split(x, m: int, axis: int, what: str):
    if isinstance(x, StepOutput):
        return list(x.outputs)
    if not isinstance(x, (tf.Tensor, tf.Variable)) and not hasattr(x, "shape"):
        return [x] * m
    x = tf.convert_to_tensor(x)
    n = x.shape[axis]
    if n is None:
        if tf.executing_eagerly():
            n = int(tf.shape(x)[axis])
        else:
            raise SMPValidationError(f"smp: {what}: the batch dimension must be known inside tf.function "
                                     f"(batch with drop_remainder=True)")
    if n % m:
        raise SMPValidationError(f"smp ({require().who()}): {what}: a batch of {n} does not split into {m} "
                                 f"microbatches")
    idx = [slice(None)] * len(x.shape)
    out = []
    for k in range(m):
        idx[axis] = slice(k, None, m)
        out.append(x[tuple(idx)])
    return out


def _plan_for(run: RT.StepRun):
    s = require()

    def plan_for(model, call, args, kwargs):
        sig = T.signature(args, kwargs)
        plans = model.__dict__.setdefault("_smp_plans", {})
        if sig in plans:
            return plans[sig]
        mb = run.cur
        with mb.tape.stop_recording(), tf.init_scope():
            a, k = (args, kwargs) if tf.executing_eagerly() and all(
                not isinstance(x, tf.Tensor) or hasattr(x, "numpy") for x in T._flat(args, kwargs)) else \
                T.synthetic(tf.nest.map_structure(T._spec, (list(args), dict(kwargs))))
            first = next(iter(plans.values()), None)
            plan = T.record(model, call, a, k, s.cfg, s.pp_rank, previous=first)
        plans[sig] = plan
        if first is None:              # the placement, and so this rank's variables, are the first plan's
            local = [l for l in plan.unit_layers if plan.unit_part[id(l)] == s.pp_rank]
            object.__setattr__(model, "_smp_local", {id(v) for l in local for v in l.weights})
            if s.rank == 0:
                print(T.describe(plan, s.pp_size), flush=True)
        return plan
    return plan_for


class _Step:
    def __init__(self, fn: Callable, non_split_inputs: Optional[Sequence[str]] = None,
                 input_split_axes: Optional[Dict[str, int]] = None):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.sig = inspect.signature(fn)
        self.non_split = set(non_split_inputs or ())
        self.axes = dict(input_split_axes or {})

    def __get__(self, obj, objtype=None):
        return self if obj is None else functools.partial(self.__call__, obj)

    @_plain
    def __call__(self, *args, **kwargs):
        s = require()
        m = s.cfg.microbatches
        bound = self.sig.bind(*args, **kwargs)
        pieces: Dict[str, List[Any]] = {}
        for name, v in bound.arguments.items():
            if name in self.non_split:
                pieces[name] = [v] * m
                continue
            leaves = tf.nest.flatten(v)
            split = [_split(x, m, self.axes.get(name, 0), name) for x in leaves]
            pieces[name] = [tf.nest.pack_sequence_as(v, [parts[k] for parts in split]) for k in range(m)]
        run = RT.StepRun(s, None)
        run.plan_for = _plan_for(run)

        def forward(k):
            ba = self.sig.bind_partial()
            ba.arguments.update({n: pieces[n][k] for n in bound.arguments})
            with _deferring(run):
                return self.fn(*ba.args, **ba.kwargs)
        results = run.run(m, forward)
        if s.cfg.ddp and s.dp_size > 1:
            _average_over_replicas(run, s)
        return _outputs(run, results)


def _average_over_replicas(run: RT.StepRun, s) -> None:
    """'ddp': the gradients of every microbatch averaged over the replicas (one fused collective)."""
    slots = [(mb, i, j) for mb in run.mbs.values() for i, gs in enumerate(mb.grads) for j, g in enumerate(gs)
             if g is not None]
    dense = [(mb, i, j) for mb, i, j in slots if not isinstance(mb.grads[i][j], tf.IndexedSlices)]
    if dense:
        out = ops.allreduce_n([run.mbs[mb.m].grads[i][j] for mb, i, j in dense], "average", s.dp)
        for (mb, i, j), g in zip(dense, out):
            mb.grads[i][j] = g
    for mb, i, j in slots:
        g = mb.grads[i][j]
        if isinstance(g, tf.IndexedSlices):
            mb.grads[i][j] = tf.IndexedSlices(ops.allgather(g.values, s.dp) / s.dp_size,
                                              ops.allgather(g.indices, s.dp), g.dense_shape)


def _outputs(run: RT.StepRun, results: List[Any]):
    first = results[0]
    flat = [tf.nest.flatten(r, expand_composites=False) for r in results]

    def leaf(j):
        vals = [f[j] for f in flat]
        v0 = vals[0]
        if isinstance(v0, RT.DeferredGrad):
            return StepOutput([run.grad_of(v) for v in vals])
        if isinstance(v0, tf.Variable):
            return v0
        if isinstance(v0, (tf.Tensor, tf.IndexedSlices)):
            return StepOutput(vals)
        return v0
    return tf.nest.pack_sequence_as(first, [leaf(j) for j in range(len(flat[0]))])


def step(fn: Optional[Callable] = None, *, input_signature=None, autograph: bool = True,
         non_split_inputs: Optional[Sequence[str]] = None, input_split_axes: Optional[Dict[str, int]] = None,
         **tf_function_kwargs):
    """Decorates the step function (bare, or with the SageMaker arguments)."""
    if fn is None:
        return lambda f: _Step(f, non_split_inputs, input_split_axes)
    return _Step(fn, non_split_inputs, input_split_axes)


# ----------------------------------------------------------------- deferred gradients

class _Deferring:
    active: Optional[RT.StepRun] = None


@contextlib.contextmanager
def _deferring(run: RT.StepRun):
    prev, _Deferring.active = _Deferring.active, run
    try:
        yield
    finally:
        _Deferring.active = prev


def _get_gradients(self, loss, params):
    run = _Deferring.active
    if run is None:
        raise SMPValidationError("smp: optimizer.get_gradients works inside an @smp.step function only")
    return run.defer_gradients(loss, params)


def _compute_gradients(self, loss, var_list, tape=None):
    run = _Deferring.active
    if run is None:
        raise SMPValidationError("smp: optimizer.compute_gradients works inside an @smp.step function only")
    if callable(loss):
        loss = loss()
    var_list = list(var_list() if callable(var_list) else var_list)
    return list(zip(run.defer_gradients(loss, var_list), var_list))


_ORIG_TAPE_GRADIENT = tf.GradientTape.gradient


def _tape_gradient(self, target, sources, output_gradients=None, **kwargs):
    run = _Deferring.active
    if run is None or run.cur is None or self is run.cur.tape or output_gradients is not None:
        return _ORIG_TAPE_GRADIENT(self, target, sources, output_gradients=output_gradients, **kwargs)
    flat = tf.nest.flatten(sources)
    return tf.nest.pack_sequence_as(sources, run.defer_gradients(target, flat))


def install_gradient_hooks() -> None:
    """optimizer.get_gradients / compute_gradients (TF1-style Keras API, gone
    from Keras 3) and tf.GradientTape.gradient, deferred inside a step."""
    opt = keras.optimizers.Optimizer
    opt.get_gradients = _get_gradients
    opt.compute_gradients = _compute_gradients
    tf.GradientTape.gradient = _tape_gradient
