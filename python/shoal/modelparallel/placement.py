"""Deciding which partition runs which module.

The unit of placement is a *unit*: a submodule the pipeline calls as a whole.
The units are the leaves of a cut through the module tree; the modules above
them are traced (graph.py) and their forward becomes glue code between units.

Automatic (``auto_partition``, the default), on rank 0 at the first step:

1. measure every module on one microbatch (tracing.py): its time (forward
   and, when training, backward; the fastest of three runs), output
   (activation) bytes, parameter bytes;
2. start from the children of the wrapped module and split any unit whose cost
   exceeds half a stage's share (or while there are fewer units than
   partitions) into the submodules its forward calls, provided that forward
   can be traced and the unit is not checkpointed (a module marked for
   activation checkpointing, activation_marks.py, is kept whole);
3. order the units by execution and cut the sequence into ``partitions``
   contiguous pieces minimising the largest stage cost (dynamic programming),
   where a unit's cost is ``(1 - w) * time share + w * memory share`` with
   ``w = memory_weight`` and memory = parameter bytes + activation bytes (a
   parameter that units share counts once, with the first of them);
4. modules that share a parameter (tied weights) go to the partition of the
   first of them, even if that makes a partition non-contiguous, and step 3's
   cut is chosen with that constraint applied (split_with_ties), so the
   stages stay balanced;
5. trace the whole forward with these units; if a module above them cannot be
   traced, keep it whole and start again.

Manual (``auto_partition: false``): a module goes to the partition given to it
by ``smp.set_partition(module, i)``, else to that of the ``smp.partition(i)``
context it was *created* in (innermost wins), else to the partition its nearest
ancestor was given by ``set_partition`` (the way to place a model someone else
built, e.g. a Hugging Face model's blocks), else to ``default_partition``. The
units are the largest subtrees that live on one partition. A module marked for
activation checkpointing whose submodules are on several partitions is an
error (check_checkpointed), raised on every rank before the first step runs.

A parameter read directly by glue code (for example a position embedding that
is an ``nn.Parameter`` of the wrapped module) belongs, in manual mode, to the
partition of its module; in automatic mode to the partition of the first unit
called after it is read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
from typing import Callable, Dict, List, Optional, Sequence

import torch
import torch.fx as fx

from . import graph as G
from .activation_marks import marked_modules
from ..mpcommon.errors import SMPTraceError, SMPValidationError
from ..mpcommon.split import split_contiguous
from .tracing import ModuleCost, param_bytes

# ----------------------------------------------------------------- smp.partition

_STACK: List[int] = []
_ORIG_INIT: List[Callable] = []
_LIMIT: List[Optional[int]] = [None]   # the number of partitions, once smp.init ran


def _tagging_init(self, *args, **kwargs):
    _ORIG_INIT[0](self, *args, **kwargs)
    if _STACK:
        object.__setattr__(self, "_smp_partition", _STACK[-1])


@contextlib.contextmanager
def partition(index: int):
    """Places every module *created* inside the context on partition `index`
    (the innermost context wins); ignored when auto_partition is on."""
    _check_index(f"smp.partition({index!r})", index)
    if not _STACK:
        _ORIG_INIT.append(torch.nn.Module.__init__)
        torch.nn.Module.__init__ = _tagging_init
    _STACK.append(index)
    try:
        yield
    finally:
        _STACK.pop()
        if not _STACK:
            torch.nn.Module.__init__ = _ORIG_INIT.pop()


def _check_index(where: str, index) -> None:
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise SMPValidationError(f"{where}: index must be an integer >= 0, got {index!r}")
    if _LIMIT[0] is not None and index >= _LIMIT[0]:
        raise SMPValidationError(f"{where}: there are only {_LIMIT[0]} partitions (0..{_LIMIT[0] - 1})")


def set_partition(module: torch.nn.Module, index: int) -> None:
    """Places `module`, and every module below it that has no placement of its
    own, on partition `index` (manual partitioning; ignored when auto_partition
    is on). Call it before the model's first step."""
    if not isinstance(module, torch.nn.Module):
        raise SMPValidationError(f"smp.set_partition: module must be a torch.nn.Module, got {type(module).__name__}")
    _check_index(f"smp.set_partition({type(module).__name__}, {index!r})", index)
    object.__setattr__(module, "_smp_set_partition", index)


