"""Gradient-norm clipping over every partition's gradients.

Each rank holds the gradients of its own partition only (the others' are
None), so ``torch.nn.utils.clip_grad_norm_`` would see a part of the model.
:func:`clip_grad_norm_` sums the local ``|g|^p`` (or takes the local maximum
for the infinity norm) and reduces it over the model replica first; every rank
of the replica must call it. Replicas of a partition hold the same averaged
gradients after a step, so the result is the norm of the whole model.

Pieces of the model held by several ranks of a replica are summed over them
as well: tensor-parallel pieces (``p._smp_distributed``: over the TP group,
``tp_grads``), and FSDP's shards (DTensor gradients of sharded data
parallelism: over the mesh dimensions they are sharded on). Optimizer-state
sharding passes the owned slices, which cover the model once over the whole
world (``group``).
"""

from __future__ import annotations

import math
from typing import Dict, Iterable, List, Sequence, Union

import torch
import torch.distributed as dist

from .state import require


def clip_grad_norm_(parameters: Union[torch.Tensor, Iterable[torch.Tensor]], max_norm: float,
                    norm_type: float = 2.0, error_if_nonfinite: bool = False) -> torch.Tensor:
    s = require()
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    params = [p for p in parameters if p.grad is not None]
    tp = [p.grad for p in params if getattr(p, "_smp_distributed", False)]
    grads = [p.grad for p in params if not getattr(p, "_smp_distributed", False)]
    return clip_grads_(grads, max_norm, norm_type, error_if_nonfinite, s, tp_grads=tp)


def _shard_groups(g: torch.Tensor) -> List:
    """The groups over which a DTensor gradient is sharded (none for a plain tensor)."""
    if not hasattr(g, "placements"):
        return []
    return [g.device_mesh.get_group(i) for i, pl in enumerate(g.placements) if pl.is_shard()]


def clip_grads_(grads, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                s=None, group=None, tp_grads: Sequence[torch.Tensor] = ()) -> torch.Tensor:
    """Clips `grads` and `tp_grads` (this rank's share of the model's gradients; `tp_grads`:
    tensor-parallel pieces) by the norm over every partition. `group` replaces the pipeline as
    the ranks whose shares add up to the model."""
    s = s or require()
    every = list(grads) + list(tp_grads)
    dev = every[0].device if every else torch.device("cpu")
    norm_type = float(norm_type)
    inf = norm_type == math.inf
    op = dist.ReduceOp.MAX if inf else dist.ReduceOp.SUM
    # partial results keyed by the groups they must still be reduced over (besides the replica's)
    # (the same keys in the same order on every rank of a group: its reductions must pair up)
    parts: Dict[tuple, torch.Tensor] = {(): torch.zeros(1, dtype=torch.float64, device=dev)}
    if s.tp_size > 1:
        parts[(s.tpg,)] = torch.zeros(1, dtype=torch.float64, device=dev)
    n_tp = len(grads)
    for k, g in enumerate(every):
        groups = tuple(_shard_groups(g))
        if k >= n_tp and s.tp_size > 1:
            groups += (s.tpg,)
        local = g.to_local() if hasattr(g, "to_local") else g
        acc = parts.setdefault(groups, torch.zeros(1, dtype=torch.float64, device=dev))
        if local.numel() == 0:
            continue
        if inf:
            torch.maximum(acc, local.detach().abs().max().double().reshape(1), out=acc)
        else:
            acc += local.detach().double().abs().pow(norm_type).sum()
    total = torch.zeros(1, dtype=torch.float64, device=dev)
    for groups, acc in parts.items():
        for grp in groups:
            dist.all_reduce(acc, op=op, group=grp)
        total = torch.maximum(total, acc) if inf else total + acc
    if group is not None:
        if s.world_size > 1:
            dist.all_reduce(total, op=op, group=group)
    elif s.pp_size > 1:
        dist.all_reduce(total, op=op, group=s.pipe)
    total = total[0] if inf else total[0] ** (1.0 / norm_type)
    if error_if_nonfinite and not torch.isfinite(total):
        raise RuntimeError(f"smp.clip_grad_norm_: the total norm of order {norm_type} is {total.item()}")
    coef = float(max_norm) / (float(total) + 1e-6)
    if coef < 1.0:
        for g in every:
            g.detach().mul_(coef)
    return total.float()
