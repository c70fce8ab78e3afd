"""The partitioned model on this rank: placement, graphs, schedules, ownership.

Created on the first step (``ModelRuntime.create``), on every rank:

1. the placement: automatic (rank 0 measures and decides, then broadcasts the
   decision, or its error, to every rank) or manual (every rank computes it
   from the smp.partition tags); rank 0 prints it;
2. every parameter and buffer gets an owning partition; the DP group's
   dp_rank 0 broadcasts the local parameters and buffers to its replicas, rank
   0 broadcasts the buffers that every partition reads (glue buffers);
3. parameters owned by other partitions are freed (``.data`` becomes an empty
   tensor; their shapes stay known for tracing), and optimizer state for them
   is dropped;
4. the local parameters and buffers (and the buffers every partition reads)
   move to this rank's current device (:func:`partition_device`: the current
   accelerator's device, set with ``torch.cuda.set_device`` or
   ``torch.accelerator.set_device_index``, else the CPU). Whatever device the
   model was on before, the library places each partition (as SageMaker's does).

Afterwards each distinct way of calling the model (which arguments are
tensors, the values of the others, train/eval) gets its graph and segments
(graph.py, stages.py), and each (graph, microbatches, backward) its schedule.
"""

from __future__ import annotations

import copy
import inspect
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from . import graph as G
from . import placement as P
from . import sharded_dp
from ..mpcommon import schedule as S
from . import stages
from . import tracing
from ..mpcommon.errors import SMPTraceError
from .grads import GradReducer
from .tp import ops as tp_ops
from .state import _State


_PIECE_ATTRS = ("_smp_distributed", "_smp_split_dim")


def input_shapes(bound) -> tuple:
    """The shapes of a call's tensor arguments (the key of a size-specific graph)."""
    return tuple((k, tuple(v.shape)) for k, v in bound.items() if isinstance(v, torch.Tensor))


def partition_device() -> torch.device:
    """This rank's current device: the current accelerator's (CUDA, ROCm, a PrivateUse1 device), else the CPU."""
    if torch.accelerator.is_available():
        acc = torch.accelerator.current_accelerator()
        return torch.device(acc.type, torch.accelerator.current_device_index())
    return torch.device("cpu")


def to_device(v: Any, device: torch.device) -> Any:
    """`v` with every tensor in it on `device` (the partition's: inputs may come from a CPU data loader)."""
    if isinstance(v, torch.Tensor):
        return v if v.device == device else v.to(device)
    if isinstance(v, tuple) and hasattr(v, "_fields"):
        return type(v)(*(to_device(x, device) for x in v))
    if isinstance(v, (list, tuple)):
        return type(v)(to_device(x, device) for x in v)
    if isinstance(v, dict):
        return type(v)((k, to_device(x, device)) for k, x in v.items())
    return v


def _set_data(p: torch.Tensor, new: torch.Tensor) -> None:
    """Gives parameter `p` the data `new`, keeping the object (the optimizer and the user hold it);
    across device types whose tensors are not interchangeable, by swapping the two tensors."""
    if torch._has_compatible_shallow_copy_type(p, new):
        p.data = new
    else:
        torch.utils.swap_tensors(p, torch.nn.Parameter(new, requires_grad=p.requires_grad)
                                 if isinstance(p, torch.nn.Parameter) else new)


def _measurable(root: torch.nn.Module) -> torch.nn.Module:
    """The module to measure for the automatic partition: `root`, or, when its parameters are on the
    meta device (delayed initialisation), a copy of it whose parameters have memory and random values
    (rank 0 holds the whole model for the time of the measurement; the copy is dropped after it)."""
    if not any(p.is_meta for p in root.parameters()):
        return root
    probe = copy.deepcopy(root)
    made: Dict[int, torch.nn.Parameter] = {}
    with torch.no_grad():
        for m in probe.modules():
            for k, p in list(m._parameters.items()):
                if p is not None and p.is_meta:
                    if id(p) not in made:
                        made[id(p)] = torch.nn.Parameter(torch.empty(p.shape, dtype=p.dtype).normal_(0.0, 0.02),
                                                         requires_grad=p.requires_grad)
                    m._parameters[k] = made[id(p)]
    return probe


