"""``smp.DistributedModel``: the wrapped model.

Every rank constructs the whole model and wraps it. The model is partitioned
on the first call of a step function (runtime.py); afterwards each rank keeps
only its partition's parameters (the others are freed), runs its part of each
step (pipeline.py) and, with ``ddp``, averages its gradients over its DP group.

Calling the model and ``model.backward`` are only allowed inside an
``@smp.step`` function. ``state_dict()`` gathers the whole model from the
ranks of the replica (a collective over the replica: the pipeline's
partitions, and the tensor-parallel pieces joined into whole tensors) keyed as
the wrapped module; ``local_state_dict()`` is this rank's part (its partition,
its tensor-parallel pieces), marked ``_smp_is_partial``. Wrapping replaces the
enabled supported modules by their tensor-parallel versions
(tensor_parallel.py); ``load_state_dict`` takes a full state dict keyed either
way (as the wrapped module, or as the model before the replacement).
"""

from __future__ import annotations

import collections
import contextlib
import inspect
from typing import Any, Callable, Dict, Iterator, List, Tuple

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, distribute_tensor

from . import clip
from . import tensor_parallel as TP
from .checkpoint import load_optimizer_state
from ..mpcommon.errors import SMPUnsupportedError, SMPValidationError
from .pipeline import Executor
from .runtime import ModelRuntime, broadcast_from, to_device
from .state import require


class _Options:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class _Handle:
    def __init__(self, hooks: list, hook):
        self.hooks, self.hook = hooks, hook

    def remove(self):
        if self.hook in self.hooks:
            self.hooks.remove(self.hook)


