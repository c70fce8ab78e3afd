"""Sharded data parallelism (config ``sharded_data_parallel_degree``), on torch's FSDP2.

With degree d > 1 the ranks of each RDP group are cut into groups of d
consecutive rdp ranks; each parameter is sharded over such a group, gathered
for the forward and the backward of the module that uses it and released
after, and its gradient is reduce-scattered. This is torch's
``fully_shard`` (FSDP2), applied by :func:`apply` once the partition is on
its device (runtime.py), over a DeviceMesh of the d ranks, or, when the RDP
group is larger, a 2-D (replicate, shard) mesh (HSDP: shards reduce-scattered
within a group of d, then all-reduced across the groups).

Units: each child module of the model (the items of a ModuleList or
ModuleDict, e.g. the transformer blocks, one by one) holding a parameter of
at least ``sdp_param_persistence_threshold`` elements and sharing none with
modules outside it (tied weights stay with the root) is one ``fully_shard``
unit; the root is the last unit, over what remains. Parameters smaller than
the threshold are not sharded at all (FSDP's ``ignored_params``): they stay
whole on every rank and the gradient reducer (grads.py) averages them, as
SageMaker's persistence threshold keeps them. The sharded parameters become
DTensors (the optimizer follows, runtime ``_replace_params``), marked
``_smp_sdp`` so that the reducer leaves them to FSDP; with tensor parallelism
the reducer completes FSDP's RDP average into the rule of grads.py.

The other keys: ``sdp_gradient_clipping`` is the gradient-norm bound that
``optimizer.step()`` applies when the step's gradients were not clipped with
``clip_master_grads`` (SageMaker clips by it whenever sharded data
parallelism is on; 0 turns it off). ``sdp_reduce_bucket_size``,
``sdp_max_live_parameters`` and ``sdp_hierarchical_allgather`` are accepted
as tuning only: FSDP2 reduces and gathers per unit, one unit ahead, and
shoal's collectives pick their algorithm by size and topology.

SageMaker does not combine sharded data parallelism with pipeline
parallelism (config.py refuses it; :func:`apply` checks again); it does with
tensor parallelism.
"""

from __future__ import annotations

from typing import List, Set

import torch
import torch.nn as nn

from ..mpcommon.errors import SMPConfigError


def degree(s) -> int:
    return int(s.cfg.sharded_data_parallel_degree)


def check(s) -> None:
    d = degree(s)
    if d > 1 and s.pp_size > 1:
        raise SMPConfigError(f"smp ({s.who()}): 'sharded_data_parallel_degree' ({d}) cannot be combined with "
                             f"pipeline parallelism ({s.pp_size} partitions)")
    if d > 1 and s.rdp_size % d:
        raise SMPConfigError(f"smp ({s.who()}): 'sharded_data_parallel_degree' ({d}) must divide the reduced "
                             f"data-parallel degree ({s.rdp_size})")


def mesh_for(s, device_type: str):
    """The DeviceMesh FSDP shards over: this tensor-parallel slice's RDP group as (replicate, shard)."""
    from torch.distributed.device_mesh import DeviceMesh
    d = degree(s)
    reps = s.rdp_size // d
    grid = torch.tensor([[[s.topo.rank_of(r * d + k, 0, t) for k in range(d)] for r in range(reps)]
                         for t in range(s.tp_size)])
    mesh = DeviceMesh(device_type, grid, mesh_dim_names=("tp", "replicate", "shard"))
    return mesh["replicate", "shard"] if reps > 1 else mesh["shard"]


def units(root: nn.Module, threshold: int) -> List[nn.Module]:
    """The child modules wrapped on their own (see the module docstring)."""
    named = list(root.named_parameters(remove_duplicate=False))
    out: List[nn.Module] = []

    def visit(mod: nn.Module, prefix: str) -> None:
        for name, child in mod.named_children():
            path = f"{prefix}{name}."
            if isinstance(child, (nn.ModuleList, nn.ModuleDict)):
                visit(child, path)
                continue
            inside = {id(p) for p in child.parameters()}
            outside = {id(p) for n, p in named if not n.startswith(path)}
            if not inside or inside & outside:
                continue
            if any(p.numel() >= threshold for p in child.parameters()):
                out.append(child)
    visit(root, "")
    return out


def apply(rt) -> None:
    """Shards the partition's parameters with FSDP2 (degree > 1); the runtime's and optimizers'
    parameters follow. Called on every rank, after the parameters are on the device."""
    s = rt.s
    if degree(s) <= 1:
        return
    check(s)
    from torch.distributed.fsdp import fully_shard
    threshold = int(s.cfg.sdp_param_persistence_threshold)
    mesh = mesh_for(s, rt.device.type)
    before = dict(rt.root.named_parameters(remove_duplicate=False))
    marks = {id(p): getattr(p, "_smp_split_dim", None) for p in before.values()
             if getattr(p, "_smp_distributed", False)}
    persistent: Set[nn.Parameter] = {p for p in before.values() if p.numel() < threshold}
    for m in units(rt.root, threshold):
        fully_shard(m, mesh=mesh, ignored_params=persistent)
    after = dict(rt.root.named_parameters(remove_duplicate=False))
    if any(p.numel() >= threshold and not hasattr(p, "placements") for p in after.values()):
        fully_shard(rt.root, mesh=mesh, ignored_params=persistent)
        after = dict(rt.root.named_parameters(remove_duplicate=False))
    replaced = {}
    for n, old in before.items():
        new = after[n]
        if new is not old and id(old) not in replaced:
            new._smp_sdp = True
            if id(old) in marks:
                new._smp_distributed, new._smp_split_dim = True, marks[id(old)]
            replaced[id(old)] = new
    if replaced:
        rt._replace_params(replaced)


def sharded_numel(params) -> int:
    """Elements this rank stores of `params` (a DTensor's local shard only)."""
    return sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in params)


def clip_value(s) -> float:
    """The bound optimizer.step() clips by (0: none): ``sdp_gradient_clipping`` under sharded data parallelism."""
    return float(s.cfg.sdp_gradient_clipping) if degree(s) > 1 else 0.0
