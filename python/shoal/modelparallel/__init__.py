"""shoal.modelparallel: pipeline parallelism with the SageMaker model-parallel API (v1).

    import shoal.modelparallel as smp        # or: import smdistributed.modelparallel.torch as smp
    smp.init({"partitions": 2, "microbatches": 4})
    model = smp.DistributedModel(model)
    optimizer = smp.DistributedOptimizer(optimizer)

    @smp.step
    def train_step(model, data, target):
        output = model(data)
        loss = F.nll_loss(output, target)
        model.backward(loss)
        return loss

    loss = train_step(model, data, target).reduce_mean()
    optimizer.step()

See docs/modelparallel.md. The modules, bottom up: config (keys), topology
(rank layout), state (init and groups), failure (errors reach every rank),
comm (rank queries and helpers), transfer (nested values between ranks),
tracing (measuring modules), graph (torch.fx capture), placement (auto and manual partitioning),
stages (segments and edges), schedule (task orders), grads (DP averaging),
pipeline (the executor), runtime (the partitioned model), model, optimizer,
steps (@smp.step), checkpoint, clip, amp, timeline.
"""

from . import amp, nn, optimizers, patches, timeline
from .activation_checkpointing import set_activation_checkpointing
from .checkpoint import load, resume_from_checkpoint, save, save_checkpoint
from .clip import clip_grad_norm_
from .comm import (DP_GROUP, MP_GROUP, PP_GROUP, RDP_GROUP, TP_GROUP, WORLD, CommGroup, RankType, allgather,
                   barrier, broadcast, dp_barrier, get_dp_process_group, get_mp_process_group,
                   get_pp_process_group, get_rdp_process_group, get_tp_process_group, get_world_process_group,
                   mp_barrier, pp_barrier, rdp_barrier, recv_from, send, tp_barrier)
from ..mpcommon.ranks import (dp_rank, dp_size, get_dp_group, get_mp_group, get_pp_group, get_rdp_group,
                              get_tp_group, is_initialized, local_rank, local_size, mp_rank, mp_size,
                              num_microbatches, pp_rank, pp_size, rank, rdp_rank, rdp_size, size, tp_rank, tp_size)
from ..mpcommon.config import Config
from ..mpcommon.errors import (SMPConfigError, SMPError, SMPRemoteError, SMPTraceError, SMPUnsupportedError,
                     SMPValidationError)
from .creation import delay_param_initialization, model_creation
from .model import DistributedModel
from .optimizer import DistributedOptimizer
from .placement import partition, set_partition
from .state import STATE as state  # smp.state.cfg: every resolved config key (SageMaker's name)
from .state import init, shutdown
from .steps import StepOutput, step
from .tensor_parallel import set_tensor_parallelism, tensor_parallelism, tp_register, tp_register_with_module
from .tracing import is_tracing

__all__ = [
    "init", "shutdown", "is_initialized", "is_tracing", "Config",
    "rank", "size", "local_rank", "local_size", "pp_rank", "pp_size", "mp_rank", "mp_size", "dp_rank",
    "dp_size", "rdp_rank", "rdp_size", "tp_rank", "tp_size", "get_mp_group", "get_pp_group", "get_dp_group",
    "get_tp_group", "get_rdp_group", "get_tp_process_group", "get_rdp_process_group",
    "get_mp_process_group", "get_pp_process_group", "get_dp_process_group", "get_world_process_group",
    "DistributedModel", "DistributedOptimizer", "partition", "set_partition", "step", "StepOutput",
    "CommGroup", "RankType", "WORLD", "MP_GROUP", "PP_GROUP", "DP_GROUP", "TP_GROUP", "RDP_GROUP",
    "broadcast", "send", "recv_from", "allgather", "barrier", "mp_barrier", "pp_barrier", "dp_barrier",
    "tp_barrier", "rdp_barrier",
    "save", "load", "save_checkpoint", "resume_from_checkpoint", "clip_grad_norm_", "amp", "timeline",
    "SMPError", "SMPConfigError", "SMPUnsupportedError", "SMPValidationError", "SMPTraceError",
    "SMPRemoteError", "num_microbatches", "state", "nn", "optimizers", "patches", "set_activation_checkpointing",
    "model_creation", "delay_param_initialization", "tensor_parallelism", "set_tensor_parallelism",
    "tp_register", "tp_register_with_module",
]
