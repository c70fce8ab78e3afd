"""Activation checkpointing: ``smp.set_activation_checkpointing`` and the runtime behind it.

A checkpointed module keeps only its inputs (and outputs) from the forward
pass; its inner activations are recomputed during the backward pass. The
recomputation is torch's non-reentrant ``torch.utils.checkpoint``: it stashes
the random number generator state (``preserve_rng_state``), so a dropout
inside sees the same random numbers in both runs and the gradients equal
those of a run without checkpointing, and it replays the forward's autocast
and grad mode.

``set_activation_checkpointing(module, ...)`` marks a module
(activation_marks.py) and gives it a ``forward`` of its own (an instance
attribute, :class:`_CheckpointedForward`) that runs the class's forward under
the checkpoint. So the module is checkpointed however it is called: by the
pipeline as a placement unit, or by the forward of the unit that holds it.
For an ``nn.Sequential`` or ``nn.ModuleList`` the children are marked:

- ``each``: every child on its own;
- ``contiguous``: maximal runs of consecutive children on one partition;
- ``group_N``: up to N consecutive children on one partition.

A group is run by its first child: when it is called, it runs the children
of its group one after the other (each on the previous one's output, as
``nn.Sequential`` does) under one checkpoint and hands each later child its
output when that child is called with the output of the child before it. A
child called with anything else (a parent whose forward does more between
the children than pass the output on) is checkpointed on its own, so the
result is always that of the plain forward. The groups follow the placement:
they never cross partitions.

No checkpointing happens while smp measures the model (tracing.py), while
torch.fx traces it (graph.py), or when grad is disabled: the module's
forward then runs as it is.

Marks are made after ``smp.DistributedModel(model)`` and before the first
step (the placement reads them: a checkpointed module is kept whole in one
partition, placement.py).
"""

from __future__ import annotations

import contextvars
import inspect
import re
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.fx
import torch.utils.checkpoint

from . import tracing
from ..mpcommon.errors import SMPValidationError
from .activation_marks import ATTR, Mark, mark_of
from .state import STATE, require

_SEQUENCES = (torch.nn.Sequential, torch.nn.ModuleList)
# torch.fx symbolic tracing in progress (the narrower query where this torch has it)
_fx_tracing = getattr(torch.fx._symbolic_trace, "is_fx_tracing_symbolic_tracing", None) or \
    torch.fx._symbolic_trace.is_fx_tracing
# set while a group runs its children: their own forwards then run as they are
_PLAIN: contextvars.ContextVar[bool] = contextvars.ContextVar("smp_activation_checkpointing_plain", default=False)


# ----------------------------------------------------------------- arguments

def parse_strategy(strategy: Any, where: str) -> int:
    """The group size a strategy means: 1 for "each", 0 for "contiguous", N for "group_N"."""
    if strategy == "each":
        return 1
    if strategy == "contiguous":
        return 0
    m = re.fullmatch(r"group_(.*)", strategy) if isinstance(strategy, str) else None
    if m is not None:
        n = m.group(1)
        if not n.isdigit() or int(n) < 1:
            raise SMPValidationError(f"{where}: strategy {strategy!r}: N in 'group_N' must be an integer >= 1, "
                                     f"got {n!r}")
        return int(n)
    raise SMPValidationError(f"{where}: unknown strategy {strategy!r}: use 'each', 'contiguous' or 'group_N' "
                             f"(N consecutive children checkpointed together)")


def check_flag(where: str, name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise SMPValidationError(f"{where}: {name} must be True or False, got {value!r}")


def group_spans(parts: Sequence[int], size: int) -> List[Tuple[int, int]]:
    """[start, end) of each group of consecutive children, given each child's
    partition: a group never crosses partitions and holds at most `size`
    children (0: no limit, "contiguous")."""
    spans, start = [], 0
    for i in range(1, len(parts) + 1):
        if i == len(parts) or parts[i] != parts[start] or (size and i - start == size):
            spans.append((start, i))
            start = i
    return spans


# ----------------------------------------------------------------- running

def active() -> bool:
    """Whether a checkpointed module checkpoints now (not while measuring or tracing, not without grad)."""
    return (torch.is_grad_enabled() and not tracing.is_tracing() and not _PLAIN.get()
            and not _fx_tracing())


def run_checkpointed(fn: Callable, args: tuple, kwargs: dict, preserve_rng_state: bool) -> Any:
    return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False,
                                             preserve_rng_state=preserve_rng_state, **kwargs)


