"""``smp.DistributedOptimizer``: the user's optimizer, partition-aware.

As in SageMaker, the wrapper returns the optimizer object itself, with its
class replaced by a subclass that adds ``local_state_dict`` and overrides
``state_dict`` / ``load_state_dict`` (so ``isinstance`` checks and LR
schedulers keep working). The optimizer is built over the whole model on
every rank; only the local partition's parameters ever get gradients, so
``step()`` updates only them, and after partitioning the state of the others
is dropped.

Optimizer state dicts number parameters by their position in the optimizer,
the same on every rank whatever the partitioning, so partial states of any
partitioning merge into a full one (checkpoint.py uses that to resume with a
different number of partitions).
"""

from __future__ import annotations

from typing import Any, Dict, List

import torch
import torch.distributed as dist

from ..mpcommon.errors import SMPUnsupportedError
from .state import require


def _params(opt: torch.optim.Optimizer) -> List[torch.nn.Parameter]:
    return [p for g in opt.param_groups for p in g["params"]]


class _DistributedMixin:
    def _smp_local_ids(self) -> set:
        s = require()
        rt = s.model._smp.rt if s.model is not None else None
        if rt is None:
            return {id(p) for p in _params(self)}
        return rt.local_ids

    def _smp_prune(self) -> None:
        """Drops the state of parameters this rank does not own."""
        local = self._smp_local_ids()
        for p in list(self.state.keys()):
            if id(p) not in local:
                del self.state[p]

    def step(self, *args, **kwargs):
        require().monitor.check()
        return super().step(*args, **kwargs)

    def local_state_dict(self) -> Dict[str, Any]:
        sd = super().state_dict()
        local = self._smp_local_ids()
        ids = {i: p for i, p in enumerate(_params(self))}
        sd["state"] = {k: v for k, v in sd["state"].items() if id(ids[k]) in local}
        sd["_smp_is_partial"] = True
        return sd

    def state_dict(self) -> Dict[str, Any]:
        s = require()
        rt = s.model._smp.rt if s.model is not None else None
        if rt is None or s.pp_size == 1:
            return super().state_dict()
        local = self.local_state_dict()
        parts: List[Any] = [None] * s.pp_size
        dist.all_gather_object(parts, local["state"], group=s.pipe)
        merged = {}
        for p in parts:
            merged.update(p)
        return {"state": dict(sorted(merged.items())), "param_groups": local["param_groups"]}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        sd = dict(state_dict)
        sd.pop("_smp_is_partial", None)
        super().load_state_dict(sd)
        self._smp_prune()


def DistributedOptimizer(optimizer: torch.optim.Optimizer, static_loss_scale: float = 1.0,
                         dynamic_loss_scale: bool = False, **dynamic_loss_args):
    """Makes `optimizer` partition-aware (see the module docstring) and returns it."""
    s = require()
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"smp.DistributedOptimizer: expected a torch.optim.Optimizer, got "
                        f"{type(optimizer).__name__}")
    if dynamic_loss_scale or dynamic_loss_args or static_loss_scale not in (1.0, None):
        raise SMPUnsupportedError("smp.DistributedOptimizer: the FP16 loss-scaling arguments are not "
                                  "implemented; use smp.amp.GradScaler")
    if not isinstance(optimizer, _DistributedMixin):
        cls = optimizer.__class__
        optimizer.__class__ = type(f"Distributed{cls.__name__}", (_DistributedMixin, cls), {})
    if optimizer not in s.optimizers:
        s.optimizers.append(optimizer)
    if s.model is not None and s.model.partitioned:
        optimizer._smp_prune()
    return optimizer
