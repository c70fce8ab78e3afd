"""shoal's collectives as TensorFlow ops (the library of csrc/, _ops.so).

The ops are asynchronous C++ kernels over shoal's communicator; they run
eagerly and inside tf.function (where TensorFlow's automatic control
dependencies keep them in program order, which is what lets every rank issue
its collectives in one order). Gradients are registered for allreduce,
allgather and broadcast.

The process joins the world with init() (from RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT, as shoalrun and torchrun set them; under mpirun, Open MPI's
OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK / _LOCAL_SIZE stand in for RANK,
WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE); new_group() makes groups of its
ranks.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import socket
from pathlib import Path
from typing import List, Optional, Sequence

import tensorflow as tf

_HERE = Path(__file__).resolve().parent
_LIB = None
_C = None
_STATE = {"rank": None, "size": None, "local_rank": 0, "local_size": 1}

REDUCE_OPS = {"sum": "sum", "average": "avg", "avg": "avg", "mean": "avg", "min": "min", "max": "max",
              "product": "prod", "prod": "prod"}


class ShoalTFError(RuntimeError):
    """shoal.tensorflow could not start (its library, the rendezvous)."""


def _library():
    global _LIB, _C
    if _LIB is None:
        path = _HERE / "_ops.so"
        if not path.exists():
            raise ShoalTFError(f"shoal.tensorflow: {path} is missing: build shoal with TensorFlow installed in the "
                               f"same Python (`make build` builds it when `import tensorflow` works; docs/tensorflow.md)")
        _LIB = tf.load_op_library(str(path))
        _C = ctypes.CDLL(str(path))
        _C.shoal_tf_error.restype = ctypes.c_char_p
        _C.shoal_tf_init.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_double]
        _C.shoal_tf_new_group.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
        _C.shoal_tf_shutdown.argtypes = [ctypes.c_char_p]
    return _LIB


# Under mpirun (Open MPI sets no RANK / WORLD_SIZE), its variables stand in for
# the launcher's; MASTER_ADDR and MASTER_PORT come with `mpirun -x`.
_MPI_ENV = {"RANK": "OMPI_COMM_WORLD_RANK", "WORLD_SIZE": "OMPI_COMM_WORLD_SIZE",
            "LOCAL_RANK": "OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_WORLD_SIZE": "OMPI_COMM_WORLD_LOCAL_SIZE"}


def _env_int(name: str, default: Optional[int] = None) -> int:
    v = os.environ.get(name)
    if (v is None or v == "") and os.environ.get(_MPI_ENV.get(name, "")):
        name = _MPI_ENV[name]
        v = os.environ[name]
    if v is None or v == "":
        if default is None:
            raise ShoalTFError(f"shoal.tensorflow.init: {name} is not set (start the job with shoalrun or torchrun)")
        return default
    try:
        return int(v)
    except ValueError:
        raise ShoalTFError(f"shoal.tensorflow.init: {name}={v!r} is not an integer") from None


def init(timeout_s: Optional[float] = None) -> None:
    """Joins the job's world (idempotent). Without WORLD_SIZE, a world of one."""
    _library()
    if _STATE["rank"] is not None:
        return
    if not any(os.environ.get(n) for n in ("WORLD_SIZE", "RANK", "OMPI_COMM_WORLD_SIZE")):
        rank, size, addr = 0, 1, "127.0.0.1"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    else:
        rank, size = _env_int("RANK"), _env_int("WORLD_SIZE")
        addr, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), _env_int("MASTER_PORT", 29500)
        if size < 1 or not 0 <= rank < size:
            raise ShoalTFError(f"shoal.tensorflow.init: RANK={rank} is not a rank of WORLD_SIZE={size}")
    if timeout_s is None:
        timeout_s = float(os.environ.get("SHOAL_TIMEOUT_S", "0") or 0)
    if _C.shoal_tf_init(rank, size, addr.encode(), port, float(timeout_s)) != 0:
        raise ShoalTFError(_C.shoal_tf_error().decode())
    _STATE.update(rank=rank, size=size, local_rank=_env_int("LOCAL_RANK", rank),
                  local_size=_env_int("LOCAL_WORLD_SIZE", size))


def is_initialized() -> bool:
    return _STATE["rank"] is not None


def shutdown(reason: str = "") -> None:
    """Leaves the world: pending operations fail with Aborted if `reason` is given."""
    if _C is not None and _STATE["rank"] is not None:
        _C.shoal_tf_shutdown(reason.encode())
    _STATE.update(rank=None, size=None)


