"""Measuring the model for the automatic partitioner.

On the first step, rank 0 runs the wrapped module's forward on one
microbatch (without autograd, twice: a warm-up, then the measured run) with
hooks on every submodule and records, per module: how often it was called,
its forward time (inclusive of its children), the bytes of its outputs (the
activations the next module receives), and the arguments of its first call
(to check later whether its forward can be traced). Parameter bytes come from
the module tree. The random number generator's state is restored afterwards,
so tracing does not change the training run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any, Dict, List, Mapping

import torch

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


def param_bytes(module: torch.nn.Module) -> int:
    seen, total = set(), 0
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


def measure(root: torch.nn.Module, args: tuple, kwargs: Mapping[str, Any],
            repeats: int = 2) -> Dict[str, ModuleCost]:
    """Runs root(*args, **kwargs) `repeats` times; returns the costs of the last run by module name."""
    names = {}
    for name, m in root.named_modules():
        names.setdefault(id(m), name)
    costs: Dict[str, ModuleCost] = {}
    stack: List[float] = []
    counter = [0]

    def pre(m, a, kw):
        name = names.get(id(m))
        c = costs.get(name)
        if c is None:
            c = costs[name] = ModuleCost(name, order=counter[0], first_args=a, first_kwargs=dict(kw))
        counter[0] += 1
        stack.append(time.perf_counter())

    def post(m, a, kw, out):
        t = time.perf_counter() - stack.pop()
        c = costs[names.get(id(m))]
        c.calls += 1
        c.time_s += t
        c.act_bytes += _nbytes(out)

    handles = []
    seen = set()
    for m in root.modules():
        if id(m) in seen:
            continue
        seen.add(id(m))
        handles.append(m.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(m.register_forward_hook(post, with_kwargs=True))
    _TRACING[0] = True
    try:
        with _preserved_rng(), torch.no_grad():
            for _ in range(max(1, repeats)):
                costs.clear()
                counter[0] = 0
                stack.clear()
                root(*args, **kwargs)
    finally:
        _TRACING[0] = False
        for h in handles:
            h.remove()
    return costs
