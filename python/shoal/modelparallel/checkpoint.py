"""Saving and loading: ``smp.save``/``smp.load`` and whole checkpoints.

``smp.save(obj, f, partial=True)`` writes ``f"{f}_{pp_rank}"`` (with tensor
parallelism ``f"{f}_{pp_rank}_{tp_rank}"``) on the ranks with rdp_rank 0 (one
copy per partition and piece); ``partial=False`` writes ``f`` on rank 0 only
(``obj`` should then be whole, e.g. ``model.state_dict()``).
``smp.load(f, partial=True)`` reads this rank's file back.

``save_checkpoint(path, tag, partial, model, optimizer, user_content)`` (every
rank calls it) writes the files that shoal.mpcommon.layout names.

Model and optimizer states are written with their tensors on the CPU, so the
files load anywhere (loading copies them onto the partitions' devices). Every
file is written to a temporary name, flushed and renamed, and ``newest``
is updated only after every rank has finished, so a crash never leaves a
half-written checkpoint that looks complete.

``resume_from_checkpoint(path, tag=None, partial=True)`` loads the newest (or
`tag`) checkpoint into the registered DistributedModel and
DistributedOptimizer and returns the user content. A partial checkpoint is
read whole (every partition's file of this rank's tensor-parallel piece,
merged), so it resumes under any number of partitions with the same
tensor-parallel degree. Sharded state (``shard_optimizer_state``, sharded data
parallelism) is written by every rank and read back by the same rank, so it
resumes in the same layout only; a full checkpoint (``partial=False``, the
model's whole tensors, keyed as the model before its tensor-parallel
replacement) loads into any layout and into the plain model.
"""

from __future__ import annotations

import os
import pickle
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.utils._pytree import tree_map

from ..mpcommon import layout as L
from ..mpcommon.errors import SMPValidationError
from .state import require


