"""The SageMaker rank queries, for both front ends (``smp.rank()`` and the rest).

They read the state that the last ``smp.init`` set up (state.py) and raise
the same error before it. topology.py says what each group is; without tensor
parallelism the model-parallel (MP) group is the pipeline (PP) group, and the
reduced data-parallel (RDP) group is the data-parallel (DP) group.
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
pp_rank = _query("pp_rank", "pp_rank", "The partition this rank holds (its rank in its pipeline).")
pp_size = _query("pp_size", "pp_size", "The number of partitions (pipeline stages).")
tp_rank = _query("tp_rank", "tp_rank", "The rank in the tensor-parallel group (0: tensor parallelism is off).")
tp_size = _query("tp_size", "tp_size", "The tensor-parallel degree.")
mp_rank = _query("mp_rank", "mp_rank", "The rank in this model replica (pipeline x tensor parallel).")
mp_size = _query("mp_size", "mp_size", "The ranks of one model replica: pp_size x tp_size.")
dp_rank = _query("dp_rank", "dp_rank", "The rank among every rank holding this partition (whole or in pieces).")
dp_size = _query("dp_size", "dp_size", "The ranks holding this partition: tp_size x rdp_size.")
rdp_rank = _query("rdp_rank", "rdp_rank", "The rank among the ranks holding the same piece of this partition.")
rdp_size = _query("rdp_size", "rdp_size", "The number of full model replicas (world / pp_size / tp_size).")


def _group_query(name: str, attr: str, doc: str) -> Callable[[], List[int]]:
    """smp.get_<name>(): the world ranks of the state's group `attr`, by rank in the group."""
    def query() -> List[int]:
        return list(getattr(current(), attr))
    query.__name__ = query.__qualname__ = name
    query.__doc__ = doc
    return query


get_mp_group = _group_query("get_mp_group", "mp_ranks", "The world ranks of this rank's model replica.")
get_pp_group = _group_query("get_pp_group", "pp_ranks", "The world ranks of this rank's pipeline, by pp_rank.")
get_tp_group = _group_query("get_tp_group", "tp_ranks", "The world ranks sharing this rank's tensor-parallel "
                            "modules, by tp_rank.")
get_dp_group = _group_query("get_dp_group", "dp_ranks", "The world ranks holding this rank's partition.")
get_rdp_group = _group_query("get_rdp_group", "rdp_ranks", "The world ranks holding the same piece of this "
                             "rank's partition, by rdp_rank.")


def num_microbatches() -> int:
    return current().cfg.microbatches


__all__ = ["is_initialized", "rank", "size", "local_rank", "local_size", "pp_rank", "pp_size", "mp_rank",
           "mp_size", "dp_rank", "dp_size", "rdp_rank", "rdp_size", "tp_rank", "tp_size", "get_mp_group",
           "get_pp_group", "get_tp_group", "get_dp_group", "get_rdp_group", "num_microbatches"]
