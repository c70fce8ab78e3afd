"""Gradient-norm clipping over every partition's gradients.

Each rank holds the gradients of its own partition only (the others' are
None), so ``torch.nn.utils.clip_grad_norm_`` would see a part of the model.
:func:`clip_grad_norm_` sums the local ``|g|^p`` (or takes the local maximum
for the infinity norm) and reduces it over the model replica first; every rank
of the replica must call it. Replicas of a partition hold the same averaged
gradients after a step, so the result is the norm of the whole model.
"""

from __future__ import annotations

import math
from typing import Iterable, Union

import torch
import torch.distributed as dist

from .state import require


def clip_grad_norm_(parameters: Union[torch.Tensor, Iterable[torch.Tensor]], max_norm: float,
                    norm_type: float = 2.0, error_if_nonfinite: bool = False) -> torch.Tensor:
    s = require()
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    grads = [p.grad for p in parameters if p.grad is not None]
    return clip_grads_(grads, max_norm, norm_type, error_if_nonfinite, s)


def clip_grads_(grads, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                s=None) -> torch.Tensor:
    """Clips `grads` (this rank's share of the model's gradients) by the norm over every partition."""
    s = s or require()
    dev = grads[0].device if grads else torch.device("cpu")
    norm_type = float(norm_type)
    if norm_type == math.inf:
        local = torch.zeros(1, dtype=torch.float64, device=dev)
        for g in grads:
            local = torch.maximum(local, g.detach().abs().max().double().reshape(1))
        if s.pp_size > 1:
            dist.all_reduce(local, op=dist.ReduceOp.MAX, group=s.pipe)
        total = local[0]
    else:
        local = torch.zeros(1, dtype=torch.float64, device=dev)
        for g in grads:
            local += g.detach().double().abs().pow(norm_type).sum()
        if s.pp_size > 1:
            dist.all_reduce(local, group=s.pipe)
        total = local[0] ** (1.0 / norm_type)
    if error_if_nonfinite and not torch.isfinite(total):
        raise RuntimeError(f"smp.clip_grad_norm_: the total norm of order {norm_type} is {total.item()}")
    coef = float(max_norm) / (float(total) + 1e-6)
    if coef < 1.0:
        for g in grads:
            g.detach().mul_(coef)
    return total.float()
