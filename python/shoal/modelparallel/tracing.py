"""Measuring the model for the automatic partitioner.

On the first step, rank 0 runs the wrapped module on one microbatch with
hooks on every submodule and records, per module: how often it was called,
its time (inclusive of its children), the bytes of its outputs (the
activations the next module receives), and the arguments of its first call
(to check later whether its forward can be traced). Parameter bytes come from
the module tree.

A module's time is what a pipeline stage spends on it per microbatch: when
the model trains, its forward plus its backward (from the backward pre-hook,
when the gradient of its output arrives, to the backward hook, when that of
its input is done), since the two differ by module (an output projection's
backward costs twice its forward, attention's more, an embedding's little).
The model runs once to warm up and then ``repeats`` times; each module keeps
its fastest run, the measure least disturbed by whatever else the machine is
doing, so a noisy start does not unbalance the stages. Where the backward
cannot be hooked (a module modifies its output in place) the forward times,
measured without autograd, are used. A module whose inputs need no gradient
(an embedding of token ids) ends its backward when its parameters' gradients
are accumulated. The gradients the runs accumulate are dropped (every
``.grad`` is as before) and the random number generator's state is restored
afterwards, so measuring does not change the training run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import warnings
from typing import Any, Dict, List, Mapping, Optional

import torch
from torch.utils._pytree import tree_map

_TRACING = [False]


def is_tracing() -> bool:
    """True while the partitioner runs the model to measure it."""
    return _TRACING[0]


@dataclasses.dataclass
class ModuleCost:
    name: str
    calls: int = 0
    time_s: float = 0.0
    act_bytes: int = 0
    order: int = -1                 # index of its first call among all module calls
    backward_s: float = 0.0         # the part of time_s spent in its backward
    backward_seen: bool = False
    first_args: tuple = ()
    first_kwargs: dict = dataclasses.field(default_factory=dict)


def _nbytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (tuple, list)):
        return sum(_nbytes(x) for x in obj)
    if isinstance(obj, dict):
        return sum(_nbytes(x) for x in obj.values())
    return 0


def param_bytes(module: torch.nn.Module, seen: Optional[set] = None) -> int:
    """The bytes of the module's parameters, each once; with `seen` (ids, updated),
    only those not counted before."""
    seen, total = (set() if seen is None else seen), 0
    for p in module.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel() * p.element_size()
    return total


@contextlib.contextmanager
def _preserved_rng():
    state = torch.get_rng_state()
    try:
        yield
    finally:
        torch.set_rng_state(state)


def _grad_tensors(obj: Any) -> List[torch.Tensor]:
    """The tensors requiring grad in a structure of tuples, lists and mappings."""
    found: List[torch.Tensor] = []

    def walk(o):
        if isinstance(o, torch.Tensor):
            if o.requires_grad:
                found.append(o)
        elif isinstance(o, (tuple, list)):
            for x in o:
                walk(x)
        elif isinstance(o, Mapping):
            for x in o.values():
                walk(x)
    walk(obj)
    return found


def _grad_roots(out: Any) -> List[torch.Tensor]:
    """The tensors of a forward's output to run the backward from: its scalar
    ones (a loss) if any, else all that require grad."""
    found = _grad_tensors(out)
    scalars = [t for t in found if t.dim() == 0]
    return scalars or found


class _Recorder:
    """Hooks on every module recording one run's forward and backward times."""

    def __init__(self, root: torch.nn.Module, backward: bool):
        self.names: Dict[int, str] = {}
        for name, m in root.named_modules():
            self.names.setdefault(id(m), name)
        self.costs: Dict[str, ModuleCost] = {}
        self.stack: List[float] = []
        self.bstart: Dict[str, List[float]] = {}
        self.open: Dict[str, float] = {}          # backward started; ends when its parameters' do
        self.accumulated: Dict[int, float] = {}   # parameter -> when its gradient was accumulated
        self.module_params: Dict[str, List[int]] = {}
        self.counter = 0
        self.handles = []
        seen = set()
        if backward:
            for p in root.parameters():
                if p.requires_grad:
                    self.handles.append(p.register_post_accumulate_grad_hook(self._accumulated))
        for m in root.modules():
            if id(m) in seen:
                continue
            seen.add(id(m))
            self.handles.append(m.register_forward_pre_hook(self._pre, with_kwargs=True))
            self.handles.append(m.register_forward_hook(self._post, with_kwargs=True))
            if backward:
                self.module_params[self.names[id(m)]] = [id(p) for p in m.parameters()]
                self.handles.append(m.register_full_backward_pre_hook(self._bpre))
                self.handles.append(m.register_full_backward_hook(self._bpost))

    def reset(self) -> None:
        self.costs = {}
        self.stack.clear()
        self.bstart.clear()
        self.open.clear()
        self.accumulated.clear()
        self.counter = 0

    def close(self) -> None:
        for h in self.handles:
            h.remove()

    def _pre(self, m, a, kw):
        name = self.names.get(id(m))
        if name not in self.costs:
            # detached: the record must not keep the measured run's autograd graph (and its parameters) alive
            a, kw = tree_map(lambda t: t.detach() if isinstance(t, torch.Tensor) else t, (a, dict(kw)))
            self.costs[name] = ModuleCost(name, order=self.counter, first_args=a, first_kwargs=kw)
        self.counter += 1
        self.stack.append(time.perf_counter())

    def _post(self, m, a, kw, out):
        t = time.perf_counter() - self.stack.pop()
        c = self.costs[self.names.get(id(m))]
        c.calls += 1
        c.time_s += t
        c.act_bytes += _nbytes(out)

    def _bpre(self, m, grad_output):
        self.bstart.setdefault(self.names.get(id(m)), []).append(time.perf_counter())

    def _bpost(self, m, grad_input, grad_output):
        name = self.names.get(id(m))
        starts = self.bstart.get(name)
        if not starts:
            return
        start = starts.pop()
        if all(g is None for g in grad_input):
            # no input needs a gradient (an embedding of token ids): the hook fires
            # before the module's backward runs, which ends with its parameters'
            self.open[name] = start
            return
        c = self.costs[name]
        c.backward_s += time.perf_counter() - start
        c.backward_seen = True

    def _accumulated(self, p):
        self.accumulated[id(p)] = time.perf_counter()

    def finish(self) -> Dict[str, ModuleCost]:
        """Adds each module's backward to its time; one whose backward hooks could
        not fire (its output is not a tensor or tuple of them, e.g. a
        ModelOutput) gets the sum of its children's."""
        def caller(name: str) -> Optional[str]:   # the nearest ancestor that was called
            while name:
                name = name.rsplit(".", 1)[0] if "." in name else ""
                if name in self.costs:
                    return name
            return None
        for name, start in self.open.items():
            ends = [self.accumulated[i] for i in self.module_params.get(name, ()) if i in self.accumulated]
            if ends and max(ends) > start:
                self.costs[name].backward_s += max(ends) - start
                self.costs[name].backward_seen = True
        for name in sorted(self.costs, key=lambda n: -n.count(".") - (n != "")):
            up = caller(name)
            if up is not None and not self.costs[up].backward_seen:
                self.costs[up].backward_s += self.costs[name].backward_s
        for c in self.costs.values():
            c.time_s += c.backward_s
        return self.costs