def set_limit(partitions: Optional[int]) -> None:
    _LIMIT[0] = partitions


# ----------------------------------------------------------------- placement

@dataclasses.dataclass
class Placement:
    partitions: int
    mode: str                                   # "auto", "manual" or "single"
    units: List[str]                            # execution order ('' alone: the whole module)
    unit_part: Dict[str, int]
    module_part: Dict[str, int] = dataclasses.field(default_factory=dict)   # manual tags
    owner: Dict[str, int] = dataclasses.field(default_factory=dict)         # state_dict name -> partition
    replicated: List[str] = dataclasses.field(default_factory=list)         # glue buffers (on every rank)
    unit_cost: Dict[str, tuple] = dataclasses.field(default_factory=dict)   # unit -> (time_s, param B, act B)
    unit_time: Dict[str, tuple] = dataclasses.field(default_factory=dict)   # unit -> (fwd s, bwd s) a call

    def local_names(self, pp_rank: int) -> List[str]:
        return [n for n, p in self.owner.items() if p == pp_rank]


def _merge_ties(groups: List[List[int]]) -> List[List[int]]:
    """Groups that share an item, merged (a unit may share two parameters with two others)."""
    parent: Dict[int, int] = {}

    def find(x: int) -> int:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x
    for g in groups:
        for i in g[1:]:
            parent[find(i)] = find(g[0])
    out: Dict[int, List[int]] = {}
    for g in groups:
        for i in g:
            out.setdefault(find(i), []).append(i)
    return [sorted(set(v)) for v in out.values() if len(set(v)) > 1]


def split_with_ties(costs: Sequence[float], parts: int, ties: Sequence[Sequence[int]],
                    max_candidates: int = 200_000) -> List[int]:
    """The stage of each item, as split_contiguous, where each group in `ties`
    (items sharing a parameter) must share a stage: that of its first item.

    The balance is computed with the constraint, not restored after it: every
    contiguous cut is tried with the tied items moved to their first item's
    stage, and the one with the smallest largest stage wins (every stage
    keeping at least one item; ties broken towards earlier cuts). Without
    ties, or with more cuts than `max_candidates`, it is split_contiguous
    followed by the move."""
    n = len(costs)
    groups = [sorted(g) for g in ties if len(g) > 1]
    if not groups:
        return split_contiguous(costs, parts)
    follow = {}  # item -> the item whose stage it takes
    for g in groups:
        for i in g[1:]:
            follow[i] = g[0]

    def with_ties(stage: List[int]) -> List[int]:
        return [stage[follow.get(i, i)] for i in range(n)]

    if math.comb(n - 1, parts - 1) > max_candidates:
        return with_ties(split_contiguous(costs, parts))
    best, best_stage = float("inf"), None
    for cuts in itertools.combinations(range(1, n), parts - 1):
        bounds = (0,) + cuts + (n,)
        stage = [0] * n
        for k in range(parts):
            for i in range(bounds[k], bounds[k + 1]):
                stage[i] = k
        stage = with_ties(stage)
        sums = [0.0] * parts
        for c, st in zip(costs, stage):
            sums[st] += c
        if len(set(stage)) < parts:
            continue
        if max(sums) < best - 1e-15:
            best, best_stage = max(sums), stage
    if best_stage is None:  # the ties leave some stage empty whatever the cut
        return with_ties(split_contiguous(costs, parts))
    return best_stage