class DistributedModel(torch.nn.Module):
    """Wraps `module` for pipeline (and hybrid data) parallelism. Accepts the
    SageMaker library's keyword arguments; see docs/modelparallel.md for which
    ones matter here."""

    def __init__(self, module: torch.nn.Module, trace_device: str = "cpu", trace_execution_times: bool = False,
                 overlapping_allreduce: bool = True, backward_passes_per_step: int = 1,
                 average_grads_across_microbatches: bool = True, bucket_cap_mb: float = 25,
                 trace_memory_usage: bool = False, broadcast_buffers: bool = True,
                 gradient_as_bucket_view: bool = False, **unsupported):
        s = require()
        if unsupported:
            raise SMPUnsupportedError(f"smp.DistributedModel: unsupported argument(s) "
                                      f"{', '.join(sorted(unsupported))}")
        if isinstance(backward_passes_per_step, bool) or not isinstance(backward_passes_per_step, int) \
                or backward_passes_per_step < 1:
            raise SMPValidationError(f"smp.DistributedModel: backward_passes_per_step must be an int >= 1, got "
                                     f"{backward_passes_per_step!r}")
        if not isinstance(module, torch.nn.Module):
            raise SMPValidationError(f"smp.DistributedModel: expected a torch.nn.Module, got "
                                     f"{type(module).__name__}")
        if isinstance(module, DistributedModel):
            raise SMPValidationError("smp.DistributedModel: the module is wrapped already")
        half = s.cfg.half_dtype
        if half is not None:
            wrong = [(n, p.dtype) for n, p in module.named_parameters()
                     if p.is_floating_point() and p.dtype != getattr(torch, half) and p.device.type != "meta"]
            if wrong:
                key = "fp16" if half == "float16" else "bf16"
                raise SMPValidationError(
                    f"smp.DistributedModel ({s.who()}): the config sets '{key}', but {len(wrong)} parameters are "
                    f"not {half} (e.g. '{wrong[0][0]}' is {wrong[0][1]}): build the model inside "
                    f"`with smp.model_creation(dtype=torch.{half}):`")
        super().__init__()
        module, replaced = TP.replace_modules(module, s.who(), s.tp_size)
        self.module = module
        self._smp = _Options(replaced=replaced, rt=None, bucket_cap_mb=bucket_cap_mb,
                             broadcast_buffers=broadcast_buffers,
                             average_grads_across_microbatches=average_grads_across_microbatches,
                             overlapping_allreduce=overlapping_allreduce, hooks=[], partial_keys=None,
                             backward_passes_per_step=backward_passes_per_step, backward_passes=0,
                             partial_strict=True, epoch=s.epoch, comm_hook=None, gathered=False,
                             joining=None, deferred=None, deferred_opt=None)
        s.model = self

    # ------------------------------------------------------------- attribute access
    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name in ("module", "_smp") or "module" not in self.__dict__.get("_modules", {}):
                raise
            return getattr(self.__dict__["_modules"]["module"], name)

    # ------------------------------------------------------------- calls
    def forward(self, *args, **kwargs):
        s = require()
        if s.step_ctx is None:
            if s.pp_size == 1:
                return self._forward_whole(args, kwargs)
            raise SMPValidationError(
                "smp: the smp.DistributedModel can only be called inside an @smp.step function when it has "
                "more than one partition; for inference outside the pipeline, load model.state_dict() into a "
                "plain copy of the module")
        return s.step_ctx.model_call(args, _without_cache(self.module, args, kwargs))

    def _forward_whole(self, args, kwargs):
        """One partition, outside @smp.step: the module itself, on the partition's device."""
        if self._smp.rt is None:
            self._partition(None, _Call(args, kwargs))
        self._check_current()
        dev = self._smp.rt.device
        return self.module(*to_device(args, dev), **to_device(kwargs, dev))

    def backward(self, tensors, grad_tensors=None) -> None:
        """Queues the backward pass of this microbatch (like torch.autograd.backward). Outside a step
        (one partition), runs it at once, scaled by the fp16 loss scale, and averages the gradients
        over the replicas (``ddp``)."""
        s = require()
        if s.step_ctx is None:
            if s.pp_size == 1 and self._smp.rt is not None:
                self._backward_whole(tensors, grad_tensors)
                return
            raise SMPValidationError("smp: model.backward() must be called inside an @smp.step function")
        s.step_ctx.record_backward(tensors, grad_tensors)

    def _backward_whole(self, tensors, grad_tensors) -> None:
        s = require()
        ts = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
        gs = [None] * len(ts) if grad_tensors is None else (
            [grad_tensors] if isinstance(grad_tensors, torch.Tensor) else list(grad_tensors))
        scale = s.optimizers[0].loss_scale if s.optimizers else 1.0
        gs = [(torch.ones_like(t) if g is None else g) * scale for t, g in zip(ts, gs)]
        reducer = self._smp.rt.reducer
        self._smp.backward_passes += 1
        sync = reducer is not None and self._smp.backward_passes % self._smp.backward_passes_per_step == 0
        if sync:
            reducer.divisor = None
            if self._smp.joining is not None:
                n = reducer.active_replicas(True)
                reducer.divisor = None if self._smp.joining else n
            reducer.begin_step("whole", [])
        torch.autograd.backward(ts, gs)
        if sync:
            reducer.finish()

    def _check_current(self) -> None:
        s = require()
        if self._smp.epoch != s.epoch or s.model is not self:
            raise SMPValidationError("smp: this DistributedModel belongs to an earlier smp.init(); wrap the "
                                     "model again")
        if self._smp.gathered:
            raise SMPValidationError("smp: the model was gathered to the CPU with model.cpu(); it cannot run "
                                     "the pipeline any more (wrap a fresh model)")

    def get_module(self) -> torch.nn.Module:
        """The wrapped module (SageMaker's name for ``model.module``)."""
        return self.module

    def to(self, *args, **kwargs):
        """A dtype conversion applies; a device move is ignored: the library places each partition on
        its rank's current device (as SageMaker's does)."""
        _, dtype, non_blocking, _ = torch._C._nn._parse_to(*args, **kwargs)
        if dtype is not None:
            self.module.to(dtype=dtype, non_blocking=non_blocking)
        return self

    def cuda(self, device=None):
        return self

    def cpu(self):
        """Gathers the whole model (every partition's parameters and buffers) to the CPU on every
        rank of the replica; afterwards the model serves state_dict() and plain use, not steps."""
        if self._smp.rt is None:
            self.module.cpu()
            return self
        full = self._gathered(whole_tensors=False)
        with torch.no_grad():
            for name, t in list(self.module.named_parameters(remove_duplicate=False)):
                if name in full:
                    t.data = full[name].detach().to("cpu").clone()
            for mname, mod in self.module.named_modules(remove_duplicate=False):
                for bname, b in list(mod._buffers.items()):
                    key = f"{mname}.{bname}" if mname else bname
                    if b is not None and key in full:
                        mod._buffers[bname] = full[key].detach().to("cpu").clone()
        self._smp.gathered = True
        return self

    def register_comm_hook(self, state: Any, hook: Callable) -> None:
        """As DistributedDataParallel's: ``hook(state, bucket)`` reduces each gradient bucket over the
        data-parallel group instead of the default average and returns a torch.futures.Future of the
        reduced tensor (e.g. torch's ``default_hooks.fp16_compress_hook`` with
        ``smp.get_dp_process_group()`` as state). Register it before the first step."""
        if not callable(hook):
            raise SMPValidationError(f"smp.DistributedModel.register_comm_hook: hook must be callable, got "
                                     f"{type(hook).__name__}")
        if self._smp.comm_hook is not None:
            raise SMPValidationError("smp.DistributedModel.register_comm_hook: a comm hook is registered "
                                     "already (one per model, as in DDP)")
        self._smp.comm_hook = (state, hook)
        rt = self._smp.rt
        if rt is not None and rt.reducer is not None:
            rt.reducer.comm_hook = self._smp.comm_hook

    @contextlib.contextmanager
    def join(self, divide_by_initial_world_size: bool = True, enable: bool = True,
             throw_on_early_termination: bool = False):
        """As DistributedDataParallel's: training with uneven inputs across the replicas. A replica that
        leaves the context before the others takes part in their gradient averaging with zeros until
        every replica has left; the average divides by the number of replicas
        (``divide_by_initial_world_size``) or by the number that stepped. Every rank of a replica
        runs the same steps (they share its batches). Not with fp16/bf16 or smp.amp.GradScaler, whose
        overflow check spans every rank."""
        s = require()
        if throw_on_early_termination:
            raise SMPUnsupportedError("smp.DistributedModel.join(throw_on_early_termination=True) is not "
                                      "supported by shoal; the replicas that finish early shadow the others")
        if not enable or s.dp_size == 1:
            yield
            return
        if s.cfg.half_dtype is not None:
            raise SMPUnsupportedError(f"smp.DistributedModel.join() ({s.who()}): not with '{s.cfg.half_dtype}' "
                                      f"training, whose overflow check spans every rank")
        self._smp.joining = bool(divide_by_initial_world_size)
        try:
            yield
        except BaseException:
            self._smp.joining = None
            raise
        rt = self._smp.rt
        if rt is None or rt.reducer is None:
            self._smp.joining = None
            raise SMPValidationError(f"smp.DistributedModel.join() ({s.who()}): this replica ran no step inside "
                                     f"the context; give every replica at least one batch")
        try:
            last = True                  # this replica ran the last step: no other one was still running
            while rt.reducer.active_replicas(False):
                last = False
                rt.reducer.shadow(bool(divide_by_initial_world_size))
            # as DDP's join: the replicas that ran the last step hold the final model; the others take it
            src = torch.tensor([s.dp_rank if last else -1], dtype=torch.int64, device=rt.device)
            dist.all_reduce(src, op=dist.ReduceOp.MAX, group=s.grad)
            broadcast_from(list(rt.local_params) + [b for n, b in rt.buffer_by_name.items()
                                                    if rt.pl.owner.get(n) == rt.me],
                           s.dp_ranks[int(src.item())], s.grad)
        finally:
            self._smp.joining = None

    @property
    def partitioned(self) -> bool:
        return self._smp.rt is not None

    def register_post_partition_hook(self, hook: Callable) -> _Handle:
        """`hook(model, optimizer)` runs once, right after partitioning (before the first pipeline task)."""
        self._smp.hooks.append(hook)
        return _Handle(self._smp.hooks, hook)

    def _run_step(self, ctx) -> List[Any]:
        s = require()
        self._check_current()
        if self._smp.rt is None:
            self._partition(ctx, ctx.calls[0])
        rt = self._smp.rt
        key, plan = rt.plan_for(ctx.calls[0])
        if key[:2] in rt.shape_keyed:
            _check_same_shapes(ctx, rt)
        backward = ctx.calls[0].grad_enabled
        sched = rt.schedule_for(key, plan, ctx.m, backward)
        # Gradient accumulation: the DP average runs on every
        # backward_passes_per_step-th step with a backward pass; the steps
        # between only accumulate into .grad locally.
        sync = True
        if backward:
            self._smp.backward_passes += 1
            sync = self._smp.backward_passes % self._smp.backward_passes_per_step == 0
        return Executor(rt, ctx, plan, sched, backward, sync_grads=sync).run()

    def _partition(self, ctx, call) -> None:
        s = require()
        if ctx is not None:
            _check_same_inputs(ctx, s)
        rt = ModelRuntime.create(self, call, s)
        self._smp.rt = rt
        if rt.reducer is not None:
            rt.reducer.comm_hook = self._smp.comm_hook
        if self._smp.partial_keys is not None:
            local = [n for n, o in rt.pl.owner.items() if o == rt.me]
            missing = [n for n in local if n not in self._smp.partial_keys
                       and n in dict(self.module.state_dict(keep_vars=True))]
            if missing and self._smp.partial_strict:
                raise SMPValidationError(
                    f"smp: the partial state_dict loaded before partitioning lacks {len(missing)} entries of "
                    f"this rank's partition (e.g. '{missing[0]}'): it was saved with another partitioning; "
                    f"use smp.resume_from_checkpoint, which merges every partition's file")
            self._smp.partial_keys = None
        deferred, deferred_opt = self._smp.deferred, self._smp.deferred_opt
        self._smp.deferred = self._smp.deferred_opt = None
        if deferred is not None:     # sharded data parallelism: shards loaded before partitioning
            self.load_state_dict(deferred[0], strict=deferred[1])
        if deferred_opt is not None:
            for opt in s.optimizers:
                load_optimizer_state(opt, deferred_opt)
        for opt in s.optimizers:
            opt._smp_prune()
        for hook in list(self._smp.hooks):
            hook(self, s.optimizers[0] if s.optimizers else None)

    # ------------------------------------------------------------- local views
    def _owned(self, name: str) -> bool:
        rt = self._smp.rt
        return rt is None or rt.pl.owner.get(name, 0) == rt.me

    def local_named_parameters(self) -> Iterator[Tuple[str, torch.nn.Parameter]]:
        for n, p in self.module.named_parameters():
            if self._owned(n):
                yield n, p

    def local_parameters(self) -> Iterator[torch.nn.Parameter]:
        for _, p in self.local_named_parameters():
            yield p

    def local_named_buffers(self) -> Iterator[Tuple[str, torch.Tensor]]:
        for n, b in self.module.named_buffers():
            if self._owned(n):
                yield n, b

    def local_buffers(self) -> Iterator[torch.Tensor]:
        for _, b in self.local_named_buffers():
            yield b

    def local_named_modules(self) -> Iterator[Tuple[str, torch.nn.Module]]:
        rt = self._smp.rt
        if rt is None:
            yield from self.module.named_modules()
            return
        for u in rt.pl.units:
            if rt.pl.unit_part[u] == rt.me:
                m = self.module.get_submodule(u) if u else self.module
                for n, sub in m.named_modules():
                    yield (f"{u}.{n}" if u and n else u or n), sub

    def local_modules(self) -> Iterator[torch.nn.Module]:
        for _, m in self.local_named_modules():
            yield m

    # ------------------------------------------------------------- state
    def local_state_dict(self, *args, **kwargs) -> Dict[str, Any]:
        """This rank's part: its partition's tensors, its tensor-parallel pieces, and under sharded data
        parallelism its shards (marked ``_smp_sdp_shards``)."""
        sd = collections.OrderedDict((k, _local(v)) for k, v in self.module.state_dict().items() if self._owned(k))
        sd["_smp_is_partial"] = True
        if require().cfg.sharded_data_parallel_degree > 1:
            sd["_smp_sdp_shards"] = True
        return sd

    def state_dict(self, *args, destination=None, prefix: str = "", keep_vars: bool = False, **kw):
        """The whole model's state_dict (gathered over the model replica), keyed as the wrapped module."""
        if self._smp.rt is None and require().tp_size == 1:
            return self.module.state_dict(destination=destination, prefix=prefix, keep_vars=keep_vars)
        merged = self._gathered(whole_tensors=True)
        out = collections.OrderedDict() if destination is None else destination
        for k in self.module.state_dict(keep_vars=True):
            if k in merged:
                out[prefix + k] = merged[k]
        return out

    def _gathered(self, whole_tensors: bool) -> Dict[str, torch.Tensor]:
        """Every partition's tensors on the CPU (a collective over the replica); with `whole_tensors`
        the tensor-parallel pieces are joined (a collective over the TP group)."""
        s = require()
        local = {k: _whole(v.detach()) for k, v in self.module.state_dict().items() if self._owned(k)}
        if whole_tensors and s.tp_size > 1:
            local = TP.join_pieces(self.module, local, s.tpg, s.tp_size)
        local = {k: v.cpu() for k, v in local.items()}
        if s.pp_size == 1:
            return local
        parts: List[Any] = [None] * s.pp_size
        dist.all_gather_object(parts, local, group=s.pipe)
        merged = {}
        for p in parts:
            merged.update(p)
        return merged

    # ------------------------------------------------------------- tensor parallelism
    def _smp_original_names(self, sd: Dict[str, Any]) -> Dict[str, Any]:
        """A full state dict keyed as the model was before its modules became tensor-parallel."""
        return TP.to_original_names(sd, self._smp.replaced)

    def distributed_modules(self) -> List[torch.nn.Module]:
        """The tensor-parallel modules of the model (smp.nn.DistributedModule instances)."""
        return [m for m in self.module.modules() if isinstance(m, TP.DistributedModule)]

    def is_distributed_parameter(self, param: torch.Tensor) -> bool:
        """Whether `param` is a tensor-parallel piece (its gradient is averaged over the RDP group)."""
        return bool(getattr(param, "_smp_distributed", False))

    is_distributed_buffer = is_distributed_parameter
    # Pieces are computed on the batch of the whole TP group (SageMaker's "scaled batch" tensors).
    is_scaled_batch_parameter = is_distributed_parameter
    is_scaled_batch_buffer = is_distributed_parameter

    def default_reducer_named_parameters(self) -> Iterator[Tuple[str, torch.nn.Parameter]]:
        """The parameters averaged over the DP group (replicated across the TP group)."""
        return ((n, p) for n, p in self.module.named_parameters() if not self.is_distributed_parameter(p))

    def scaled_batch_reducer_named_parameters(self) -> Iterator[Tuple[str, torch.nn.Parameter]]:
        """The tensor-parallel pieces, averaged over the RDP group."""
        return ((n, p) for n, p in self.module.named_parameters() if self.is_distributed_parameter(p))

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        sd = dict(state_dict)
        partial = bool(sd.pop("_smp_is_partial", False))
        shards = bool(sd.pop("_smp_sdp_shards", False))
        rt = self._smp.rt
        s = require()
        if shards and rt is None:    # sharded data parallelism's shards exist once the model is partitioned
            self._smp.deferred = (dict(state_dict), strict)
            return torch.nn.modules.module._IncompatibleKeys([], [])
        if not partial:
            sd = TP.to_distributed_names(sd, self._smp.replaced, set(self.module.state_dict(keep_vars=True)))
            if s.tp_size > 1:
                sd = TP.own_pieces(self.module, sd, s.tp_rank, s.tp_size)
        if rt is None:
            if partial:
                self._smp.partial_keys = set(sd)
                self._smp.partial_strict = strict
                return self.module.load_state_dict(sd, strict=False)
            return self.module.load_state_dict(sd, strict=strict)
        replicated = set(rt.pl.replicated)   # buffers every partition reads: loaded everywhere
        own = {n: t for n, t in list(self.module.named_parameters(remove_duplicate=False)) +
               list(self.module.named_buffers(remove_duplicate=False)) if self._owned(n) or n in replicated}
        keys = set(self.module.state_dict(keep_vars=True))
        missing = [n for n in own if n in keys and n not in sd]
        unexpected = [k for k in sd if k not in keys]
        if strict and (missing or (unexpected and not partial)):
            raise RuntimeError(f"smp: load_state_dict: missing keys {missing[:8]}, unexpected keys "
                               f"{unexpected[:8]}")
        with torch.no_grad():
            for n, t in own.items():
                if n in sd:
                    _copy_into(t, sd[n], shard=shards)
        return torch.nn.modules.module._IncompatibleKeys(missing, unexpected)

    # ------------------------------------------------------------- gradients
    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clips the gradients of the whole model by their total norm over every partition."""
        return clip.clip_grad_norm_(self.parameters(), max_norm, norm_type)


def _is_dtensor(t: Any) -> bool:
    return isinstance(t, DTensor)


def _local(t: Any) -> Any:
    """A sharded data-parallel parameter's shard on this rank (other tensors as they are)."""
    return t.to_local() if _is_dtensor(t) else t


