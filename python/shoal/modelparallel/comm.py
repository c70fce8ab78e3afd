"""Process groups and the SageMaker communication helpers (the rank queries are
shoal.mpcommon.ranks).

The helpers move arbitrary picklable objects (tensors inside them travel as
raw bytes, see transfer.py) over the user groups of state.py, never over the
pipeline's own groups:

- ``send(obj, dest_rank, rank_type)`` / ``recv_from(src_rank, rank_type)``;
- ``broadcast(obj, group)``: a send to every other rank of `group`; the others
  call ``recv_from(sender)`` (as in SageMaker, not a collective);
- ``allgather(obj, group)``: a collective; every rank gets the list by rank;
- ``barrier(group=WORLD)``, ``mp_barrier()``, ``pp_barrier()``, ``dp_barrier()``.

Without tensor parallelism the MP group and the PP group are the same ranks,
and so are the DP and RDP groups.
"""

from __future__ import annotations

from typing import Any, List

import torch.distributed as dist

from . import transfer
from ..mpcommon.groups import (DP_GROUP, MP_GROUP, PP_GROUP, RDP_GROUP, TP_GROUP, WORLD, CommGroup,  # noqa: F401
                               RankType)
from ..mpcommon.errors import SMPValidationError
from .state import require

_USER_TAG = 11


# ----------------------------------------------------------------- process groups

def get_world_process_group():
    return require().world


def get_mp_process_group():
    return require().mp


def get_pp_process_group():
    return require().pp


def get_tp_process_group():
    """The tensor-parallel group (of this rank alone, made on first use, when the degree is 1)."""
    s = require()
    if s.tp is None:
        s.tp = dist.new_group([s.rank], backend="shoal", use_local_synchronization=True)
    return s.tp


def get_dp_process_group():
    return require().dp


def get_rdp_process_group():
    return require().rdp


# ----------------------------------------------------------------- helpers

def _group(group: CommGroup):
    s = require()
    ranks = s.group_ranks(group)
    if group is CommGroup.TP_GROUP:
        return get_tp_process_group(), ranks
    return {CommGroup.WORLD: s.world, CommGroup.MP_GROUP: s.mp, CommGroup.PP_GROUP: s.pp,
            CommGroup.DP_GROUP: s.dp, CommGroup.RDP_GROUP: s.rdp}[group], ranks


def send(obj: Any, dest_rank: int, rank_type: RankType = RankType.WORLD_RANK) -> None:
    s = require()
    dst = s.world_rank(dest_rank, rank_type)
    if dst == s.rank:
        raise SMPValidationError("smp.send: cannot send to this rank itself")
    works, _ = transfer.isend(obj, dst, _USER_TAG, s.world)
    for w in works:
        w.wait()


def recv_from(src_rank: int, rank_type: RankType = RankType.WORLD_RANK) -> Any:
    s = require()
    src = s.world_rank(src_rank, rank_type)
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


def pp_barrier() -> None:
    barrier(CommGroup.PP_GROUP)


def tp_barrier() -> None:
    barrier(CommGroup.TP_GROUP)


def rdp_barrier() -> None:
    barrier(CommGroup.RDP_GROUP)


def dp_barrier() -> None:
    barrier(CommGroup.DP_GROUP)