def _called_children(name: str, costs: Dict[str, ModuleCost], root: torch.nn.Module) -> List[str]:
    """The called modules right below `name` (looking through containers that are never called)."""
    out: List[str] = []

    def walk(mod_name: str, mod: torch.nn.Module):
        for child_name, child in mod.named_children():
            q = f"{mod_name}.{child_name}" if mod_name else child_name
            if q in costs:
                out.append(q)
            else:
                walk(q, child)
    walk(name, root.get_submodule(name) if name else root)
    return sorted(set(out), key=lambda q: costs[q].order)


def _unit_params(root: torch.nn.Module, unit: str) -> Dict[int, List[str]]:
    m = root.get_submodule(unit) if unit else root
    pre = unit + "." if unit else ""
    out: Dict[int, List[str]] = {}
    for n, p in m.named_parameters(remove_duplicate=False):
        out.setdefault(id(p), []).append(pre + n)
    return out


def auto_placement(root: torch.nn.Module, costs: Dict[str, ModuleCost], partitions: int,
                   memory_weight: float, call_args: dict) -> (Placement, fx.Graph):
    """Rank 0's automatic partition (see the module docstring). Returns the
    placement (owners not yet assigned) and the traced graph."""
    if partitions == 1:
        return Placement(1, "single", [""], {"": 0}), None
    pbytes = {n: param_bytes(root.get_submodule(n) if n else root) for n in costs}
    keep_whole = {name for name, _, _ in marked_modules(root)}   # checkpointed: never split
    traceable_cache: Dict[str, Optional[str]] = {}

    def splittable(u: str) -> bool:
        if u in keep_whole or not _called_children(u, costs, root):
            return False
        if u not in traceable_cache:
            c = costs[u]
            m = root.get_submodule(u)
            rel = [k[len(u) + 1:] for k in _called_children(u, costs, root)]
            try:
                args = G.bind(m, c.first_args, c.first_kwargs)
            except TypeError as e:
                traceable_cache[u] = str(e)
            else:
                traceable_cache[u] = G.traceable(m, rel, args)
        return traceable_cache[u] is None

    total_t = sum(costs[u].time_s for u in _called_children("", costs, root)) or 1.0
    total_m = sum(pbytes[u] + costs[u].act_bytes for u in _called_children("", costs, root)) or 1.0

    def cost(u: str, mem: Dict[str, int] = pbytes, mem_total: float = total_m) -> float:
        return (1 - memory_weight) * costs[u].time_s / total_t + \
            memory_weight * (mem[u] + costs[u].act_bytes) / mem_total

    for _attempt in range(64):
        units = _called_children("", costs, root)
        if not units:
            raise SMPTraceError("smp: the wrapped module calls no submodule, so it cannot be split into "
                                f"{partitions} partitions")
        while True:
            total = sum(cost(u) for u in units)
            cand = [u for u in units if (cost(u) > total / (2 * partitions) or len(units) < partitions)
                    and splittable(u)]
            if not cand:
                break
            u = max(cand, key=cost)
            i = units.index(u)
            units[i:i + 1] = _called_children(u, costs, root)
        units.sort(key=lambda q: costs[q].order)
        if len(units) < partitions:
            raise SMPTraceError(
                f"smp: cannot split the model into {partitions} partitions: it has only {len(units)} "
                f"pipeline units ({', '.join(units)}) after splitting every module whose forward can be "
                f"traced; use fewer partitions or place modules with smp.partition")
        # tied parameters: the units sharing one share a stage (the first
        # sharer's), and the balance is computed with that constraint
        sharers: Dict[int, List[int]] = {}
        for i, u in enumerate(units):
            for pid in _unit_params(root, u):
                sharers.setdefault(pid, []).append(i)
        ties = _merge_ties(list(sharers.values()))
        # a shared parameter is memory once, on its stage: counted with the first unit holding it
        counted: set = set()
        ubytes = {u: param_bytes(root.get_submodule(u) if u else root, counted) for u in units}
        unit_m = sum(ubytes[u] + costs[u].act_bytes for u in units) or 1.0
        stage = split_with_ties([cost(u, ubytes, unit_m) for u in units], partitions, ties)
        unit_part = dict(zip(units, stage))
        try:
            g = G.trace(root, units, call_args)
        except G.TraceFailure as e:
            if not e.module or e.module in keep_whole:
                raise SMPTraceError(f"smp: {e}; the pipeline needs the forward of the wrapped module to be "
                                    f"traceable (docs/modelparallel.md, \"What the model's forward may do\")"
                                    ) from e.cause
            keep_whole.add(e.module)
            continue
        pl = Placement(partitions, "auto", units, unit_part)
        pl.unit_cost = {u: (costs[u].time_s, ubytes[u], costs[u].act_bytes) for u in units}
        pl.unit_time = {u: ((costs[u].time_s - costs[u].backward_s) / max(1, costs[u].calls),
                            costs[u].backward_s / max(1, costs[u].calls)) for u in units}
        return pl, g
    raise SMPTraceError("smp: automatic partitioning did not converge")


