"""``smdistributed.dataparallel.tensorflow``: the SageMaker data-parallel
library's TensorFlow 2 API over shoal.tensorflow (docs/tensorflow.md).

Under ``smdistributed.modelparallel.tensorflow`` with ``horovod`` (or
``ddp``), the collectives and rank queries here act on the model-parallel
library's data-parallel group (the ranks that hold the same partition), as
Horovod does under the SageMaker library; elsewhere on the world. So a
Horovod script runs on shoal with its import changed to
``import smdistributed.dataparallel.tensorflow as hvd``.
"""

from __future__ import annotations

import enum

import tensorflow as tf

import shoal.tensorflow as _st
from shoal.tensorflow import compat as _compat
from shoal.tensorflow import data_parallel as _dp


class ReduceOp(enum.Enum):
    AVERAGE = "average"
    SUM = "sum"
    MIN = "min"
    MAX = "max"


Average, Sum, Min, Max = ReduceOp.AVERAGE, ReduceOp.SUM, ReduceOp.MIN, ReduceOp.MAX


class Compression:
    """Gradients travel uncompressed: ``none`` only (``fp16`` is refused by name)."""
    none = "none"
    fp16 = "fp16"


_INIT = [False]


def _op(op) -> str:
    return op.value if isinstance(op, ReduceOp) else str(op)


def _compression(c) -> None:
    if c not in (None, Compression.none):
        raise ValueError(f"smdistributed.dataparallel.tensorflow: compression {c!r} is not supported "
                         f"(gradients travel uncompressed)")


def init() -> None:
    """Joins the job (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, as shoalrun sets them)."""
    if _INIT[0]:
        raise RuntimeError("init() called more than once. smdistributed.dataparallel is already initialized.")
    _st.init()
    _compat.install()
    _INIT[0] = True


def _ready():
    if not _st.is_initialized():
        raise RuntimeError("smdistributed.dataparallel.tensorflow: call init() first")


def is_initialized() -> bool:
    return _st.is_initialized()


def rank() -> int:
    _ready()
    return _st.group_rank()


def size() -> int:
    _ready()
    return _st.group_size()


def local_rank() -> int:
    _ready()
    return _st.local_rank()


def local_size() -> int:
    _ready()
    return _st.local_size()


def allreduce(tensor, param_index: int = 0, num_params: int = 1, compression=Compression.none,
              op=ReduceOp.AVERAGE):
    """One tensor reduced across the ranks (average by default). IndexedSlices are gathered."""
    _ready()
    _compression(compression)
    if isinstance(tensor, tf.IndexedSlices):
        return _dp.reduce_gradients([tensor], _op(op))[0]
    return _st.allreduce(tensor, _op(op))


def oob_allreduce(tensor, compression=Compression.none, op=ReduceOp.AVERAGE):
    """An allreduce outside the gradient stream (e.g. the loss, to print); returns the result."""
    return allreduce(tensor, compression=compression, op=op)


def broadcast(tensor, root_rank: int):
    _ready()
    return _st.broadcast(tensor, root_rank)


def broadcast_variables(variables, root_rank: int) -> None:
    _ready()
    _dp.broadcast_variables(variables, root_rank)


def broadcast_global_variables(root_rank: int) -> None:
    _ready()
    _dp.broadcast_global_variables(root_rank)


def overlap(tensor):
    """XLA's overlap hint in SageMaker's library; the identity here."""
    return tf.identity(tensor)


def shutdown() -> None:
    _st.shutdown()
    _INIT[0] = False


def _only_supported(**given) -> None:
    for name, v in given.items():
        if v:
            raise ValueError(f"smdistributed.dataparallel.tensorflow: {name} is not supported")


def DistributedGradientTape(gradtape, device_dense: str = "", device_sparse: str = "", compression=Compression.none,
                            sparse_as_dense: bool = False, op=ReduceOp.AVERAGE):
    _ready()
    _compression(compression)
    _only_supported(device_dense=device_dense, device_sparse=device_sparse)
    return _dp.DistributedGradientTape(gradtape, sparse_as_dense=sparse_as_dense, op=_op(op))


def DistributedOptimizer(optimizer, name=None, use_locking: bool = False, device_dense: str = "",
                         device_sparse: str = "", compression=Compression.none, sparse_as_dense: bool = False,
                         op=ReduceOp.AVERAGE, bucket_cap_mb: int = 25):
    _ready()
    _compression(compression)
    _only_supported(device_dense=device_dense, device_sparse=device_sparse)
    return _dp.DistributedOptimizer(optimizer, op=_op(op), sparse_as_dense=sparse_as_dense,
                                    fusion_bytes=int(bucket_cap_mb) << 20)


__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "allreduce", "oob_allreduce",
    "broadcast", "broadcast_variables", "broadcast_global_variables", "overlap", "DistributedGradientTape",
    "DistributedOptimizer", "ReduceOp", "Compression",
]