def _whole(t: Any) -> Any:
    """A sharded data-parallel parameter's whole tensor (a collective over its mesh)."""
    return t.full_tensor() if _is_dtensor(t) else t


def _copy_into(t: torch.Tensor, value: torch.Tensor, shard: bool) -> None:
    """Loads `value` into `t`: a whole tensor, or (`shard`) this rank's shard of a sharded data-parallel
    parameter; a whole tensor goes into such a parameter as its shard of it (a collective over its mesh)."""
    if not _is_dtensor(t):
        t.copy_(value)
    elif shard:
        t.to_local().copy_(value)
    else:
        t.to_local().copy_(distribute_tensor(value.to(t.device), t.device_mesh, t.placements).to_local())


class _Call:
    """A model call outside @smp.step, as the partitioning reads it (steps.py's capture has the same fields)."""

    def __init__(self, args: tuple, kwargs: dict):
        self.args, self.kwargs = args, kwargs
        self.grad_enabled = torch.is_grad_enabled()


def _check_same_inputs(ctx, s) -> None:
    """Every rank of a replica must be given the same batch (checked once, at partitioning)."""
    if s.pp_size == 1:
        return
    total = torch.zeros(2, dtype=torch.float64)
    for call in ctx.calls:
        for v in list(call.args) + list(call.kwargs.values()):
            for t in _tensors(v):
                total[0] += t.detach().double().sum().item() if t.numel() else 0.0
                total[1] += t.numel()
    got = [torch.zeros(2, dtype=torch.float64) for _ in range(s.pp_size)]
    dist.all_gather(got, total, group=s.pipe)
    for p, g in enumerate(got):
        if not torch.allclose(g, got[0], rtol=1e-9, atol=1e-6, equal_nan=True):
            raise SMPValidationError(
                f"smp: the ranks of this model replica were given different inputs (pp_rank 0 and pp_rank "
                f"{p} disagree): every rank of a replica must load the same batch (shard data by dp_rank)")