class _CheckpointedForward:
    """The ``forward`` of a marked module (an instance attribute, so that
    ``nn.Module.__call__`` and its hooks stay as they are): the class's
    forward (or the instance's own, if it had one), checkpointed as the mark
    says when :func:`active`. Copies and pickles with its module."""

    __slots__ = ("module", "inner")

    def __init__(self, module: torch.nn.Module, inner: Optional[Callable]):
        self.module, self.inner = module, inner

    def plain(self) -> Callable:
        return self.inner if self.inner is not None else type(self.module).forward.__get__(self.module)

    @property
    def __signature__(self) -> inspect.Signature:
        return inspect.signature(self.plain())

    def __call__(self, *args, **kwargs):
        fwd = self.plain()
        mk = mark_of(self.module)
        if mk is None or not active():
            return fwd(*args, **kwargs)
        if mk.group is None:
            return run_checkpointed(fwd, args, kwargs, mk.preserve_rng_state)
        return mk.group.call(mk.index, fwd, args, kwargs)


def _mark(module: torch.nn.Module, mk: Mark) -> None:
    module.__dict__[ATTR] = mk
    current = module.__dict__.get("forward")
    if not isinstance(current, _CheckpointedForward):
        module.__dict__["forward"] = _CheckpointedForward(module, current)


def _placement():
    model = STATE.model
    rt = getattr(getattr(model, "_smp", None), "rt", None)
    return None if rt is None else rt.pl


def _partition_of(name: str, pl) -> Optional[int]:
    """The partition of the unit that is, or holds, module `name`."""
    for u in pl.units:
        if u == "" or name == u or name.startswith(u + "."):
            return pl.unit_part[u]
    return None


def _names_in_model(modules: Sequence[torch.nn.Module]) -> Optional[List[str]]:
    """The qualified names of `modules` in the wrapped model (None if it does not hold them all)."""
    model = STATE.model
    if model is None:
        return None
    names: Dict[int, str] = {}
    for n, m in model.module.named_modules(remove_duplicate=False):
        names.setdefault(id(m), n)
    if not all(id(m) in names for m in modules):
        return None
    return [names[id(m)] for m in modules]


class _Group:
    """The children of one sequence checkpointed in groups ("contiguous", "group_N")."""

    def __init__(self, members: List[torch.nn.Module], names: Optional[List[str]], size: int,
                 preserve_rng_state: bool, spread: bool = False):
        self.members, self.names, self.size = members, names, size
        self.preserve = preserve_rng_state
        self.spread = spread        # a tuple output goes to the next child as positional arguments
        self._spans: Tuple[Any, List[Tuple[int, int]]] = (None, [])
        self.stash: Dict[int, Tuple[Any, Any]] = {}   # child index -> (its expected input, its output)

    def spans(self) -> List[Tuple[int, int]]:
        pl = _placement()
        if self._spans[0] is not pl or not self._spans[1]:
            parts: List[int] = [0] * len(self.members)
            if pl is not None and self.names is not None:
                for i, n in enumerate(self.names):
                    p = _partition_of(n, pl)
                    parts[i] = p if p is not None else -1 - i   # above the units: a group of its own
            self._spans = (pl, group_spans(parts, self.size))
        return self._spans[1]

    def _step(self, m: torch.nn.Module, x: Any) -> Any:
        return m(*x) if self.spread and isinstance(x, tuple) else m(x)

    def chain(self, start: int, end: int, first: Callable) -> Callable:
        rest = self.members[start + 1:end]

        def run(*args, **kwargs):
            token = _PLAIN.set(True)
            try:
                y = first(*args, **kwargs)
                outs = [y]
                for m in rest:
                    y = self._step(m, y)
                    outs.append(y)
            finally:
                _PLAIN.reset(token)
            return tuple(outs)
        return run

    def _expects(self, hit: Tuple[Any, Any], args: tuple, kwargs: dict) -> bool:
        want = hit[0]
        if kwargs:
            return False
        if self.spread and isinstance(want, tuple):
            return len(args) == len(want) and all(a is w for a, w in zip(args, want))
        return len(args) == 1 and args[0] is want

    def call(self, k: int, fwd: Callable, args: tuple, kwargs: dict) -> Any:
        start, end = next((s, e) for s, e in self.spans() if s <= k < e)
        if end - start > 1 and k == start:
            outs = run_checkpointed(self.chain(start, end, fwd), args, kwargs, self.preserve)
            self.stash = {j: (outs[j - start - 1], outs[j - start]) for j in range(start + 1, end)}
            return outs[0]
        hit = self.stash.pop(k, None)
        if hit is not None and self._expects(hit, args, kwargs):
            return hit[1]
        self.stash = {}
        return run_checkpointed(fwd, args, kwargs, self.preserve)


# ----------------------------------------------------------------- the API