def manual_placement(root: torch.nn.Module, partitions: int, default: int) -> Placement:
    """The placement from smp.partition contexts (see the module docstring)."""
    module_part: Dict[str, int] = {}

    def tag(name: str, m: torch.nn.Module, inherited: Optional[int]) -> None:
        given = getattr(m, "_smp_set_partition", None)
        p = given if given is not None else getattr(m, "_smp_partition", inherited)
        p = default if p is None else p
        if p >= partitions:
            how = f"smp.set_partition(..., {p})" if given is not None else f"smp.partition({p})"
            raise SMPValidationError(f"smp: module '{name or type(root).__name__}' was placed by {how} "
                                     f"but there are only {partitions} partitions")
        module_part[name] = p
        below = given if given is not None else inherited
        for cn, c in m.named_children():
            tag(f"{name}.{cn}" if name else cn, c, below)
    tag("", root, None)
    check_checkpointed(root, module_part)

    def parts_below(name: str, m: torch.nn.Module) -> set:
        pre = name + "." if name else ""
        return {module_part[pre + n if n else name] for n, _ in m.named_modules(remove_duplicate=False)}

    units: List[str] = []

    def walk(name: str, m: torch.nn.Module):
        if len(parts_below(name, m)) == 1:
            units.append(name)
            return
        for cn, c in m.named_children():
            walk(f"{name}.{cn}" if name else cn, c)
    walk("", root)
    if units == [""]:
        return Placement(partitions, "single", [""], {"": module_part[""]}, module_part)
    return Placement(partitions, "manual", units, {u: module_part[u] for u in units}, module_part)


def check_checkpointed(root: torch.nn.Module, module_part: Dict[str, int]) -> None:
    """Manual placement: a module marked for activation checkpointing must lie
    within one partition (it is recomputed as a whole)."""
    for name, m, mark in marked_modules(root):
        pre = name + "." if name else ""
        parts = sorted({module_part[pre + n if n else name] for n, _ in m.named_modules(remove_duplicate=False)})
        if len(parts) > 1:
            how = "smp.patches.checkpoint" if mark.functional else "smp.set_activation_checkpointing"
            raise SMPValidationError(
                f"smp: module '{name or type(root).__name__}' is checkpointed ({how}) but its submodules are on "
                f"partitions {', '.join(map(str, parts))}; a checkpointed module must lie within one partition: "
                f"place it whole with smp.set_partition / smp.partition, or checkpoint its children")