atexit.register(shutdown)


def _need() -> None:
    if _STATE["rank"] is None:
        raise ShoalTFError("shoal.tensorflow is not initialised: call init() first")


def rank() -> int:
    _need()
    return _STATE["rank"]


def size() -> int:
    _need()
    return _STATE["size"]


def local_rank() -> int:
    _need()
    return _STATE["local_rank"]


def local_size() -> int:
    _need()
    return _STATE["local_size"]


class Group:
    """Ranks of the world that run collectives among themselves (id 0: the world)."""

    def __init__(self, gid: int, ranks: Sequence[int]):
        self.id, self.ranks = gid, list(ranks)

    def rank(self) -> int:
        return self.ranks.index(rank())

    def size(self) -> int:
        return len(self.ranks)

    def __repr__(self) -> str:
        return f"Group({self.id}, ranks={self.ranks})"


def new_group(ranks: Sequence[int]) -> Group:
    """A group of the world's `ranks`, made by those ranks (every member with the
    same list, groups in the same order); it shares the world's connections."""
    _need()
    ranks = [int(r) for r in ranks]
    if sorted(set(ranks)) != sorted(ranks) or any(not 0 <= r < size() for r in ranks):
        raise ValueError(f"shoal.tensorflow.new_group (rank {rank()}): ranks {ranks} must be distinct ranks of "
                         f"0..{size() - 1}")
    if rank() not in ranks:
        raise ValueError(f"shoal.tensorflow.new_group (rank {rank()}): only the members make a group; "
                         f"this rank is not in {ranks}")
    arr = (ctypes.c_int * len(ranks))(*ranks)
    gid = _C.shoal_tf_new_group(arr, len(ranks))
    if gid < 0:
        raise ShoalTFError(_C.shoal_tf_error().decode())
    return Group(gid, ranks)


_DEFAULT: List[Optional[Group]] = [None]


def set_default_group(group: Optional[Group]) -> None:
    """The group collectives run on when none is given (None: the world).
    The model-parallel library sets its data-parallel group here when it
    runs with data parallelism, as the SageMaker library scopes Horovod."""
    _DEFAULT[0] = group


def default_group() -> Optional[Group]:
    return _DEFAULT[0]


def group_rank(group: Optional[Group] = None) -> int:
    group = group or _DEFAULT[0]
    return rank() if group is None else group.rank()


def group_size(group: Optional[Group] = None) -> int:
    group = group or _DEFAULT[0]
    return size() if group is None else group.size()


def _call(name: str, **kwargs):
    """Runs op `name`. Inside a graph (tf.function) every shoal op also gets a
    control dependency on the previous shoal op of that graph, so the order
    the collectives need holds whatever TensorFlow's automatic control
    dependencies decide for stateful ops (docs/tensorflow.md, "Ordering")."""
    fn = getattr(_library(), name)
    if tf.executing_eagerly():
        return fn(**kwargs)
    g = tf.compat.v1.get_default_graph()
    last = getattr(g, "_shoal_last_op", None)
    with tf.control_dependencies([last] if last is not None else []):
        out = fn(**kwargs)
    if isinstance(out, tf.Operation):
        op = out
    elif isinstance(out, tf.Tensor):
        op = out.op
    else:
        first = next(iter(out), None) if out is not None else None
        op = first.op if first is not None else last
    g._shoal_last_op = op
    return out


def _gid(group: Optional[Group]) -> int:
    _need()
    group = group or _DEFAULT[0]
    return 0 if group is None else group.id


def _op(op: str) -> str:
    try:
        return REDUCE_OPS[str(op).lower()]
    except KeyError:
        raise ValueError(f"shoal.tensorflow (rank {rank()}): op: unknown reduction {op!r}; one of "
                         f"{sorted(set(REDUCE_OPS))}") from None


def allreduce_n(tensors: List[tf.Tensor], op: str = "average", group: Optional[Group] = None,
                fusion_bytes: int = 64 << 20) -> List[tf.Tensor]:
    """Reduces each tensor across the group; tensors of one dtype travel fused
    in buckets of up to fusion_bytes (one collective per bucket)."""
    if not tensors:
        return []
    return _call("shoal_allreduce", tensors=list(tensors), reduce_op=_op(op), fusion_bytes=int(fusion_bytes),
                                      group=_gid(group))