def _run(root, rec: _Recorder, args, kwargs, params: List[torch.Tensor]) -> Dict[str, ModuleCost]:
    """One measured run; with `params`, forward and backward, the gradients it
    accumulates dropped (every .grad is as before)."""
    rec.reset()
    if not params:
        with torch.no_grad():
            root(*args, **kwargs)
        return rec.costs
    leaves = params + [t for t in _grad_tensors((args, kwargs)) if t.is_leaf]
    held = [t.grad for t in leaves]
    try:
        for t in leaves:
            t.grad = None
        out = root(*args, **kwargs)
        roots = _grad_roots(out)
        if roots:
            torch.autograd.backward(roots, [torch.ones_like(t) for t in roots])
    finally:
        for t, g in zip(leaves, held):
            t.grad = g
    return rec.finish()


def _fastest(runs: List[Dict[str, ModuleCost]]) -> Dict[str, ModuleCost]:
    """Per module, its fastest run (time and the backward part of it together)."""
    best = runs[0]
    for name, c in best.items():
        fast = min((r[name] for r in runs if name in r), key=lambda q: q.time_s)
        c.time_s, c.backward_s, c.backward_seen = fast.time_s, fast.backward_s, fast.backward_seen
    return best


def measure(root: torch.nn.Module, args: tuple, kwargs: Mapping[str, Any],
            repeats: int = 3) -> Dict[str, ModuleCost]:
    """Runs root(*args, **kwargs) once to warm up and `repeats` times measured;
    returns each module's cost (its fastest run) by name."""
    params = [p for p in root.parameters() if p.requires_grad] if root.training else []
    _TRACING[0] = True
    try:
        with _preserved_rng(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*[Bb]ackward hook", category=UserWarning)
            if params:
                rec = _Recorder(root, True)
                try:
                    runs = [_run(root, rec, args, kwargs, params) for _ in range(1 + max(1, repeats))]
                    return _fastest(runs[1:])
                except RuntimeError:   # a module modifies its output in place: forward times only
                    pass
                finally:
                    rec.close()
            rec = _Recorder(root, False)
            try:
                runs = [_run(root, rec, args, kwargs, []) for _ in range(1 + max(1, repeats))]
                return _fastest(runs[1:])
            finally:
                rec.close()
    finally:
        _TRACING[0] = False
