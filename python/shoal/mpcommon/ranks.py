"""The SageMaker rank queries, for both front ends (``smp.rank()`` and the rest).

They read the state that the last ``smp.init`` set up (state.py) and raise
the same error before it. Without tensor parallelism the model-parallel (MP)
group is the pipeline (PP) group, and the reduced data-parallel (RDP) group is
the data-parallel (DP) group.
"""

from __future__ import annotations

from typing import List

from .state import _ACTIVE, current


def is_initialized() -> bool:
    return bool(_ACTIVE) and _ACTIVE[0].initialized


def rank() -> int:
    """This process's rank in the world."""
    return current().rank


def size() -> int:
    """The number of ranks in the world."""
    return current().world_size


def local_rank() -> int:
    """This process's rank among the ranks of its host."""
    return current().local_rank


def local_size() -> int:
    return current().local_size


def pp_rank() -> int:
    """The partition this rank holds (its rank in its model replica)."""
    return current().pp_rank


def pp_size() -> int:
    """The number of partitions (pipeline stages)."""
    return current().pp_size


mp_rank, mp_size = pp_rank, pp_size


def dp_rank() -> int:
    """This rank's replica (its rank among the ranks that hold its partition)."""
    return current().dp_rank


def dp_size() -> int:
    """The number of model replicas."""
    return current().dp_size


rdp_rank, rdp_size = dp_rank, dp_size


def tp_rank() -> int:
    """The rank in the tensor-parallel group (0: tensor parallelism is not enabled)."""
    return current().tp_rank


def tp_size() -> int:
    return current().tp_size


def get_mp_group() -> List[int]:
    """The world ranks of this rank's model replica, by mp_rank."""
    return list(current().mp_ranks)


get_pp_group = get_mp_group


def get_dp_group() -> List[int]:
    """The world ranks holding this rank's partition, by dp_rank."""
    return list(current().dp_ranks)


def num_microbatches() -> int:
    return current().cfg.microbatches


__all__ = ["is_initialized", "rank", "size", "local_rank", "local_size", "pp_rank", "pp_size", "mp_rank",
           "mp_size", "dp_rank", "dp_size", "rdp_rank", "rdp_size", "tp_rank", "tp_size", "get_mp_group",
           "get_pp_group", "get_dp_group", "num_microbatches"]