def broadcast_from(tensors: List[torch.Tensor], src: int, group) -> None:
    by_dtype: Dict[torch.dtype, List[torch.Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    for ts in by_dtype.values():
        flat = torch.cat([t.detach().reshape(-1) for t in ts]) if ts else None
        if flat is None or flat.numel() == 0:
            continue
        dist.broadcast(flat, src, group=group)
        off = 0
        with torch.no_grad():
            for t in ts:
                t.copy_(flat[off:off + t.numel()].view_as(t))
                off += t.numel()


class ModelRuntime:
    def __init__(self, model, pl: P.Placement, s: _State):
        self.model = model
        self.root: torch.nn.Module = model.module
        self.pl = pl
        self.s = s
        self.me = s.pp_rank
        self.device = partition_device()
        self.param_by_name = dict(self.root.named_parameters(remove_duplicate=False))
        self.buffer_by_name = dict(self.root.named_buffers(remove_duplicate=False))
        self.meta_state = {k: torch.empty(v.shape, dtype=v.dtype, device="meta")
                           for k, v in list(self.param_by_name.items()) + list(self.buffer_by_name.items())}
        seen = set()
        self.local_params: List[torch.nn.Parameter] = []
        for name, p in self.param_by_name.items():
            if pl.owner[name] == self.me and id(p) not in seen:
                seen.add(id(p))
                self.local_params.append(p)
        self.local_ids = seen
        self.forward_params = list(inspect.signature(self.root.forward).parameters)
        self.plans: Dict[Any, stages.Plan] = {}
        self.shape_keyed: set = set()  # plan keys whose graphs took branches on input sizes
        self.schedules: Dict[Any, S.Schedule] = {}
        self.reducer: Optional[GradReducer] = None

    # ------------------------------------------------------------- creation
    @classmethod
    def create(cls, model, call, s: _State) -> "ModelRuntime":
        cfg = s.cfg
        root = model.module
        bound = G.bind(root, call.args, call.kwargs)
        microbatch = _batch_of(call.args, call.kwargs)
        # measuring (rank 0 alone) and tracing (meta tensors) run the tensor-parallel modules without
        # their collectives (tp/ops.py)
        with tp_ops.local_only():
            pl = cls._place(root, call, bound, s)
        if s.rank == 0:
            print(P.describe(root, pl, microbatch), flush=True)
        rt = cls(model, pl, s)
        rt._distribute()
        sharded_dp.apply(rt)   # sharded_data_parallel_degree: FSDP2 units (the reducer skips their parameters)
        if s.dp_size > 1:    # after the parameters moved: its hooks and buckets live on them
            rt.reducer = GradReducer(rt.local_params, s.grad, model._smp.bucket_cap_mb * 2**20)
        return rt

    @staticmethod
    def _place(root, call, bound, s: _State) -> P.Placement:
        """The placement (step 1 of this module's docstring), the same on every rank."""
        cfg = s.cfg
        if cfg.partitions == 1:
            pl = P.Placement(1, "single", [""], {"": 0})
            P.assign_owners(root, pl, None, 0)
        elif cfg.auto_partition:
            msg: List[Any] = [None]
            error = None
            if s.rank == 0:
                try:
                    probe = _measurable(root)
                    at = next((p.device for p in probe.parameters()), torch.device("cpu"))
                    # measured where the model still is (the step moved the inputs to the rank's device)
                    costs = tracing.measure(probe, to_device(call.args, at), to_device(call.kwargs, at))
                    pl, g = P.auto_placement(root, costs, cfg.partitions, cfg.memory_weight, bound)
                    P.assign_owners(root, pl, g, cfg.default_partition)
                    msg = [("ok", pl)]
                except Exception as e:  # noqa: BLE001 - every rank must learn about it
                    error = e
                    msg = [("error", f"{type(e).__name__}: {e}")]
            dist.broadcast_object_list(msg, src=0, group=s.ctl)
            kind, value = msg[0]
            if kind == "error":
                if error is not None:
                    raise error
                raise SMPTraceError(f"smp: automatic partitioning failed on rank 0: {value}")
            pl = value
        else:
            pl = P.manual_placement(root, cfg.partitions, cfg.default_partition)
            g = None
            if pl.mode == "manual":
                try:
                    g = G.trace(root, pl.units, bound)
                except G.TraceFailure as e:
                    raise SMPTraceError(
                        f"smp: {e}; with manual partitioning, every module whose submodules are on "
                        f"different partitions must have a traceable forward") from e.cause
            P.assign_owners(root, pl, g, cfg.default_partition)
        return pl

    def _materialize(self) -> None:
        """Delayed initialisation: this partition's parameters, built on the meta device, get memory
        and their modules' own initialisation (``reset_parameters``, and a Hugging Face model's
        ``_init_weights``), children before their parents, as the model's constructor would have."""
        replaced = {}
        for p in self.local_params:
            if p.is_meta:
                replaced[id(p)] = torch.nn.Parameter(torch.empty(p.shape, dtype=p.dtype), requires_grad=p.requires_grad)
        if not replaced:
            return
        fresh = {id(v) for v in replaced.values()}
        self._replace_params(replaced)
        init_weights = getattr(self.root, "_init_weights", None)
        with torch.no_grad():
            for m in reversed(list(self.root.modules())):
                own = [id(p) for p in m.parameters()]
                if not own or not all(i in self.local_ids for i in own):
                    continue
                direct = [p for p in m._parameters.values() if p is not None]
                if any(id(p) in fresh for p in direct) and hasattr(m, "reset_parameters"):
                    m.reset_parameters()
                if init_weights is not None:
                    init_weights(m)

    def _distribute(self) -> None:
        s = self.s
        self._materialize()
        if s.dp_size > 1:   # replicas start equal: tensor-parallel pieces over the RDP group, the rest over DP
            local = list(self.local_params)
            if self.model._smp.broadcast_buffers:
                local += [b for n, b in self.buffer_by_name.items() if self.pl.owner[n] == self.me]
            pieces = [t for t in local if getattr(t, "_smp_distributed", False)]
            if pieces and s.rdp_size > 1:
                broadcast_from(pieces, s.rdp_ranks[0], s.rdp_grad)
            broadcast_from([t for t in local if not getattr(t, "_smp_distributed", False)], s.dp_ranks[0], s.grad)
        rep = [self.buffer_by_name[n] for n in self.pl.replicated]
        if rep and s.world_size > 1:
            broadcast_from(rep, 0, s.ctl)
        dev = self.device
        with torch.no_grad():
            replaced = {}
            for name, p in self.param_by_name.items():
                if id(p) in replaced:
                    continue
                local = id(p) in self.local_ids
                if p.device == dev and (local or not p.numel()):
                    continue
                if local:
                    new = p.detach().to(dev)
                else:                     # another partition's: freed, its shape stays in meta_state
                    new = torch.empty(0, dtype=p.dtype, device=dev)
                    p.grad = None
                if torch._has_compatible_shallow_copy_type(p, new):
                    p.data = new
                else:   # device types whose tensors are not interchangeable: a new Parameter
                    replaced[id(p)] = torch.nn.Parameter(new, requires_grad=p.requires_grad)
            if replaced:
                self._replace_params(replaced)
            keep = {n for n, o in self.pl.owner.items() if o == self.me} | set(self.pl.replicated)
            for mname, mod in self.root.named_modules(remove_duplicate=False):
                for bname, b in list(mod._buffers.items()):
                    full = f"{mname}.{bname}" if mname else bname
                    if b is not None and full in keep and b.device != dev:
                        mod._buffers[bname] = b.to(dev)
            self.buffer_by_name = dict(self.root.named_buffers(remove_duplicate=False))

    def _replace_params(self, replaced: Dict[int, torch.nn.Parameter]) -> None:
        """Puts the new Parameters in the modules, this runtime's indexes and every optimizer."""
        for mod in self.root.modules():
            for k, v in list(mod._parameters.items()):
                if v is not None and id(v) in replaced:
                    new = replaced[id(v)]
                    for attr in _PIECE_ATTRS:   # a tensor-parallel piece stays one
                        if hasattr(v, attr):
                            setattr(new, attr, getattr(v, attr))
                    mod._parameters[k] = new
        for opt in self.s.optimizers:
            opt._smp_replace(replaced)
        old_local = self.local_ids
        self.param_by_name = dict(self.root.named_parameters(remove_duplicate=False))
        self.local_params = [replaced.get(id(p), p) for p in self.local_params]
        self.local_ids = {id(p) for p in self.local_params}
        assert len(self.local_ids) == len(old_local)

    # ------------------------------------------------------------- plans
    def plan_for(self, call) -> Tuple[Any, stages.Plan]:
        bound = G.bind(self.root, call.args, call.kwargs)
        key = (tuple((k, "T") if not G.is_concrete(v) else (k, repr(v)) for k, v in bound.items()),
               tuple(m.training for m in self.root.modules()))
        base = key
        if base in self.shape_keyed:  # its graph took branches on sizes: one per input shape
            key = base + (input_shapes(bound),)
        plan = self.plans.get(key)
        if plan is None:
            if self.pl.mode == "single":
                plan = stages.single(self.pl.unit_part[""])
            else:
                try:
                    with tp_ops.local_only():
                        g = G.trace(self.root, self.pl.units, bound, self.meta_state)
                except G.TraceFailure as e:
                    raise SMPTraceError(f"smp: {e}") from e.cause
                plan = stages.build(g, self.pl, set(self.param_by_name))
                names = list(bound)  # the traced forward's parameters (graph._named_forward)
                plan.ph_name = {n: names[i] for i, n in enumerate(plan.placeholders)}
                if getattr(g, "_shoal_shape_specialized", False) and base not in self.shape_keyed:
                    self.shape_keyed.add(base)
                    key = base + (input_shapes(bound),)
            self.plans[key] = plan
        return key, plan

    def schedule_for(self, key, plan: stages.Plan, m: int, backward: bool) -> S.Schedule:
        cfg = self.s.cfg
        skey = (key, m, backward)
        sc = self.schedules.get(skey)
        if sc is None:
            parts, preds = [seg.part for seg in plan.segments], [seg.preds for seg in plan.segments]
            costs = self.segment_costs(plan)
            if costs is None:
                sc = S.build(parts, preds, cfg.partitions, m, backward=backward, policy=cfg.pipeline,
                             active=cfg.active_microbatches)
            else:
                sc = S.best(parts, preds, cfg.partitions, m, backward=backward, policy=cfg.pipeline,
                            active=cfg.active_microbatches, fwd_cost=costs[0], bwd_cost=costs[1])
            self.schedules[skey] = sc
        return sc

    def segment_costs(self, plan: stages.Plan) -> Optional[Tuple[List[float], List[float]]]:
        """Each segment's forward and backward time per microbatch, from the units the
        automatic partition measured (None without measurements: manual placement)."""
        if not self.pl.unit_time or plan.graph is None:
            return None
        fwd, bwd = [], []
        for seg in plan.segments:
            calls = [self.pl.unit_time.get(n.target, (0.0, 0.0)) for n in seg.nodes if n.op == "call_module"]
            fwd.append(sum(c[0] for c in calls))
            bwd.append(sum(c[1] for c in calls))
        floor = 1e-3 * max(fwd + bwd + [1e-9])   # glue-only segments: small, not free
        return [max(f, floor) for f in fwd], [max(b, floor) for b in bwd]

    # ------------------------------------------------------------- parameters of segments
    def segment_params(self, plan: stages.Plan, seg: stages.Segment) -> List[torch.nn.Parameter]:
        if plan.graph is None:
            return list(self.local_params)
        out, seen = [], set()
        for n in reversed(seg.nodes):
            if n.op == "call_module":
                ps = list(self.root.get_submodule(n.target).parameters())
            elif n.op == "get_attr" and n.target in self.param_by_name:
                ps = [self.param_by_name[n.target]]
            else:
                continue
            for p in reversed(ps):
                if id(p) in self.local_ids and id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        return out

    def final_groups(self, plan: stages.Plan, sched: S.Schedule, m: int) -> Dict[int, List[torch.nn.Parameter]]:
        """Per local segment: the local parameters whose gradient is final after B(m-1, segment)."""
        tasks = sched.tasks_of(self.me)
        pos = {t.seg: i for i, t in enumerate(tasks) if t.kind == "B" and t.mb == m - 1}
        final: Dict[int, int] = {}
        params: Dict[int, torch.nn.Parameter] = {}
        for seg in plan.segments_of(self.me):
            for p in self.segment_params(plan, seg):
                params[id(p)] = p
                if id(p) not in final or pos.get(seg.index, -1) > pos.get(final[id(p)], -1):
                    final[id(p)] = seg.index
        groups: Dict[int, List[torch.nn.Parameter]] = {}
        for pid, sidx in final.items():
            groups.setdefault(sidx, []).append(params[pid])
        return dict(sorted(groups.items(), key=lambda kv: pos.get(kv[0], 0)))


def _batch_of(args, kwargs) -> Optional[int]:
    for v in list(args) + list(kwargs.values()):
        if isinstance(v, torch.Tensor) and v.dim() > 0:
            return v.size(0)
    return None

