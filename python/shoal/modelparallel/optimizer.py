"""``smp.DistributedOptimizer``: the user's optimizer, partition-aware, with fp16/bf16 master weights.

As in SageMaker, the wrapper returns the optimizer object itself, with its
class replaced by a subclass that adds ``local_state_dict`` and overrides
``state_dict`` / ``load_state_dict`` (so ``isinstance`` checks and LR
schedulers keep working). The optimizer is built over the whole model on
every rank; only the local partition's parameters ever get gradients, so
``step()`` updates only them, and after partitioning the state of the others
is dropped.

Half precision (config ``fp16`` or ``bf16``): the model's parameters are
float16/bfloat16; at partitioning each local one gets a float32 *master*
copy, which takes its place in the optimizer's parameter groups, so the
optimizer (and its state) works in float32. ``step()`` turns the half
gradients into master gradients (divided by the loss scale), agrees with
every rank whether any gradient overflowed (``.overflow``; then every rank
skips the step together), steps the masters and rounds them back into the
model. With ``fp16`` the loss is scaled (loss_scale.py:
``static_loss_scale``, or ``dynamic_loss_scale`` with ``dynamic_loss_args``);
with ``bf16`` it is not. Without half precision the loss-scale arguments are
accepted and ignored, as SageMaker's library does.

``clip_master_grads(max_norm, norm_type=2)`` clips the gradients the next
``step()`` applies (the masters', or the parameters' without half precision)
by their norm over every partition, and returns that norm (-1 when the step
overflowed).

Optimizer state dicts number parameters by their position in the optimizer,
the same on every rank whatever the partitioning, so partial states of any
partitioning merge into a full one (checkpoint.py uses that to resume with a
different number of partitions); the masters and the loss scale travel in
``state_dict()["_smp_fp16"]``.

With ``shard_optimizer_state`` (and more than one data-parallel rank) the
state, and the fp32 masters, are sharded over the data-parallel ranks
(optimizer_shard.py): the optimizer object keeps the parameter groups and
hyperparameters, an inner optimizer of the same class steps this rank's
slices; ``local_state_dict()`` is the shard (gathered to rdp rank 0 with
``gather_if_shard``), and ``state_dict()`` (the full state) is refused.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist

from ..mpcommon.errors import SMPValidationError
from .clip import clip_grads_
from .loss_scale import LossScaler
from .optimizer_shard import ShardedState
from .sharded_dp import clip_value
from .state import require


def _params(opt: torch.optim.Optimizer) -> List[torch.nn.Parameter]:
    return [p for g in opt.param_groups for p in g["params"]]


class _DistributedMixin:
    # set by DistributedOptimizer(): the model's parameters by position, the half dtype (or None), the scaler
    _smp_params: List[torch.nn.Parameter]
    _smp_half: Optional[torch.dtype]
    _smp_scaler: LossScaler

    @property
    def optimizer(self):
        """SageMaker's FP16 wrapper exposes the wrapped optimizer; here it is this very object."""
        return self

    @property
    def loss_scale(self) -> float:
        return self._smp_scaler.scale if self._smp_half == torch.float16 else 1.0

    def _smp_local_positions(self) -> set:
        s = require()
        rt = s.model._smp.rt if s.model is not None else None
        if rt is None:
            return set(range(len(self._smp_params)))
        return {i for i, p in enumerate(self._smp_params) if id(p) in rt.local_ids}

    def _smp_sharding(self) -> bool:
        s = require()     # (under sharded data parallelism FSDP's DTensor parameters shard the state already)
        return bool(s.cfg.shard_optimizer_state) and s.dp_size > 1 and s.cfg.sharded_data_parallel_degree == 1

    def _smp_sharded(self) -> Optional[ShardedState]:
        """The sharded state, made once the model is partitioned (it lays out the reducer's buckets)."""
        if not self._smp_sharding():
            return None
        s = require()
        rt = s.model._smp.rt if s.model is not None else None
        reducer = rt.reducer if rt is not None else None
        if reducer is None or not reducer.sharded:
            return None
        shard = getattr(self, "_smp_shard", None)
        if shard is None or shard.reducer is not reducer:
            shard = self._smp_shard = ShardedState(self, reducer, s)
            pending = getattr(self, "_smp_pending_shard", None)
            if pending is not None:
                shard.load(pending)
                self._smp_pending_shard = None
        return shard

    def _smp_prune(self) -> None:
        """After partitioning: drops the state of parameters this rank does not own, moves the rest
        to the partition's device, and (half precision) makes the local master weights."""
        local = self._smp_local_positions()
        by_pos = _params(self)
        for i, p in enumerate(by_pos):
            if i not in local:
                self.state.pop(p, None)
            elif p in self.state:
                for k, v in self.state[p].items():
                    if isinstance(v, torch.Tensor) and v.dim() > 0 and v.device != p.device:
                        self.state[p][k] = v.to(p.device)
        if self._smp_sharding():
            self._smp_sharded()
        elif self._smp_half is not None:
            self._smp_make_masters(local)

    def _smp_replace(self, replaced: Dict[int, torch.nn.Parameter]) -> None:
        """The model's parameters were replaced at partitioning (moved to a device whose tensors
        cannot take the old ones' place): the optimizer follows."""
        for g in self.param_groups:
            for k, p in enumerate(g["params"]):
                if id(p) in replaced:
                    new = replaced[id(p)]
                    if p in self.state:
                        self.state[new] = self.state.pop(p)
                    g["params"][k] = new
        self._smp_params = [replaced.get(id(p), p) for p in self._smp_params]

    def _smp_make_masters(self, local: set) -> None:
        slots = [(g, k) for g in self.param_groups for k in range(len(g["params"]))]
        pending = getattr(self, "_smp_pending_masters", {}) or {}
        for i in sorted(local):
            g, k = slots[i]
            model_p = self._smp_params[i]
            if g["params"][k] is not model_p or not model_p.is_floating_point():
                continue                      # made already, or not a float parameter
            src = pending.get(i)
            master = (src if src is not None else model_p.detach()).to(model_p.device, torch.float32).clone()
            master = torch.nn.Parameter(master, requires_grad=model_p.requires_grad)
            if src is not None:
                model_p.data.copy_(master.data)
            self.state.pop(model_p, None)
            g["params"][k] = master
        self._smp_pending_masters = {}

    def _smp_pairs(self):
        """(model parameter, master) for the local half parameters."""
        by_pos = _params(self)
        return [(p, m) for p, m in zip(self._smp_params, by_pos) if m is not p]

    def _smp_prepare(self) -> None:
        """Master gradients from the model's (unscaled), and the overflow agreed by every rank."""
        if getattr(self, "_smp_prepared", False):
            return
        s = require()
        inv = 1.0 / self.loss_scale
        pairs = self._smp_pairs()
        dev = pairs[0][0].device if pairs else torch.device("cpu")
        bad = torch.zeros(1, dtype=torch.float32, device=dev)
        for p, m in pairs:
            if p.grad is None:
                m.grad = None
                continue
            g = p.grad.detach().to(torch.float32)
            m.grad = g * inv if inv != 1.0 else g.clone()
            local = m.grad.to_local() if hasattr(m.grad, "to_local") else m.grad    # FSDP's shards
            bad += (~torch.isfinite(local)).any().float()
        if s.world_size > 1:
            dist.all_reduce(bad, op=dist.ReduceOp.MAX, group=s.ctl)
        self.overflow = bool(bad.item() > 0)
        self._smp_prepared = True

    def clip_master_grads(self, max_norm: float, norm_type: float = 2.0) -> float:
        """Clips the gradients the next step applies by their norm over every partition; returns
        the norm (-1.0 when the step overflowed and will be skipped)."""
        self._smp_clipped = True
        shard = self._smp_sharded()
        if shard is not None:
            return shard.clip(max_norm, norm_type)
        if self._smp_half is None:
            local = self._smp_local_positions()
            pairs = [(p, p) for i, p in enumerate(self._smp_params) if i in local]
        else:
            self._smp_prepare()
            if self.overflow:
                return -1.0
            pairs = self._smp_pairs()
        pairs = [(p, m) for p, m in pairs if m.grad is not None]
        grads = [m.grad for p, m in pairs if not getattr(p, "_smp_distributed", False)]
        tp = [m.grad for p, m in pairs if getattr(p, "_smp_distributed", False)]
        return float(clip_grads_(grads, max_norm, norm_type, tp_grads=tp))

    def step(self, *args, **kwargs):
        s = require()
        s.monitor.check()
        bound = clip_value(s)          # sharded data parallelism: sdp_gradient_clipping
        if bound > 0 and not getattr(self, "_smp_clipped", False):
            self.clip_master_grads(bound)
        self._smp_clipped = False
        shard = self._smp_sharded()
        if shard is not None:
            out = shard.step(*args, **kwargs)
            self.overflow = shard.overflow
            return out
        if self._smp_half is None:
            self.overflow = False
            return super().step(*args, **kwargs)
        self._smp_prepare()
        self._smp_prepared = False
        if self.overflow:
            self._smp_scaler.update(True)
            return None
        out = super().step(*args, **kwargs)
        with torch.no_grad():
            for p, m in self._smp_pairs():
                p.data.copy_(m.data)
        self._smp_scaler.update(False)
        return out

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none=set_to_none)
        if self._smp_half is not None:
            for p, _ in self._smp_pairs():
                if set_to_none:
                    p.grad = None
                elif p.grad is not None:
                    p.grad.zero_()
        self._smp_prepared = False

    # ------------------------------------------------------------- state
    def local_state_dict(self, gather_if_shard: bool = True) -> Dict[str, Any]:
        """This partition's optimizer state; with shard_optimizer_state this rank's shard, and with
        ``gather_if_shard`` (a collective of the RDP group) every shard of the RDP group on its rdp
        rank 0 (``_smp_shards``)."""
        if self._smp_sharding():
            shard = self._smp_sharded()
            if shard is None:
                raise SMPValidationError("smp.DistributedOptimizer.local_state_dict: with shard_optimizer_state "
                                         "the state exists once the model is partitioned (after the first step)")
            return shard.local_state_dict(gather_if_shard)
        sd = super().state_dict()
        local = self._smp_local_positions()
        sd["state"] = {k: v for k, v in sd["state"].items() if k in local}
        if self._smp_half is not None:
            masters = {i: m.detach() for i, (p, m) in enumerate(zip(self._smp_params, _params(self)))
                       if m is not p and i in local}
            sd["_smp_fp16"] = {"loss_scaler": self._smp_scaler.state_dict(), "masters": masters}
        sd["_smp_is_partial"] = True
        return sd

    def state_dict(self) -> Dict[str, Any]:
        s = require()
        if self._smp_sharding():
            raise SMPValidationError(
                "smp.DistributedOptimizer.state_dict: saving the full optimizer state is not supported with "
                "shard_optimizer_state; save a partial one (local_state_dict(), or smp.save_checkpoint with "
                "partial=True)")
        rt = s.model._smp.rt if s.model is not None else None
        local = self.local_state_dict()
        local.pop("_smp_is_partial")
        if rt is None or s.pp_size == 1:
            return local
        parts: List[Any] = [None] * s.pp_size
        fp16 = local.get("_smp_fp16")
        mine = {"state": local["state"], "masters": {k: v.cpu() for k, v in fp16["masters"].items()} if fp16 else {}}
        dist.all_gather_object(parts, mine, group=s.pipe)
        merged, masters = {}, {}
        for p in parts:
            merged.update(p["state"])
            masters.update(p["masters"])
        out = {"state": dict(sorted(merged.items())), "param_groups": local["param_groups"]}
        if fp16 is not None:
            out["_smp_fp16"] = {"loss_scaler": fp16["loss_scaler"], "masters": dict(sorted(masters.items()))}
        return out

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        if self._smp_sharding():
            shard = self._smp_sharded()
            if shard is None:
                self._smp_pending_shard = state_dict      # loaded once the model is partitioned
            else:
                shard.load(state_dict)
            return
        sd = dict(state_dict)
        sd.pop("_smp_is_partial", None)
        fp16 = sd.pop("_smp_fp16", None)
        super().load_state_dict(sd)
        if fp16 is not None and self._smp_half is not None:
            self._smp_scaler.load_state_dict(fp16["loss_scaler"])
            made = {i for i, (p, m) in enumerate(zip(self._smp_params, _params(self))) if m is not p}
            with torch.no_grad():
                for i, v in fp16["masters"].items():
                    if i in made:
                        _params(self)[i].data.copy_(v)
                        self._smp_params[i].data.copy_(v)
            self._smp_pending_masters = {i: v for i, v in fp16["masters"].items() if i not in made}
        s = require()
        if s.model is not None and s.model.partitioned:
            self._smp_prune()


