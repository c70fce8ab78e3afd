"""``smp.init`` for TensorFlow: the library's state (shoal.mpcommon.state, with
the TensorFlow config keys), its groups and the SageMaker helpers that move
Python objects (the rank queries are shoal.mpcommon.ranks).

Groups (shoal.tensorflow groups, sharing the world's connections): the
pipeline group of this rank's model replica (activations, gradients, model
outputs), the data-parallel group of the ranks holding this rank's partition
(gradient averaging; with ``horovod`` or ``ddp`` it is also the default group
of ``smdistributed.dataparallel.tensorflow``, and with ``horovod`` under
mpirun Horovod itself is initialised on it, as under the SageMaker library),
and two groups for the helpers below, so user messages
never meet the pipeline's.
"""

from __future__ import annotations

import os
import pickle
import sys
from typing import Any, List

import numpy as np
import tensorflow as tf

from ...mpcommon.groups import DP_GROUP, MP_GROUP, PP_GROUP, WORLD, CommGroup, RankType  # noqa: F401
from ...mpcommon import config as C
from ...mpcommon import state as core
from ...mpcommon.errors import SMPConfigError, SMPValidationError
from .. import ops
from .context import set_limit


class _State(core.State):
    def __init__(self):
        super().__init__()
        self.pipe = self.dp = self.user_world = self.user_mp = self.user_dp = None


STATE = _State()
require = STATE.require


def init(config=None) -> None:
    """Joins the job (shoal.tensorflow.init) and sets the library up from
    `config` (else SHOAL_MP_CONFIG, else SM_HP_MP_PARAMETERS, else defaults)."""
    ops.init()
    cfg = C.parse(config, world_size=ops.size(), framework="tensorflow")
    s = STATE
    s.setup(cfg, ops.rank(), ops.size(), ops.local_rank(), ops.local_size())
    # every rank makes its own groups, in one order on all ranks
    s.pipe = ops.new_group(s.mp_ranks)
    s.user_mp = ops.new_group(s.mp_ranks)
    s.dp = ops.new_group(s.dp_ranks)
    s.user_dp = ops.new_group(s.dp_ranks)
    s.user_world = ops.new_group(list(range(s.world_size)))
    ops.set_default_group(s.dp if (cfg.horovod or cfg.ddp) and s.dp_size > 1 else None)
    if cfg.horovod:
        _init_horovod(s)
    s.initialized = True
    core.activate(s)
    set_limit(cfg.partitions)


def _mpi_launched() -> bool:
    return bool(os.environ.get("OMPI_COMM_WORLD_SIZE"))


def _init_horovod(s: _State) -> None:
    """With "horovod": initialises Horovod itself, when it is installed and the
    job was started by mpirun, on this rank's data-parallel group
    (``hvd.init(comm=<its world ranks>)``, Horovod's MPI controller): the
    script's un-annotated ``hvd.allreduce`` / ``hvd.broadcast_variables`` then
    act on the replicas of its partition, and ``hvd.rank()`` / ``hvd.size()``
    are ``dp_rank`` / ``dp_size``, as under SageMaker's library (the script
    never calls hvd.init). Otherwise Horovod is left alone and scripts use
    ``smdistributed.dataparallel.tensorflow``, which smp scopes to the same
    group (the default group set above)."""
    if not _mpi_launched():
        if "horovod.tensorflow" in sys.modules:
            raise SMPConfigError(
                f"smp ({s.who()}): 'horovod': the script imports horovod.tensorflow, which smp initialises on the "
                f"data-parallel group through MPI: start the job with mpirun (with MASTER_ADDR and MASTER_PORT "
                f"exported, e.g. `mpirun -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29500 ...`), or import "
                f"smdistributed.dataparallel.tensorflow as hvd instead")
        return
    try:
        import horovod.tensorflow as hvd
    except ImportError:
        return                          # no Horovod: smdistributed.dataparallel.tensorflow serves the script
    mpi_rank, mpi_size = int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])
    if (mpi_rank, mpi_size) != (s.rank, s.world_size):
        raise SMPConfigError(f"smp ({s.who()}): 'horovod': MPI rank {mpi_rank} of {mpi_size} is not shoal's rank "
                             f"{s.rank} of {s.world_size}: leave RANK and WORLD_SIZE unset under mpirun")
    if not hvd.is_initialized():
        hvd.init(comm=list(s.dp_ranks))
    if (hvd.rank(), hvd.size()) != (s.dp_rank, s.dp_size):
        raise SMPConfigError(f"smp ({s.who()}): 'horovod': Horovod runs as rank {hvd.rank()} of {hvd.size()}, not "
                             f"on the data-parallel group {list(s.dp_ranks)} (was hvd.init called before smp.init?)")


def shutdown() -> None:
    STATE.initialized = False
    ops.set_default_group(None)


# ----------------------------------------------------------------- Python objects

_TAG = 3


def _group(g) -> ops.Group:
    s = require()
    key = g.value if isinstance(g, (CommGroup, RankType)) else g
    if key == 4:
        raise SMPValidationError("smp: the TP group is a feature of the PyTorch front end (no tensor parallelism "
                                 "in TensorFlow)")
    # without tensor parallelism PP = MP and RDP = DP
    return {0: s.user_world, 1: s.user_mp, 2: s.user_dp, 3: s.user_mp, 5: s.user_dp}[key]


def _pack(obj: Any) -> tf.Tensor:
    return tf.constant(np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8))


def _unpack(t: tf.Tensor) -> Any:
    return pickle.loads(t.numpy().tobytes())


def _in_group(r: int, rank_type: RankType) -> int:
    require().world_rank(r, rank_type)     # checks the kind and the range
    return r


def send(obj: Any, dest_rank: int, rank_type: RankType = RankType.WORLD_RANK) -> None:
    ops.send(_pack(obj), _in_group(dest_rank, rank_type), _TAG, _group(rank_type))


def recv_from(src_rank: int, rank_type: RankType = RankType.WORLD_RANK) -> Any:
    return _unpack(ops.recv(_in_group(src_rank, rank_type), tf.uint8, _TAG, _group(rank_type)))


def broadcast(obj: Any, group: CommGroup = CommGroup.WORLD) -> None:
    """Sends `obj` to every other rank of `group`; they call recv_from (as in SageMaker)."""
    g = _group(group)
    for r in range(g.size()):
        if r != g.rank():
            ops.send(_pack(obj), r, _TAG, g)


def allgather(obj: Any, group: CommGroup = CommGroup.WORLD) -> List[Any]:
    g = _group(group)
    data = _pack(obj)
    sizes = ops.allgather(tf.shape(data, out_type=tf.int64), g).numpy()
    flat = ops.allgather(data, g).numpy()
    out, off = [], 0
    for n in sizes:
        out.append(pickle.loads(flat[off:off + n].tobytes()))
        off += n
    return out


def barrier(group: CommGroup = CommGroup.WORLD) -> None:
    ops.barrier(_group(group))


def mp_barrier() -> None:
    barrier(CommGroup.MP_GROUP)


pp_barrier = mp_barrier


def dp_barrier() -> None:
    barrier(CommGroup.DP_GROUP)
