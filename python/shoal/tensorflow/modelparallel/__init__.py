"""The SageMaker model-parallel library's TensorFlow 2 API on shoal
(``smdistributed.modelparallel.tensorflow`` is this module).

    import shoal.tensorflow.modelparallel as smp
    smp.init({"partitions": 2, "microbatches": 4})

    class Net(smp.DistributedModel):
        def __init__(self):
            super().__init__()
            self.d1, self.d2 = Dense(64, activation="relu"), Dense(10)
        def call(self, x):
            return self.d2(self.d1(x))

    @smp.step
    def get_grads(x, y):
        loss = loss_fn(y, model(x))
        return optimizer.get_gradients(loss, model.trainable_variables), loss

    grads, loss = get_grads(x, y)
    optimizer.apply_gradients(zip([g.accumulate() for g in grads], model.trainable_variables))

See docs/tensorflow.md (the pipeline, what differs from SageMaker's library).
"""

from ...mpcommon.config import Config
from ...mpcommon.errors import (SMPConfigError, SMPError, SMPTraceError, SMPUnsupportedError,
                                SMPValidationError)
from .checkpoint import CheckpointManager
from ...mpcommon.ranks import (dp_rank, dp_size, get_dp_group, get_mp_group, get_pp_group, is_initialized,
                               local_rank, local_size, mp_rank, mp_size, num_microbatches, pp_rank, pp_size, rank,
                               rdp_rank, rdp_size, size, tp_rank, tp_size)
from .. import compat
from .model import DistributedModel, partition
from .state import (DP_GROUP, MP_GROUP, PP_GROUP, WORLD, CommGroup, RankType, allgather, barrier, broadcast,
                    dp_barrier, mp_barrier, pp_barrier, recv_from, send, shutdown)
from .state import init as _init
from .step import StepOutput, install_gradient_hooks, step


def init(config=None) -> None:
    """Initialises the library (config: a dict, else SHOAL_MP_CONFIG, else SM_HP_MP_PARAMETERS)."""
    _init(config)
    install_gradient_hooks()
    compat.install()


__all__ = [
    "init", "shutdown", "is_initialized", "Config", "rank", "size", "local_rank", "local_size", "pp_rank", "pp_size", "mp_rank",
    "mp_size", "dp_rank", "dp_size", "rdp_rank", "rdp_size", "tp_rank", "tp_size", "get_mp_group", "get_pp_group",
    "get_dp_group", "num_microbatches", "DistributedModel", "partition", "step", "StepOutput", "CheckpointManager",
    "CommGroup", "RankType", "WORLD", "MP_GROUP", "PP_GROUP", "DP_GROUP", "broadcast", "send", "recv_from",
    "allgather", "barrier", "mp_barrier", "pp_barrier", "dp_barrier",
    "SMPError", "SMPConfigError", "SMPUnsupportedError", "SMPValidationError", "SMPTraceError",
]