def allreduce(tensor, op: str = "average", group: Optional[Group] = None) -> tf.Tensor:
    return allreduce_n([tf.convert_to_tensor(tensor)], op, group)[0]


def allgather(tensor, group: Optional[Group] = None) -> tf.Tensor:
    """Every rank's tensor concatenated along the first dimension (which may differ)."""
    return _call("shoal_allgather", tensor=tensor, group=_gid(group))


def broadcast(tensor, root_rank: int = 0, group: Optional[Group] = None) -> tf.Tensor:
    return _call("shoal_broadcast", tensor=tensor, root=int(root_rank), group=_gid(group))


def alltoall(tensor, splits=None, group: Optional[Group] = None):
    """(received, received_splits): rows splits[k] go to rank k (equal parts when None)."""
    splits = tf.zeros([0], tf.int64) if splits is None else tf.cast(splits, tf.int64)
    return _call("shoal_alltoall", tensor=tensor, splits=splits, group=_gid(group))


def reduce_scatter(tensor, op: str = "average", group: Optional[Group] = None) -> tf.Tensor:
    """The reduction of every rank's tensor; rank k keeps part k of the first dimension."""
    return _call("shoal_reduce_scatter", tensor=tensor, reduce_op=_op(op), group=_gid(group))


def barrier(group: Optional[Group] = None) -> None:
    _call("shoal_barrier", group=_gid(group))


def send(tensor, peer: int, tag: int = 0, group: Optional[Group] = None) -> None:
    _call("shoal_send", tensor=tensor, peer=tf.constant(int(peer), tf.int32), tag=tf.constant(int(tag), tf.int64),
                          group=_gid(group))


def wait_sends(group: Optional[Group] = None) -> None:
    """Waits until the sends issued so far on the group have left (send returns once issued)."""
    _call("shoal_wait_sends", group=_gid(group))


def recv(peer: int, dtype, tag: int = 0, group: Optional[Group] = None) -> tf.Tensor:
    return _call("shoal_recv", peer=tf.constant(int(peer), tf.int32), tag=tf.constant(int(tag), tf.int64),
                                 T=tf.as_dtype(dtype), group=_gid(group))


# ----------------------------------------------------------------- gradients

@tf.RegisterGradient("ShoalAllreduce")
def _allreduce_grad(op, *grads):
    kind = op.get_attr("reduce_op").decode()
    gid = op.get_attr("group")
    if kind in ("sum", "avg"):
        live = [i for i, g in enumerate(grads) if g is not None]
        summed = _call("shoal_allreduce", tensors=[grads[i] for i in live], reduce_op=kind,
                                            fusion_bytes=op.get_attr("fusion_bytes"), group=gid) if live else []
        out = [None] * len(grads)
        for i, g in zip(live, summed):
            out[i] = g
        return out
    if kind in ("min", "max"):   # to the ranks that hold the extreme value
        out = []
        for x, y, g in zip(op.inputs, op.outputs, grads):
            if g is None:
                out.append(None)
                continue
            s = _call("shoal_allreduce", tensors=[g], reduce_op="sum", group=gid)[0]
            out.append(s * tf.cast(tf.equal(x, y), g.dtype))
        return out
    raise LookupError(f"shoal.tensorflow: allreduce with op {kind!r} has no gradient")


@tf.RegisterGradient("ShoalAllgather")
def _allgather_grad(op, grad):
    gid = op.get_attr("group")
    summed = _call("shoal_allreduce", tensors=[grad], reduce_op="sum", group=gid)[0]
    rows = tf.shape(op.inputs[0], out_type=tf.int64)[:1]
    all_rows = _call("shoal_allgather", tensor=rows, group=gid)
    me = _C.shoal_tf_group_rank(gid)
    start = tf.reduce_sum(all_rows[:me])
    return summed[start:start + rows[0]]


@tf.RegisterGradient("ShoalBroadcast")
def _broadcast_grad(op, grad):
    gid = op.get_attr("group")
    summed = _call("shoal_allreduce", tensors=[grad], reduce_op="sum", group=gid)[0]
    if _C.shoal_tf_group_rank(gid) == op.get_attr("root"):
        return summed
    return tf.zeros_like(summed)


for _name in ("ShoalAlltoall", "ShoalReduceScatter", "ShoalBarrier", "ShoalSend", "ShoalRecv", "ShoalWaitSends"):
    tf.no_gradient(_name)
