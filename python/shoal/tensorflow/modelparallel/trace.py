"""Turning the model's ``call`` into a plan: its unit calls, where each runs,
and which values cross partitions.

At the first step (and for every new microbatch shape) every rank:

1. runs ``call`` eagerly on one microbatch, recording the unit calls in order
   (the layer, its output shapes, its time on the second of two runs, its
   parameter bytes) and, in manual mode, the ``smp.partition`` context each
   call ran in;
2. traces ``call`` into a graph (tf.function) with the same hook, and for
   every tensor a unit call consumes (and every output of the model) walks
   the graph back through the code between units to the unit calls it derives
   from: its *sources*. A value with no source derives from the model's inputs
   only and is computed on every rank; a value whose sources all sit on one
   partition is computed there and sent; a value that combines units of two
   partitions outside any layer cannot be computed anywhere and is refused
   (the automatic partitioner never cuts between such units);
3. (automatic) world rank 0 cuts the units, in order of first call, into
   contiguous stages minimising the largest stage cost
   ``(1 - w) * time share + w * memory share`` (w = memory_weight) and
   broadcasts the cut; (manual) a unit goes to the partition it was called
   in or created in, else to default_partition.

When a model calls fewer layers than there are partitions, the layer with the
largest cost that holds layers of its own is opened: its inner layers become
the units.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import numpy as np
import tensorflow as tf

from ...mpcommon.errors import SMPTraceError, SMPValidationError
from ...mpcommon.split import split_contiguous
from .. import ops
from . import context as X


@dataclasses.dataclass
class Call:
    layer: Any
    out_specs: Any                    # structure of tf.TensorSpec (and non-tensor values)
    n_in: int                         # flat input leaves
    time_s: float = 0.0
    ctx_part: Optional[int] = None    # the smp.partition context it ran in
    sources: List[Set[int]] = dataclasses.field(default_factory=list)   # per flat input: unit call indices
    same_as: List[Optional[int]] = dataclasses.field(default_factory=list)  # flat input: id of its graph value


@dataclasses.dataclass
class Plan:
    calls: List[Call]
    unit_layers: List[Any]            # distinct, in order of first call
    unit_part: Dict[int, int]         # id(layer) -> partition
    out_sources: List[Set[int]]       # per flat model output
    out_structure: Any
    chain: bool                       # partitions never decrease along the calls: 1F1B is safe
    expanded: Set[int] = dataclasses.field(default_factory=set)   # ids of opened layers

    def part_of_call(self, k: int) -> int:
        return self.unit_part[id(self.calls[k].layer)]

    def source_part(self, srcs: Set[int]) -> Optional[int]:
        parts = {self.part_of_call(k) for k in srcs}
        return parts.pop() if len(parts) == 1 else (None if not parts else -1)


def _is_tensor(x) -> bool:
    return isinstance(x, (tf.Tensor, tf.Variable, np.ndarray))


def _flat(args, kwargs) -> List[Any]:
    return tf.nest.flatten((list(args), dict(kwargs)))


def _spec(x):
    return tf.TensorSpec(x.shape, x.dtype) if isinstance(x, (tf.Tensor, tf.Variable)) else x


class _Recorder:
    """The hook while recording: every unit call runs (on every rank)."""

    def __init__(self, model, expand: Set[int], timing: bool):
        self.model, self.expand, self.timing = model, expand, timing
        self.calls: List[Call] = []
        self.graph_in: List[List[Any]] = []
        self.graph_out: List[List[Any]] = []

    def __call__(self, layer, call, args, kwargs):
        if layer is self.model or X.in_unit():
            return call(*args, **kwargs)
        if id(layer) in self.expand:
            return call(*args, **kwargs)
        flat_in = _flat(args, kwargs)
        ctx = X.current_partition()
        with X.inside_unit():
            t0 = time.perf_counter()
            out = call(*args, **kwargs)
            dt = time.perf_counter() - t0
        self.calls.append(Call(layer, tf.nest.map_structure(_spec, out), len(flat_in), dt, ctx))
        self.graph_in.append(flat_in)
        self.graph_out.append(tf.nest.flatten(out))
        return out


def _run(model, fn, args, kwargs, expand, timing=False) -> _Recorder:
    rec = _Recorder(model, expand, timing)
    with X.hooked(rec):
        rec.result = fn(*args, **kwargs)
    return rec


def _sources(graph_in, graph_out, outputs) -> Tuple[List[List[Set[int]]], List[Set[int]], List[List[Optional[int]]]]:
    """Per unit input and per model output: the unit calls it derives from."""
    produced: Dict[int, int] = {}
    for k, outs in enumerate(graph_out):
        for t in outs:
            if isinstance(t, tf.Tensor):
                produced.setdefault(id(t), k)
    memo: Dict[int, frozenset] = {}

    def walk(t) -> frozenset:
        """The unit calls `t` derives from, through the code between units."""
        if not isinstance(t, tf.Tensor):
            return frozenset()
        todo = [(t, False)]
        while todo:                  # post-order over the glue above t, without recursion
            x, expanded = todo.pop()
            if id(x) in produced or (id(x) in memo and not expanded):
                continue
            if not expanded:
                if x.op.type in ("ReadVariableOp", "ResourceGather"):
                    raise SMPTraceError(f"smp: the model's call reads a variable ('{x.op.name}') outside its "
                                        f"layers; only layers may own and read variables (move that code into "
                                        f"a layer)")
                memo[id(x)] = frozenset()        # in progress (the graph has no cycles)
                todo.append((x, True))
                todo.extend((i, False) for i in x.op.inputs)
                continue
            acc = frozenset()
            for i in x.op.inputs:
                acc |= frozenset([produced[id(i)]]) if id(i) in produced else memo[id(i)]
            memo[id(x)] = acc
        return frozenset([produced[id(t)]]) if id(t) in produced else memo[id(t)]

    srcs = [[set(walk(t)) for t in ins] for ins in graph_in]
    same = [[id(t) if isinstance(t, tf.Tensor) else None for t in ins] for ins in graph_in]
    outs = [set(walk(t)) for t in tf.nest.flatten(outputs)]
    return srcs, outs, same


def _param_bytes(layer) -> int:
    return sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in layer.weights)


def _inner_layers(layer) -> List[Any]:
    try:
        return list(layer._flatten_layers(include_self=False, recursive=False))
    except AttributeError:
        return []


def record(model, fn, args, kwargs, cfg, pipe_rank: int, previous: Optional[Plan] = None) -> Plan:
    """The plan for a microbatch of this shape (see the module docstring).
    Runs eagerly; args are real or synthetic inputs of the shape. With
    `previous` (the model's first plan) the placement stays that one: a layer
    keeps its partition, and its variables their owner, whatever the input."""
    expand: Set[int] = set(previous.expanded) if previous else set()
    while previous is None:
        _run(model, fn, args, kwargs, expand)                 # builds the layers
        rec = _run(model, fn, args, kwargs, expand, timing=True)
        layers: List[Any] = []
        for c in rec.calls:
            if all(c.layer is not l for l in layers):
                layers.append(c.layer)
        if len(layers) >= cfg.partitions or not cfg.auto_partition:
            break
        openable = [l for l in layers if _inner_layers(l)]
        if not openable:
            raise SMPTraceError(f"smp: {type(model).__name__}.call calls {len(layers)} layer(s) "
                                f"({', '.join(l.name for l in layers)}), too few for {cfg.partitions} partitions")
        cost = {id(l): sum(c.time_s for c in rec.calls if c.layer is l) for l in openable}
        expand.add(id(max(openable, key=lambda l: cost[id(l)])))
    if previous is not None:
        _run(model, fn, args, kwargs, expand)
        rec = _run(model, fn, args, kwargs, expand, timing=True)
        layers = []
        for c in rec.calls:
            if all(c.layer is not l for l in layers):
                layers.append(c.layer)
        new = [l.name for l in layers if id(l) not in previous.unit_part]
        if new:
            raise SMPTraceError(f"smp: {type(model).__name__}.call calls layers for this input "
                                f"({', '.join(new)}) that it did not call at the first step; the placement "
                                f"is made once, from the first step's calls")
    # the dataflow, from a graph of the same call
    specs = tf.nest.map_structure(_spec, (list(args), dict(kwargs)))
    grec: Dict[str, _Recorder] = {}

    def traced(a, k):
        r = _Recorder(model, expand, False)
        with X.hooked(r):
            r.result = fn(*a, **k)
        grec["r"] = r
        return r.result
    tf.function(traced, autograph=False).get_concrete_function(*specs)
    g = grec["r"]
    if [id(c.layer) for c in g.calls] != [id(c.layer) for c in rec.calls]:
        raise SMPTraceError(f"smp: {type(model).__name__}.call calls its layers in another order when traced "
                            f"into a graph than when run eagerly; the pipeline needs one order")
    srcs, out_srcs, same = _sources(g.graph_in, g.graph_out, g.result)
    for c, s, sm in zip(rec.calls, srcs, same):
        c.sources, c.same_as = s, sm
    unit_part = dict(previous.unit_part) if previous else _place(model, rec.calls, layers, cfg)
    plan = Plan(rec.calls, layers, unit_part, out_srcs, tf.nest.map_structure(_spec, rec.result), chain=True,
                expanded=expand)
    _check(plan, model)
    parts = [plan.part_of_call(k) for k in range(len(plan.calls))]
    plan.chain = all(a <= b for a, b in zip(parts, parts[1:]))
    return plan


def _place(model, calls: List[Call], layers: List[Any], cfg) -> Dict[int, int]:
    p = cfg.partitions
    first = {id(l): i for i, l in enumerate(layers)}
    if not cfg.auto_partition:
        part: Dict[int, int] = {}
        for c in calls:
            q = c.ctx_part if c.ctx_part is not None else getattr(c.layer, "_smp_partition", cfg.default_partition)
            if q >= p:
                raise SMPValidationError(f"smp: layer '{c.layer.name}' is placed on partition {q} but there are "
                                         f"only {p} partitions")
            if part.setdefault(id(c.layer), q) != q:
                raise SMPValidationError(f"smp: layer '{c.layer.name}' is called on partitions {part[id(c.layer)]} "
                                         f"and {q}; a layer (and its variables) lives on one partition")
        return part
    if p == 1:
        return {id(l): 0 for l in layers}
    # cuts that would split a value combining several units are not allowed
    forbidden: Set[int] = set()
    for c in calls:
        for s in c.sources:
            pos = sorted(first[id(calls[k].layer)] for k in s)
            if len(pos) > 1:
                forbidden.update(range(pos[0] + 1, pos[-1] + 1))
    t = [sum(c.time_s for c in calls if c.layer is l) for l in layers]
    m = [float(_param_bytes(l)) for l in layers]
    w = cfg.memory_weight
    ts, ms = sum(t) or 1.0, sum(m) or 1.0
    cost = [(1 - w) * a / ts + w * b / ms for a, b in zip(t, m)]
    if ops.rank() == 0:
        try:
            stage = split_contiguous(cost, p, allowed=set(range(1, len(layers))) - forbidden)
        except ValueError as e:
            stage = [-1] * len(layers)
            why = str(e)
        cut = tf.constant(stage, tf.int32)
    else:
        cut = tf.zeros([len(layers)], tf.int32)
        why = ""
    cut = ops.broadcast(cut, 0, ops.Group(0, list(range(ops.size())))).numpy().tolist()
    if cut and cut[0] < 0:
        raise SMPTraceError(f"smp: {type(model).__name__}: its layers cannot be cut into {p} partitions without "
                            f"splitting a value that combines several layers outside a layer {why}")
    return {id(l): int(s) for l, s in zip(layers, cut)}


def _check(plan: Plan, model) -> None:
    for k, c in enumerate(plan.calls):
        for i, s in enumerate(c.sources):
            if plan.source_part(s) == -1:
                names = sorted({plan.calls[j].layer.name for j in s})
                raise SMPTraceError(
                    f"smp: input {i} of layer '{c.layer.name}' combines the outputs of {', '.join(names)}, which "
                    f"are on different partitions, outside any layer: put them on one partition or do the "
                    f"combining inside a layer")
    for i, s in enumerate(plan.out_sources):
        if plan.source_part(s) == -1:
            raise SMPTraceError(f"smp: output {i} of {type(model).__name__}.call combines layers of several "
                                f"partitions outside any layer")


def describe(plan: Plan, partitions: int) -> str:
    rows = [f"smp: {len(plan.unit_layers)} units on {partitions} partitions"
            f"{'' if plan.chain else ' (not a chain: the simple schedule is used)'}:"]
    for q in range(partitions):
        ls = [l for l in plan.unit_layers if plan.unit_part[id(l)] == q]
        t = sum(c.time_s for c in plan.calls if plan.unit_part[id(c.layer)] == q)
        pb = sum(_param_bytes(l) for l in ls)
        rows.append(f"  partition {q}: {t * 1e3:7.2f} ms, {pb / 2**20:7.2f} MiB params: "
                    f"{', '.join(l.name for l in ls)}")
    return "\n".join(rows)


def synthetic(specs) -> Any:
    """Zeros for a structure of TensorSpecs with fully known shapes."""
    def one(s):
        if isinstance(s, tf.TensorSpec):
            if not s.shape.is_fully_defined():
                raise SMPValidationError(f"smp: inside tf.function the step's inputs need fully known shapes "
                                         f"(got {s.shape}); batch with drop_remainder=True, or run the step eagerly")
            return tf.zeros(s.shape, s.dtype)
        return s
    return tf.nest.map_structure(one, specs)


def stand_in(specs) -> Any:
    return tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype) if isinstance(s, tf.TensorSpec) else s, specs)


def signature(args: Sequence[Any], kwargs: Dict[str, Any]) -> Tuple:
    return tuple((tuple(x.shape), x.dtype.name) if _is_tensor(x) else ("py", repr(x)) for x in _flat(args, kwargs))
