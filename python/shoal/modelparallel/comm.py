"""Rank queries, process groups and the SageMaker communication helpers.

The helpers move arbitrary picklable objects (tensors inside them travel as
raw bytes, see transfer.py) over the user groups of state.py, never over the
pipeline's own groups:

- ``send(obj, dest_rank, rank_type)`` / ``recv_from(src_rank, rank_type)``;
- ``broadcast(obj, group)``: a send to every other rank of `group`; the others
  call ``recv_from(sender)`` (as in SageMaker, not a collective);
- ``allgather(obj, group)``: a collective; every rank gets the list by rank;
- ``barrier(group=WORLD)``, ``mp_barrier()``, ``pp_barrier()``, ``dp_barrier()``.

Without tensor parallelism the MP group and the PP group are the same ranks.
"""

from __future__ import annotations

from typing import Any, List

import torch.distributed as dist

from . import transfer
from ..mpcommon.groups import DP_GROUP, MP_GROUP, PP_GROUP, WORLD, CommGroup, RankType  # noqa: F401
from ..mpcommon.errors import SMPValidationError
from .state import require

_USER_TAG = 11


# ----------------------------------------------------------------- ranks

def is_initialized() -> bool:
    from .state import STATE
    return STATE.initialized


def rank() -> int:
    return require().rank


def size() -> int:
    return require().world_size


def local_rank() -> int:
    return require().local_rank


def local_size() -> int:
    return require().local_size


def pp_rank() -> int:
    return require().pp_rank


def pp_size() -> int:
    return require().pp_size


def dp_rank() -> int:
    return require().dp_rank


def dp_size() -> int:
    return require().dp_size


mp_rank = pp_rank
mp_size = pp_size


def rdp_rank() -> int:
    """Reduced-data-parallel rank; equal to dp_rank without tensor parallelism."""
    return dp_rank()


def rdp_size() -> int:
    return dp_size()


def tp_rank() -> int:
    """Always 0: shoal does not implement tensor parallelism."""
    require()
    return 0


def tp_size() -> int:
    require()
    return 1


def get_mp_group() -> List[int]:
    """The world ranks of this rank's model replica, by mp_rank."""
    return list(require().mp_ranks)


get_pp_group = get_mp_group


def get_dp_group() -> List[int]:
    """The world ranks holding this rank's partition, by dp_rank."""
    return list(require().dp_ranks)


def get_world_process_group():
    return require().world


def get_mp_process_group():
    return require().mp


get_pp_process_group = get_mp_process_group


def get_dp_process_group():
    return require().dp


# ----------------------------------------------------------------- helpers

def _group(group: CommGroup):
    s = require()
    if not isinstance(group, CommGroup):
        raise SMPValidationError(f"smp: group must be an smp.CommGroup, got {group!r}")
    return {CommGroup.WORLD: (s.world, list(range(s.world_size))),
            CommGroup.MP_GROUP: (s.mp, s.mp_ranks),
            CommGroup.DP_GROUP: (s.dp, s.dp_ranks)}[group]


def _world_rank(r: int, rank_type: RankType) -> int:
    s = require()
    if not isinstance(rank_type, RankType):
        raise SMPValidationError(f"smp: rank_type must be an smp.RankType, got {rank_type!r}")
    ranks = {RankType.WORLD_RANK: list(range(s.world_size)), RankType.MP_RANK: s.mp_ranks,
             RankType.DP_RANK: s.dp_ranks}[rank_type]
    if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < len(ranks):
        raise SMPValidationError(f"smp: {rank_type.name.lower()} {r!r} is out of range 0..{len(ranks) - 1}")
    return ranks[r]


def send(obj: Any, dest_rank: int, rank_type: RankType = RankType.WORLD_RANK) -> None:
    s = require()
    dst = _world_rank(dest_rank, rank_type)
    if dst == s.rank:
        raise SMPValidationError("smp.send: cannot send to this rank itself")
    works, _ = transfer.isend(obj, dst, _USER_TAG, s.world)
    for w in works:
        w.wait()


def recv_from(src_rank: int, rank_type: RankType = RankType.WORLD_RANK) -> Any:
    s = require()
    src = _world_rank(src_rank, rank_type)
    if src == s.rank:
        raise SMPValidationError("smp.recv_from: cannot receive from this rank itself")
    obj, _ = transfer.recv(src, _USER_TAG, s.world)
    return obj


def broadcast(obj: Any, group: CommGroup = CommGroup.WORLD) -> None:
    s = require()
    _, ranks = _group(group)
    works = []
    for r in ranks:
        if r != s.rank:
            works += transfer.isend(obj, r, _USER_TAG, s.world)[0]
    for w in works:
        w.wait()


def allgather(obj: Any, group: CommGroup = CommGroup.WORLD) -> List[Any]:
    g, ranks = _group(group)
    out: List[Any] = [None] * len(ranks)
    dist.all_gather_object(out, obj, group=g)
    return out


def barrier(group: CommGroup = CommGroup.WORLD) -> None:
    g, _ = _group(group)
    dist.barrier(group=g)


def mp_barrier() -> None:
    barrier(CommGroup.MP_GROUP)


pp_barrier = mp_barrier


def dp_barrier() -> None:
    barrier(CommGroup.DP_GROUP)