def assign_owners(root: torch.nn.Module, pl: Placement, g: Optional[fx.Graph], default: int) -> None:
    """Fills pl.owner (every state_dict entry and parameter name -> partition) and pl.replicated."""
    owner: Dict[str, int] = {}
    by_id: Dict[int, int] = {}
    first_name: Dict[int, str] = {}
    unit_of: Dict[str, str] = {}
    for u in pl.units:
        m = root.get_submodule(u) if u else root
        pre = u + "." if u else ""
        for n, p in m.named_parameters(remove_duplicate=False):
            q = pre + n
            part = pl.unit_part[u]
            if id(p) in by_id and by_id[id(p)] != part:
                raise SMPValidationError(
                    f"smp: '{first_name[id(p)]}' (partition {by_id[id(p)]}) and '{q}' (partition {part}) "
                    f"are one parameter (tied weights); modules that share parameters must be on the "
                    f"same partition")
            by_id.setdefault(id(p), part)
            first_name.setdefault(id(p), q)
            owner[q] = part
            unit_of[q] = u
        for n, _ in m.named_buffers(remove_duplicate=False):
            owner[pre + n] = pl.unit_part[u]
    # parameters read by glue code
    glue_part: Dict[str, int] = {}
    if g is not None:
        nodes = list(g.nodes)
        modules_after: List[Optional[int]] = [None] * len(nodes)
        nxt = None
        for i in range(len(nodes) - 1, -1, -1):
            if nodes[i].op == "call_module":
                nxt = pl.unit_part.get(nodes[i].target, nxt)
            modules_after[i] = nxt
        last = next((pl.unit_part[n.target] for n in reversed(nodes) if n.op == "call_module"), default)
        for i, n in enumerate(nodes):
            if n.op == "get_attr" and n.target not in glue_part:
                glue_part[n.target] = modules_after[i] if modules_after[i] is not None else last
    replicated = []
    for q, p in root.named_parameters(remove_duplicate=False):
        if q in owner:
            continue
        if id(p) in by_id:
            owner[q] = by_id[id(p)]
            continue
        if pl.mode == "manual" or pl.mode == "single":
            mod = q.rsplit(".", 1)[0] if "." in q else ""
            part = pl.module_part.get(mod, default)
        else:
            part = glue_part.get(q, default)
        owner[q] = by_id[id(p)] = part
    for q, _ in root.named_buffers(remove_duplicate=False):
        if q not in owner:
            owner[q] = 0
            replicated.append(q)
    pl.owner = owner
    pl.replicated = replicated


def describe(root: torch.nn.Module, pl: Placement, microbatch: Optional[int] = None) -> str:
    """The table printed on rank 0 after partitioning."""
    head = (f"smp: {type(root).__name__} split into {pl.partitions} partition(s) "
            f"({'automatic' if pl.mode == 'auto' else 'manual' if pl.mode == 'manual' else 'single stage'}"
            f"{f', measured on a microbatch of {microbatch}' if microbatch and pl.mode == 'auto' else ''})")
    rows = [head, f"  {'stage':>5}  {'params':>10}  {'time':>9}  {'memory':>9}  modules"]
    params = dict(root.named_parameters())
    for s in range(pl.partitions):
        units = [u for u in pl.units if pl.unit_part[u] == s]
        n = sum(params[q].numel() for q, o in pl.owner.items() if o == s and q in params)
        if pl.unit_cost:
            t = sum(pl.unit_cost[u][0] for u in units) * 1e3
            mem = sum(pl.unit_cost[u][1] + pl.unit_cost[u][2] for u in units) / 2**20
            tt, mm = f"{t:7.2f}ms", f"{mem:7.2f}MB"
        else:
            tt, mm = "n/a", "n/a"
        names = ", ".join(u or "(whole model)" for u in units) or "(none)"
        if len(names) > 100:
            names = names[:97] + "..."
        rows.append(f"  {s:>5}  {n:>10,}  {tt:>9}  {mm:>9}  {names}")
    shared: Dict[int, List[str]] = {}
    for u in pl.units:
        for pid in _unit_params(root, u):
            shared.setdefault(pid, []).append(u)
    for us in shared.values():
        if len(us) > 1:
            rows.append(f"  tied: {', '.join(us)} share a parameter: stage {pl.unit_part[us[0]]} "
                        f"(balanced with that constraint)")
    return "\n".join(rows)
