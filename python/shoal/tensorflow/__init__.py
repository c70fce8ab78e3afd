"""shoal for TensorFlow 2: collectives as TensorFlow ops and data parallelism
(docs/tensorflow.md). ``smdistributed.dataparallel.tensorflow`` is this API
under SageMaker's names; ``smdistributed.modelparallel.tensorflow`` is the
pipeline (shoal.tensorflow.modelparallel)."""

from .data_parallel import (BroadcastGlobalVariablesCallback, DistributedGradientTape, DistributedOptimizer,
                            broadcast_global_variables, broadcast_variables, reduce_gradients)
from .ops import (Group, ShoalTFError, allgather, allreduce, allreduce_n, alltoall, barrier, broadcast, default_group,
                  group_rank, group_size, init, is_initialized, local_rank, local_size, new_group, rank, recv,
                  reduce_scatter, send, set_default_group, shutdown, size, wait_sends)

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "new_group", "Group",
    "set_default_group", "default_group", "group_rank", "group_size",
    "allreduce", "allreduce_n", "allgather", "broadcast", "alltoall", "reduce_scatter", "barrier", "send", "recv", "wait_sends",
    "DistributedGradientTape", "DistributedOptimizer", "broadcast_variables", "broadcast_global_variables",
    "BroadcastGlobalVariablesCallback", "reduce_gradients", "ShoalTFError",
]