def _without_cache(module: torch.nn.Module, args: tuple, kwargs: dict) -> dict:
    """A pipeline has no use for a key/value cache (Hugging Face models make
    one by default, an object that would have to cross the stages): the call
    gets use_cache=False unless it sets use_cache itself."""
    try:
        params = list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        return kwargs
    if "use_cache" in params and "use_cache" not in kwargs and params.index("use_cache") >= len(args):
        return {**kwargs, "use_cache": False}
    return kwargs


def _check_same_shapes(ctx, rt) -> None:
    """A graph specific to input sizes serves the step only if every microbatch has them."""
    first = [tuple(t.shape) for v in list(ctx.calls[0].args) + list(ctx.calls[0].kwargs.values())
             for t in _tensors(v)]
    for i, call in enumerate(ctx.calls[1:], 1):
        got = [tuple(t.shape) for v in list(call.args) + list(call.kwargs.values()) for t in _tensors(v)]
        if got != first:
            raise SMPValidationError(
                f"smp: the model's forward takes branches on input sizes (`if t == 1:` and the like), so its "
                f"pipeline graph is specific to them, but microbatch {i} has shapes {got} and microbatch 0 "
                f"{first}: make the batch divisible by the number of microbatches")


def _tensors(v: Any) -> List[torch.Tensor]:
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (list, tuple)):
        return [t for x in v for t in _tensors(x)]
    if isinstance(v, dict):
        return [t for x in v.values() for t in _tensors(x)]
    return []

