"""The SageMaker rank queries, for both front ends (``smp.rank()`` and the rest).

They read the state that the last ``smp.init`` set up (state.py) and raise
the same error before it. Without tensor parallelism the model-parallel (MP)
group is the pipeline (PP) group, and the reduced data-parallel (RDP) group is
the data-parallel (DP) group.
"""

from __future__ import annotations

from typing import Callable, List

from .state import _ACTIVE, current


def _query(name: str, attr: str, doc: str) -> Callable[[], int]:
    """smp.<name>(): the state's `attr`."""
    def query() -> int:
        return getattr(current(), attr)
    query.__name__ = query.__qualname__ = name
    query.__doc__ = doc
    return query


def is_initialized() -> bool:
    return bool(_ACTIVE) and _ACTIVE[0].initialized


rank = _query("rank", "rank", "This process's rank in the world.")
size = _query("size", "world_size", "The number of ranks in the world.")
local_rank = _query("local_rank", "local_rank", "This process's rank among the ranks of its host.")
local_size = _query("local_size", "local_size", "The number of ranks on this host.")
pp_rank = _query("pp_rank", "pp_rank", "The partition this rank holds (its rank in its model replica).")
pp_size = _query("pp_size", "pp_size", "The number of partitions (pipeline stages).")
dp_rank = _query("dp_rank", "dp_rank", "This rank's replica (its rank among the ranks holding its partition).")
dp_size = _query("dp_size", "dp_size", "The number of model replicas.")
tp_rank = _query("tp_rank", "tp_rank", "The rank in the tensor-parallel group (0: tensor parallelism is off).")
tp_size = _query("tp_size", "tp_size", "The tensor-parallel degree (1).")
mp_rank, mp_size = pp_rank, pp_size
rdp_rank, rdp_size = dp_rank, dp_size


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
