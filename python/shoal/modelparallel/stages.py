"""Turning a traced forward into pipeline segments.

Every node of the graph (graph.py) gets a partition:

- a unit call: its unit's partition; a parameter read (``get_attr``): the
  parameter's owner;
- *replicated* nodes need no partition: the model's inputs, buffers and
  constants, and any operation on those only (``torch.arange(t)`` from an
  input's size, a mask computed from an input mask). Every rank of a model
  replica receives the same inputs, so each partition computes these itself
  where it needs them, instead of receiving them;
- other glue goes with its first consumer, except item and attribute access
  (``out[0]``, ``out.logits``), which stays with what it reads, so that only
  the used part of a module's output crosses a boundary. Glue whose result is
  unused (an in-place update) stays with its input.

Glue is then moved down to just before its first consumer, and the node list is
cut wherever the partition changes: each run is a *segment*. Values consumed
in another segment travel along *edges* (producer segment -> consumer segment,
a list of nodes). Segment s only consumes values of segments < s, so the
segments form a DAG that schedule.py orders. The model's output is produced by
the last segment: its partition runs the user's step function after the model
call (the loss).
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Dict, List, Optional

import torch.fx as fx
from torch.fx.node import map_arg

from ..mpcommon.errors import SMPTraceError
from .placement import Placement

_PRODUCER_SIDE = (operator.getitem, getattr)


@dataclasses.dataclass
class Edge:
    index: int
    src: int                       # segment
    dst: int                       # segment
    values: List[fx.Node]


@dataclasses.dataclass
class Segment:
    index: int
    part: int
    nodes: List[fx.Node]
    in_edges: List[int] = dataclasses.field(default_factory=list)
    out_edges: List[int] = dataclasses.field(default_factory=list)
    preds: List[int] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Plan:
    graph: Optional[fx.Graph]        # None: one segment that calls the whole module
    segments: List[Segment]
    edges: List[Edge]
    replicated: set                   # nodes computed on every partition that needs them
    placeholders: List[fx.Node]
    output: Optional[fx.Node]
    output_seg: int
    ph_name: Dict[fx.Node, str] = dataclasses.field(default_factory=dict)   # placeholder -> forward arg

    def segments_of(self, part: int) -> List[Segment]:
        return [s for s in self.segments if s.part == part]

    def describe(self) -> str:
        rows = []
        for s in self.segments:
            names = [n.name for n in s.nodes]
            rows.append(f"segment {s.index} on partition {s.part}: {', '.join(names[:12])}"
                        f"{' ...' if len(names) > 12 else ''}")
        for e in self.edges:
            rows.append(f"edge {e.index}: segment {e.src} -> {e.dst}: {', '.join(n.name for n in e.values)}")
        return "\n".join(rows)


def single(part: int) -> Plan:
    """The whole module as one segment (one partition, or a manual placement on one)."""
    return Plan(None, [Segment(0, part, [])], [], set(), [], None, 0)


def _inputs(n: fx.Node) -> List[fx.Node]:
    out: List[fx.Node] = []
    map_arg((n.args, n.kwargs), lambda a: out.append(a))
    return out


def build(g: fx.Graph, pl: Placement, root_params: set) -> Plan:
    """The segments and edges of graph `g` under placement `pl`.

    root_params: the qualified names of the module's parameters (get_attr of
    anything else, buffers and constants, is replicated)."""
    nodes = list(g.nodes)
    index = {n: i for i, n in enumerate(nodes)}
    output = next(n for n in nodes if n.op == "output")
    rep: set = set()
    part: Dict[fx.Node, int] = {}
    for n in nodes:
        if n.op == "placeholder":
            rep.add(n)
        elif n.op == "get_attr":
            if n.target in root_params:
                part[n] = pl.owner[n.target]
            else:
                rep.add(n)
        elif n.op == "call_module":
            if n.target not in pl.unit_part:
                raise SMPTraceError(f"smp: the traced forward calls module '{n.target}', which is not a "
                                    f"pipeline unit (internal error: units {pl.units})")
            part[n] = pl.unit_part[n.target]
        elif n.op in ("call_function", "call_method"):
            if all(a in rep for a in _inputs(n)):
                rep.add(n)
    calls = [n for n in nodes if n.op == "call_module"]
    params_read = [n for n in nodes if n in part and n.op == "get_attr"]
    out_part = part[calls[-1]] if calls else (part[params_read[-1]] if params_read else 0)

    # glue: consumer side (reverse order so that consumers are decided first)
    glue = [n for n in nodes if n.op in ("call_function", "call_method") and n not in rep]
    for n in reversed(glue):
        ins = [a for a in _inputs(n) if a not in rep]
        if n.op == "call_function" and n.target in _PRODUCER_SIDE and ins and ins[0] in part:
            part[n] = part[ins[0]]
            continue
        users = sorted((u for u in n.users if u is not output), key=index.get)
        decided = [u for u in users if u in part]
        if decided:
            part[n] = part[decided[0]]
        elif output in n.users:
            part[n] = out_part
        elif ins and all(a in part for a in ins):
            part[n] = part[ins[-1]]
        else:
            part[n] = out_part
    # producer-side nodes whose input was decided later in the reverse pass
    for n in glue:
        if n.op == "call_function" and n.target in _PRODUCER_SIDE:
            ins = [a for a in _inputs(n) if a not in rep]
            if ins:
                part[n] = part[ins[0]]

    # move glue and parameter reads down to just before their first consumer
    order = [n for n in nodes if n in part]
    movable = [n for n in order if n.op != "call_module"]
    for n in reversed(movable):
        users = [u for u in n.users if u in part]
        if not users:
            continue
        order.remove(n)
        first = min(order.index(u) for u in users)
        order.insert(first, n)

    segments: List[Segment] = []
    seg_of: Dict[fx.Node, int] = {}
    for n in order:
        if not segments or segments[-1].part != part[n]:
            segments.append(Segment(len(segments), part[n], []))
        segments[-1].nodes.append(n)
        seg_of[n] = segments[-1].index
    if not segments or segments[-1].part != out_part:
        segments.append(Segment(len(segments), out_part, []))
    out_seg = len(segments) - 1

    edges: List[Edge] = []
    edge_of: Dict[tuple, Edge] = {}

    def need(value: fx.Node, dst: int):
        if value in rep:
            return
        src = seg_of[value]
        if src == dst:
            return
        if src > dst:
            raise SMPTraceError(f"smp: internal error: segment {dst} reads '{value.name}' of a later segment")
        e = edge_of.get((src, dst))
        if e is None:
            e = edge_of[(src, dst)] = Edge(len(edges), src, dst, [])
            edges.append(e)
            segments[src].out_edges.append(e.index)
            segments[dst].in_edges.append(e.index)
            segments[dst].preds.append(src)
        if value not in e.values:
            e.values.append(value)

    for s in segments:
        for n in s.nodes:
            for a in _inputs(n):
                need(a, s.index)
    for a in _inputs(output):
        need(a, out_seg)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    return Plan(g, segments, edges, rep, placeholders, output, out_seg)