def set_activation_checkpointing(module: torch.nn.Module, preserve_rng_state: bool = True,
                                 pack_args_as_tuple: bool = False, strategy: str = "each") -> None:
    """Checkpoints `module`, a submodule of the DistributedModel's module
    (``model.module.<path>``), in every step: its forward is recomputed in the
    backward pass instead of keeping its activations. For an ``nn.Sequential``
    or ``nn.ModuleList``, its children are checkpointed by `strategy`
    ("each", "contiguous", "group_N"). Call it after ``smp.DistributedModel``
    and before the first step; calling it again on a module replaces its
    settings."""
    where = "smp.set_activation_checkpointing"
    if not isinstance(module, torch.nn.Module):
        raise SMPValidationError(f"{where}: module must be a torch.nn.Module, got {type(module).__name__}")
    check_flag(where, "preserve_rng_state", preserve_rng_state)
    check_flag(where, "pack_args_as_tuple", pack_args_as_tuple)
    size = parse_strategy(strategy, where)
    sequence = isinstance(module, _SEQUENCES)
    if not sequence and strategy != "each":
        raise SMPValidationError(f"{where}: strategy={strategy!r} applies to the children of an nn.Sequential "
                                 f"or nn.ModuleList; a {type(module).__name__} is checkpointed whole (leave "
                                 f"strategy='each')")
    if not sequence and pack_args_as_tuple:
        raise SMPValidationError(f"{where}: pack_args_as_tuple applies to an nn.Sequential or nn.ModuleList, "
                                 f"not to a {type(module).__name__}")
    s = require()
    model = s.model
    if model is None or model._smp.epoch != s.epoch:
        raise SMPValidationError(f"{where}: wrap the model first: call it after smp.DistributedModel(model), "
                                 f"on a submodule of model.module")
    if model.partitioned:
        raise SMPValidationError(f"{where}: the model is partitioned already (a step ran); mark modules "
                                 f"before the first step, which places them")
    names = _names_in_model([module])
    if names is None:
        raise SMPValidationError(f"{where}: the {type(module).__name__} given is not part of the wrapped "
                                 f"model; pass a submodule of the module given to smp.DistributedModel "
                                 f"(model.module.<path>)")
    if names[0] == "" and not sequence and s.cfg.partitions > 1:
        raise SMPValidationError(f"{where}: the wrapped module itself cannot be checkpointed with "
                                 f"{s.cfg.partitions} partitions (it spans them); checkpoint its submodules")
    if not sequence:
        _mark(module, Mark(preserve_rng_state, pack_args_as_tuple, strategy))
        return
    children = list(module)
    group = None
    if size != 1:
        group = _Group(children, _names_in_model(children), size, preserve_rng_state)
    for i, child in enumerate(children):
        _mark(child, Mark(preserve_rng_state, pack_args_as_tuple, strategy, group, i))


def checkpoint_module(module: torch.nn.Module, args: tuple, preserve_rng_state: bool) -> Any:
    """patches.checkpoint.checkpoint: `module(*args)`, checkpointed."""
    if mark_of(module) is not None:           # its own forward checkpoints
        return module(*args)
    if _fx_tracing():
        # The calling forward is glue the pipeline traces: the call of `module`
        # becomes a call of a unit, which checkpoints once marked (graph.py
        # refuses to trace through a marked module, so it is kept whole).
        _mark(module, Mark(preserve_rng_state, functional=True))
        return module(*args)
    if not active():
        return module(*args)
    return run_checkpointed(module, args, {}, preserve_rng_state)


def checkpoint_sequence(seq: torch.nn.Module, inp: Any, strategy: str, preserve_rng_state: bool,
                        pack_args_as_tuple: bool) -> Any:
    """patches.checkpoint.checkpoint_sequential: the children of `seq`, one
    after the other, checkpointed in groups by `strategy`."""
    size = parse_strategy(strategy, "smp.patches.checkpoint.checkpoint_sequential")
    spread = not pack_args_as_tuple
    children = list(seq)
    grouper = _Group(children, None, size, preserve_rng_state, spread)
    if not children:
        return inp
    marked = all(mark_of(c) is not None for c in children)
    if _fx_tracing() and not marked:
        group = None if size == 1 else _Group(children, _names_in_model(children), size, preserve_rng_state,
                                              spread)
        for i, c in enumerate(children):
            _mark(c, Mark(preserve_rng_state, pack_args_as_tuple, strategy, group, i, functional=True))
        marked = True
    x = inp
    if marked or not active():
        for c in children:
            x = grouper._step(c, x)
        return x
    for start, end in group_spans([0] * len(children), size):
        first = children[start]
        args = x if spread and isinstance(x, tuple) else (x,)
        x = run_checkpointed(grouper.chain(start, end, first), args, {}, preserve_rng_state)[-1]
    return x
