"""The deprecated ``smdistributed.dataparallel.torch.distributed`` API.

Each function behaves like its ``torch.distributed`` namesake on the default
group of backend ``smddp`` and emits one DeprecationWarning the first time it
is called. ``init_process_group()`` takes the job from the launcher's
environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; shoalrun sets them).
"""

import os

import torch.distributed as _dist

from . import torch_smddp  # noqa: F401  (registers "smddp")
from ._deprecation import deprecated, warn_once

__all__ = ["is_available", "init_process_group", "is_initialized", "get_world_size", "get_rank",
           "get_local_rank", "all_reduce", "broadcast", "all_gather", "all_to_all_single",
           "barrier", "ReduceOp"]

_PREFIX = "smdistributed.dataparallel.torch.distributed"
_NEW = "torch.distributed with backend='smddp' (import smdistributed.dataparallel.torch.torch_smddp)"


class _ReduceOpProxy:
    """``ReduceOp.SUM`` etc.; the first attribute access warns."""

    def __getattr__(self, item):
        warn_once(f"{_PREFIX}.ReduceOp", "torch.distributed.ReduceOp")
        return getattr(_dist.ReduceOp, item)


ReduceOp = _ReduceOpProxy()


@deprecated(f"{_PREFIX}.is_available", "torch.distributed.is_available")
def is_available():
    return _dist.is_available()


@deprecated(f"{_PREFIX}.init_process_group", "torch.distributed.init_process_group(backend='smddp')")
def init_process_group(backend="smddp", init_method=None, timeout=None, **kwargs):
    if _dist.is_initialized():
        return
    if backend in (None, "", "nccl"):  # the SageMaker library ignored the name
        backend = "smddp"
    if timeout is not None:
        kwargs["timeout"] = timeout
    _dist.init_process_group(backend=backend, init_method=init_method, **kwargs)


@deprecated(f"{_PREFIX}.is_initialized", "torch.distributed.is_initialized")
def is_initialized():
    return _dist.is_initialized()


@deprecated(f"{_PREFIX}.get_world_size", "torch.distributed.get_world_size")
def get_world_size(group=None):
    return _dist.get_world_size(group)


@deprecated(f"{_PREFIX}.get_rank", "torch.distributed.get_rank")
def get_rank(group=None):
    return _dist.get_rank(group)


@deprecated(f"{_PREFIX}.get_local_rank", "int(os.environ['LOCAL_RANK'])")
def get_local_rank():
    return int(os.environ.get("LOCAL_RANK", "0"))


@deprecated(f"{_PREFIX}.all_reduce", "torch.distributed.all_reduce")
def all_reduce(tensor, op=None, group=None, async_op=False):
    return _dist.all_reduce(tensor, op=_dist.ReduceOp.SUM if op is None else op, group=group,
                            async_op=async_op)


@deprecated(f"{_PREFIX}.broadcast", "torch.distributed.broadcast")
def broadcast(tensor, src=0, group=None, async_op=False):
    return _dist.broadcast(tensor, src=src, group=group, async_op=async_op)


@deprecated(f"{_PREFIX}.all_gather", "torch.distributed.all_gather")
def all_gather(tensor_list, tensor, group=None, async_op=False):
    return _dist.all_gather(tensor_list, tensor, group=group, async_op=async_op)


@deprecated(f"{_PREFIX}.all_to_all_single", "torch.distributed.all_to_all_single")
def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None,
                      async_op=False):
    return _dist.all_to_all_single(output, input, output_split_sizes, input_split_sizes,
                                   group=group, async_op=async_op)


@deprecated(f"{_PREFIX}.barrier", "torch.distributed.barrier")
def barrier(group=None, async_op=False):
    return _dist.barrier(group=group, async_op=async_op)