def DistributedOptimizer(optimizer: torch.optim.Optimizer, static_loss_scale: Optional[float] = 1.0,
                         dynamic_loss_scale: bool = False, **dynamic_loss_args):
    """Makes `optimizer` partition-aware (and, with fp16/bf16, a master-weight optimizer; see the
    module docstring) and returns it. ``dynamic_loss_args`` may come as keyword arguments or as one
    dict (``dynamic_loss_args={"scale_window": 1000}``), as SageMaker's examples pass it."""
    s = require()
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"smp.DistributedOptimizer: expected a torch.optim.Optimizer, got "
                        f"{type(optimizer).__name__}")
    if set(dynamic_loss_args) == {"dynamic_loss_args"} and isinstance(dynamic_loss_args["dynamic_loss_args"],
                                                                         dict):
        dynamic_loss_args = dict(dynamic_loss_args["dynamic_loss_args"])
    half = {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(s.cfg.half_dtype)
    if not isinstance(optimizer, _DistributedMixin):
        optimizer._smp_params = _params(optimizer)
        cls = optimizer.__class__
        optimizer.__class__ = type(f"Distributed{cls.__name__}", (_DistributedMixin, cls), {})
    optimizer._smp_half = half
    if half == torch.float16:
        optimizer._smp_scaler = LossScaler(1.0 if static_loss_scale is None else static_loss_scale,
                                           dynamic_loss_scale, **dynamic_loss_args)
    else:   # SageMaker: the loss-scale arguments are "effective only for FP16 training"
        optimizer._smp_scaler = LossScaler()
    optimizer.overflow = False
    optimizer._smp_prepared = False
    if optimizer not in s.optimizers:
        s.optimizers.append(optimizer)
    if s.model is not None and s.model.partitioned:
        optimizer._smp_prune()
    return optimizer
