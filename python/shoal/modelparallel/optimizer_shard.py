"""Optimizer-state sharding (config ``shard_optimizer_state``), ZeRO stage 1.

The parameters a group of data-parallel ranks holds alike (the DP group for
replicated parameters, the RDP group for tensor-parallel pieces) are laid out
in the gradient reducer's buckets (grads.py); each bucket, flattened and
padded to a multiple of the group's size n, is cut into n contiguous slices
and rank k of the group owns slice k of every bucket. Per step:

1. the reducer reduce-scatters each bucket: rank k receives the averaged
   gradient of its slice (``_Bucket.shard``);
2. :class:`ShardedState` turns the slice into gradients of its *masters*: one
   flat tensor per parameter piece that falls in the slice, a float32 copy
   with fp16/bf16 (gradients divided by the loss scale), otherwise a view of
   the parameter's own elements (no second copy of the weights); an
   inner optimizer of the user's class, with the user's parameter groups and
   hyperparameters (synchronised from the outer groups at every step, so LR
   schedulers work), steps only the masters; the fp16 overflow is agreed by
   every rank and skips the step everywhere;
3. each rank writes its updated slice into the bucket and the bucket is
   all-gathered over its group, back into the parameters.

Optimizer state per rank is therefore ~1/n of the unsharded one. The inner
optimizer runs on flat slices, so this is exact for elementwise optimizers
(SGD with momentum, Adam, AdamW, Adagrad, RMSprop ...); one whose update
depends on a parameter's shape or whole norm (LAMB, Adafactor) would see
pieces. A parameter that received no gradient on any rank is stepped with a
zero gradient (the unsharded optimizer skips it).

Saving: :meth:`ShardedState.shard` is this rank's state (masters, the inner
optimizer's state, the layout it belongs to); ``gather_if_shard`` gathers
every shard of the RDP group to its rdp rank 0 (``_smp_shards``, indexed by
rdp_rank), which is what a partial checkpoint written by rdp rank 0 needs.
:meth:`ShardedState.load` takes either form and picks this rank's shard; the
layout must match (same model, degrees and bucket size).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List

import torch
import torch.distributed as dist

from ..mpcommon.errors import SMPValidationError
from .clip import clip_grads_


@dataclasses.dataclass
class _Piece:
    bucket: int
    pos: int            # the parameter's position in the (outer) optimizer
    group: int          # its outer parameter group
    start: int          # first owned element of the flattened parameter
    at: int             # where that element sits in the bucket's shard
    master: torch.nn.Parameter


def base_class(opt: torch.optim.Optimizer) -> type:
    """The user's optimizer class under smp's subclass (optimizer.py)."""
    return type(opt).__bases__[-1]


def _make_inner(cls: type, groups: List[Dict[str, Any]], defaults: Dict[str, Any]) -> torch.optim.Optimizer:
    try:
        return cls(groups, **defaults)
    except TypeError:   # a class whose defaults are not all constructor arguments
        inner = cls.__new__(cls)
        torch.optim.Optimizer.__init__(inner, groups, dict(defaults))
        return inner


class ShardedState:
    def __init__(self, opt, reducer, s):
        self.opt, self.reducer, self.s = opt, reducer, s
        self.buckets = reducer.buckets
        self.half = opt._smp_half
        self.consumed = -1
        pos_of = {id(p): i for i, p in enumerate(opt._smp_params)}
        group_of = [gi for gi, g in enumerate(opt.param_groups) for _ in g["params"]]
        self.pieces: List[_Piece] = []
        layout = []
        for bi, b in enumerate(self.buckets):
            chunk = b.shard.numel()
            lo, hi = b.route.rank * chunk, (b.route.rank + 1) * chunk
            layout.append((tuple(pos_of.get(id(p), -1) for p in b.params), b.flat.numel(), b.route.size,
                           b.route.rank, b.route.distributed))
            for p, off in zip(b.params, b.offsets):
                a, c = max(off, lo), min(off + p.numel(), hi)
                if a >= c or id(p) not in pos_of:
                    continue
                if self.half is None and p.is_contiguous():   # the parameter's own elements: no copy
                    m = p.detach().view(-1)[a - off:c - off]
                else:
                    m = p.detach().reshape(-1)[a - off:c - off].to(torch.float32).clone()
                i = pos_of[id(p)]
                self.pieces.append(_Piece(bi, i, group_of[i], a - off, a - lo,
                                          torch.nn.Parameter(m, requires_grad=p.requires_grad)))
        self.layout = tuple(layout)
        self.inner_groups = sorted({pc.group for pc in self.pieces})
        groups = [{**{k: v for k, v in opt.param_groups[gi].items() if k != "params"},
                   "params": [pc.master for pc in self.pieces if pc.group == gi]} for gi in self.inner_groups]
        self.inner = _make_inner(base_class(opt), groups, opt.defaults) if groups else None
        opt.state.clear()       # the outer optimizer keeps no state: the shards hold it
        self.overflow = False
        self.prepared = False

    # ------------------------------------------------------------- a step
    def prepare(self) -> None:
        """Master gradients from this step's reduced slices (unscaled); the overflow agreed by every rank."""
        if self.prepared:
            return
        fresh = self.reducer.reductions != self.consumed
        inv = 1.0 / self.opt.loss_scale
        dev = self.reducer.device
        bad = torch.zeros(1, dtype=torch.float32, device=dev)
        for pc in self.pieces:
            if not fresh:
                pc.master.grad = None
                continue
            g = self.buckets[pc.bucket].shard[pc.at:pc.at + pc.master.numel()].to(pc.master.dtype)
            pc.master.grad = g * inv if inv != 1.0 else g.clone()
            if self.half is not None:
                bad += (~torch.isfinite(pc.master.grad)).any().float()
        if self.half is not None and self.s.world_size > 1:
            dist.all_reduce(bad, op=dist.ReduceOp.MAX, group=self.s.ctl)
        self.overflow = bool(bad.item() > 0)
        self.consumed = self.reducer.reductions
        self.prepared = True

    def clip(self, max_norm: float, norm_type: float) -> float:
        """Clips the master gradients by the norm of the whole model: every element of every
        gradient is owned by exactly one rank of the world, so the owned parts sum over it."""
        self.prepare()
        if self.overflow:
            return -1.0
        grads = [pc.master.grad for pc in self.pieces if pc.master.grad is not None]
        return float(clip_grads_(grads, max_norm, norm_type, s=self.s, group=self.s.ctl))

    def step(self, closure=None):
        self.prepare()
        self.prepared = False
        scaler = self.opt._smp_scaler
        if self.overflow:
            scaler.update(True)
            self._drop_grads()
            return None
        out = None
        if self.inner is not None:
            for ig, gi in zip(self.inner.param_groups, self.inner_groups):
                ig.update({k: v for k, v in self.opt.param_groups[gi].items() if k != "params"})
            out = self.inner.step(closure) if closure is not None else self.inner.step()
        self._drop_grads()
        self.gather()
        scaler.update(False)
        return out

    def _drop_grads(self) -> None:
        for pc in self.pieces:
            pc.master.grad = None

    def gather(self) -> None:
        """Every rank's updated slices, all-gathered over each bucket's group, into the parameters."""
        works = []
        with torch.no_grad():
            for bi, b in enumerate(self.buckets):
                chunk = b.shard.numel()
                lo, hi = b.route.rank * chunk, (b.route.rank + 1) * chunk
                for p, off in zip(b.params, b.offsets):     # what this optimizer does not step stays
                    a, c = max(off, lo), min(off + p.numel(), hi)
                    if a < c:
                        b.shard[a - lo:c - lo].copy_(p.detach().reshape(-1)[a - off:c - off])
                for pc in self.pieces:
                    if pc.bucket == bi:
                        b.shard[pc.at:pc.at + pc.master.numel()].copy_(pc.master.detach())
                works.append(dist.all_gather_single(b.flat, b.shard, group=b.route.group, async_op=True))
            for b, w in zip(self.buckets, works):
                w.wait()
                for p, off in zip(b.params, b.offsets):
                    p.copy_(b.flat[off:off + p.numel()].view_as(p))

    # ------------------------------------------------------------- state
    def state_numel(self) -> int:
        """Elements of this rank's optimizer state tensors (its shard of the state)."""
        if self.inner is None:
            return 0
        return sum(v.numel() for st in self.inner.state.values() for v in st.values()
                   if isinstance(v, torch.Tensor) and v.dim() > 0)

    def shard(self) -> Dict[str, Any]:
        inner = self.inner.state_dict() if self.inner is not None else {"state": {}}
        return {"layout": self.layout, "rank": (self.s.tp_rank, self.s.rdp_rank),
                "masters": [pc.master.detach().cpu().clone() for pc in self.pieces],
                "state": inner["state"]}

    def local_state_dict(self, gather_if_shard: bool) -> Dict[str, Any]:
        sd = torch.optim.Optimizer.state_dict(self.opt)     # the hyperparameters (the state is empty)
        mine = self.shard()
        if gather_if_shard and self.s.rdp_size > 1:
            every: List[Any] = [None] * self.s.rdp_size
            dist.all_gather_object(every, mine, group=self.s.rdp_grad)
            if self.s.rdp_rank == 0:
                sd["_smp_shards"] = every
        sd["_smp_shard"] = mine
        if self.half == torch.float16:
            sd["_smp_fp16"] = {"loss_scaler": self.opt._smp_scaler.state_dict(), "masters": {}}
        sd["_smp_is_partial"] = True
        return sd

    def load(self, sd: Dict[str, Any]) -> None:
        shards = sd.get("_smp_shards")
        shard = shards[self.s.rdp_rank] if shards else sd.get("_smp_shard")
        if shard is None:
            raise SMPValidationError(
                "smp.DistributedOptimizer.load_state_dict: with shard_optimizer_state the state must be one "
                "saved by local_state_dict() (a sharded optimizer state); this one has no shard")
        if tuple(shard["layout"]) != self.layout:
            raise SMPValidationError(
                f"smp.DistributedOptimizer.load_state_dict ({self.s.who()}): the optimizer-state shard was saved "
                f"with another layout (model, data-parallel degrees or bucket size differ, or it is another "
                f"rank's); load it on the same configuration")
        with torch.no_grad():
            for pc, m in zip(self.pieces, shard["masters"]):
                pc.master.copy_(m)
        for g, saved in zip(self.opt.param_groups, sd.get("param_groups", [])):
            g.update({k: v for k, v in saved.items() if k != "params"})
        if self.inner is not None:
            groups = self.inner.state_dict()["param_groups"]
            for ig, gi in zip(groups, self.inner_groups):
                ig.update({k: v for k, v in self.opt.param_groups[gi].items() if k != "params"})
            self.inner.load_state_dict({"state": shard["state"], "param_groups": groups})
        fp16 = sd.get("_smp_fp16")
        if fp16 is not None and self.half == torch.float16:
            self.opt._smp_scaler.load_state_dict(fp16["loss_scaler"])