def _atomic_save(obj: Any, path: str, pickle_module=pickle, pickle_protocol: int = 2) -> None:
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = os.path.join(d, f".{os.path.basename(path)}.tmp.{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f, pickle_module=pickle_module, pickle_protocol=pickle_protocol)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _on_cpu(state: Any) -> Any:
    """A state dict with its tensors on the CPU (a sharded data-parallel tensor: this rank's shard):
    checkpoint files load anywhere, whatever device the partitions were on (loading copies them onto
    the partitions' devices)."""
    def cpu(t):
        if isinstance(t, DTensor):
            t = t.to_local()
        return t.detach().cpu() if isinstance(t, torch.Tensor) else t
    return tree_map(cpu, state)


def load_optimizer_state(optimizer, state: Any) -> None:
    """Loads `state` into `optimizer`; the state of a sharded data-parallel parameter (this rank's shard,
    as saved) becomes a tensor sharded like the parameter."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    saved = [i for g in state.get("param_groups", []) for i in g["params"]]
    if any(isinstance(p, DTensor) for p in params) and len(saved) == len(params):
        state = dict(state)
        state["state"] = dict(state.get("state", {}))
        for i, p in zip(saved, params):
            if isinstance(p, DTensor) and i in state["state"]:
                state["state"][i] = {k: DTensor.from_local(v.to(p.device), p.device_mesh, p.placements,
                                                           run_check=False)
                                     if isinstance(v, torch.Tensor) and v.shape == p.to_local().shape else v
                                     for k, v in state["state"][i].items()}
    optimizer.load_state_dict(state)


def _load(path: str, map_location=None) -> Any:
    return torch.load(path, map_location=map_location, weights_only=False)


def save(obj: Any, f: str, partial: bool = True, pickle_module=pickle, pickle_protocol: int = 2,
         v3: bool = False) -> None:
    s = require()
    if not isinstance(f, str):
        raise SMPValidationError("smp.save: f must be a file name (str)")
    if s.rdp_rank != 0:
        return
    if partial or (s.pp_rank == 0 and s.tp_rank == 0):
        _atomic_save(obj, L.save_file(f, s.pp_rank, partial, s.tp_rank if s.tp_size > 1 else None),
                     pickle_module, pickle_protocol)


def load(f: str, map_location=None, pickle_module=None, partial: bool = True, **pickle_load_args) -> Any:
    s = require()
    path = L.save_file(f, s.pp_rank, partial, s.tp_rank if s.tp_size > 1 else None)
    if not os.path.exists(path):
        raise FileNotFoundError(f"smp.load: {path} does not exist"
                                + (" (partial=True reads f'{f}_{pp_rank}')" if partial else ""))
    return _load(path, map_location)


def _sharded(optimizer) -> bool:
    """Whether each rank holds its own part of the optimizer state (shard_optimizer_state, sharded
    data parallelism): then every rank writes and reads its own file."""
    return _sdp() or bool(optimizer._smp_sharding())


def _sdp() -> bool:
    """Whether each rank holds its own shards of the parameters (sharded data parallelism)."""
    return require().cfg.sharded_data_parallel_degree > 1


def _files(d: str, kind: str, s, pp_rank: int, rdp: bool = False) -> str:
    return L.part_file(d, kind, pp_rank, s.tp_rank if s.tp_size > 1 else None, s.rdp_rank if rdp else None)


def save_checkpoint(path: str, tag: str, partial: bool = True, model=None, optimizer=None,
                    user_content: Any = None, translate_if_full: bool = True,
                    num_kept_partial_checkpoints: Optional[int] = None) -> None:
    """Partial: each (partition, tensor-parallel piece) written once, by its rdp_rank 0 (sharded
    optimizer state: by every rank). Full: the whole model on rank 0, keyed as the model before the
    tensor-parallel replacement when `translate_if_full` (so it loads into the plain model)."""
    s = require()
    tag = str(tag)
    sharded = optimizer is not None and _sharded(optimizer)
    if partial:
        d = L.partial_dir(path, tag)
        if s.rdp_rank == 0:
            os.makedirs(d, exist_ok=True)
        dist.barrier(group=s.ctl)
        if model is not None and (_sdp() or s.rdp_rank == 0):
            _atomic_save(_on_cpu(model.local_state_dict()), _files(d, "model", s, s.pp_rank, _sdp()))
        if optimizer is not None and (sharded or s.rdp_rank == 0):
            opt_sd = optimizer.local_state_dict(gather_if_shard=False) if sharded else optimizer.local_state_dict()
            _atomic_save(_on_cpu(opt_sd), _files(d, "optimizer", s, s.pp_rank, sharded))
        if s.rank == 0:
            _atomic_save(user_content, os.path.join(d, L.USER_CONTENT))
    else:
        if sharded:
            raise SMPValidationError(
                "smp.save_checkpoint(partial=False): saving the full optimizer is not supported with sharded "
                "optimizer state; save a partial checkpoint, or pass optimizer=None to save the full model")
        full_model = model.state_dict() if model is not None else None
        if full_model is not None and translate_if_full:
            full_model = model._smp_original_names(full_model)
        full_opt = optimizer.state_dict() if optimizer is not None and s.rdp_rank == 0 else None
        if s.rank == 0:
            if model is not None:
                _atomic_save(full_model, L.full_file(path, "model", tag))
            if optimizer is not None:
                _atomic_save(_on_cpu(full_opt), L.full_file(path, "optimizer", tag))
            _atomic_save(user_content, L.full_file(path, "user_content", tag))
    dist.barrier(group=s.ctl)
    if s.rank == 0:
        if partial:
            L.write_meta(path, tag, {"tag": tag, "pp_size": s.pp_size, "tp_size": s.tp_size,
                                     "rdp_size": s.rdp_size, "model": model is not None,
                                     "optimizer": optimizer is not None, "sharded_optimizer": sharded,
                                     "sharded_model": _sdp(),
                                     "sdp": s.cfg.sharded_data_parallel_degree})
        L.write_newest(path, tag)
        if partial and num_kept_partial_checkpoints:
            L.prune(path, num_kept_partial_checkpoints)
    dist.barrier(group=s.ctl)


def resume_from_checkpoint(path: str, tag: Optional[str] = None, partial: bool = True, strict: bool = True,
                           load_optimizer: bool = True, load_sharded_optimizer_state: bool = True,
                           translate_function=None) -> Any:
    """Partial checkpoints resume in the layout they were written in (partitions may be re-planned;
    tensor-parallel and optimizer-shard layouts must match); full ones load into any layout."""
    s = require()
    who = "smp.resume_from_checkpoint"
    tag = L.newest_tag(path, who, tag)
    if partial:
        d = L.partial_dir(path, tag)
        meta = L.read_meta(path, tag, who)
        tp = meta.get("tp_size", 1)
        if tp != s.tp_size:
            raise SMPValidationError(
                f"{who} ({s.who()}): the partial checkpoint {d} was written with tensor_parallel_degree {tp}, "
                f"this job has {s.tp_size}: partial checkpoints resume in the same layout; save a full "
                f"checkpoint (partial=False) to change it")
        model_sd, opt_sd = None, None
        if meta.get("sharded_model") and (meta.get("rdp_size") != s.rdp_size or
                                          meta.get("sdp") != s.cfg.sharded_data_parallel_degree):
            raise SMPValidationError(
                f"{who} ({s.who()}): the checkpoint's parameters are sharded (sharded_data_parallel_degree "
                f"{meta.get('sdp')} over {meta.get('rdp_size')} ranks); this job has "
                f"{s.cfg.sharded_data_parallel_degree} over {s.rdp_size}: resume in the same layout")
        if meta["model"] and meta.get("sharded_model"):
            model_sd = _load(_files(d, "model", s, s.pp_rank, True))
        elif meta["model"]:
            model_sd = {}
            for r in range(meta["pp_size"]):
                part = _load(_files(d, "model", s, r))
                part.pop("_smp_is_partial", None)
                model_sd.update(part)
            model_sd["_smp_is_partial"] = True
        if meta["optimizer"] and load_optimizer and meta.get("sharded_optimizer"):
            if meta.get("rdp_size", 1) != s.rdp_size or meta["pp_size"] != s.pp_size:
                raise SMPValidationError(
                    f"{who} ({s.who()}): the checkpoint's optimizer state is sharded over {meta.get('rdp_size')} "
                    f"ranks and {meta['pp_size']} partitions; this job has {s.rdp_size} and {s.pp_size}")
            if load_sharded_optimizer_state:
                opt_sd = _load(_files(d, "optimizer", s, s.pp_rank, True))
        elif meta["optimizer"] and load_optimizer:
            opt_sd = {"state": {}, "param_groups": None}
            for r in range(meta["pp_size"]):
                part = _load(_files(d, "optimizer", s, r))
                opt_sd["state"].update(part["state"])
                opt_sd["param_groups"] = opt_sd["param_groups"] or part["param_groups"]
        uc = os.path.join(d, L.USER_CONTENT)
        user_content = _load(uc) if os.path.exists(uc) else None
    else:
        mp = L.full_file(path, "model", tag)
        model_sd = _load(mp) if os.path.exists(mp) else None
        op = L.full_file(path, "optimizer", tag)
        opt_sd = _load(op) if load_optimizer and os.path.exists(op) else None
        uc = L.full_file(path, "user_content", tag)
        user_content = _load(uc) if os.path.exists(uc) else None
    if translate_function is not None and model_sd is not None:
        model_sd = translate_function(model_sd)
    if model_sd is not None:
        if s.model is None:
            raise SMPValidationError("smp.resume_from_checkpoint: wrap the model in smp.DistributedModel first")
        s.model.load_state_dict(model_sd, strict=strict)
    if opt_sd is not None:
        if _sdp() and s.model is not None and s.model._smp.rt is None:
            s.model._smp.deferred_opt = opt_sd     # sharded like the parameters once they are partitioned
        else:
            for opt in s.optimizers:
                load_optimizer_state(opt, opt_sd)
    return user_content
