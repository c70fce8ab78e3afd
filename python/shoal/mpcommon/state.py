"""The library's process state, free of any framework: what ``smp.init`` decided.

The SageMaker API is a module-level API (``smp.rank()``, ``smp.step``), so the
configuration, the rank layout and the current model live in one object per
front end (``STATE`` of shoal.modelparallel and of
shoal.tensorflow.modelparallel, each a subclass of :class:`State` that adds
its framework's groups). :meth:`State.setup` fills the framework-free part;
the rank queries (ranks.py) and the communication helpers read it.

Names are the SageMaker library's (topology.py has the layout):
``world_size`` (``smp.size()``), ``pp_*`` (the pipeline), ``tp_*``,
``rdp_*`` (the reduced data-parallel group: the ranks holding the same piece
of the same partition), ``dp_*`` (every rank holding the partition: tp x rdp
of them), ``mp_*`` (one model replica: pp x tp ranks). Each rank list is
sorted by world rank; a rank's rank in a group is its index there.
"""

from __future__ import annotations

from typing import Any, List, Optional

from . import config as C
from .errors import SMPValidationError
from .groups import CommGroup, RankType
from .topology import Topology


class State:
    def __init__(self):
        self.initialized = False
        self.epoch = 0                    # one more per smp.init: models of an earlier init are stale
        self.cfg: Optional[C.Config] = None
        self.topo: Optional[Topology] = None
        self.rank = 0
        self.world_size = 1
        self.local_rank = 0
        self.local_size = 1
        self.pp_rank = self.dp_rank = self.tp_rank = self.rdp_rank = self.mp_rank = 0
        self.pp_ranks: List[int] = [0]
        self.mp_ranks: List[int] = [0]
        self.dp_ranks: List[int] = [0]
        self.tp_ranks: List[int] = [0]
        self.rdp_ranks: List[int] = [0]
        self.model: Any = None            # the DistributedModel of this init

    def setup(self, cfg: C.Config, rank: int, world_size: int, local_rank: int, local_size: int) -> None:
        """The framework-free part of init: the config, the rank layout, a new epoch."""
        self.epoch += 1
        self.cfg = cfg
        self.rank, self.world_size = rank, world_size
        self.local_rank, self.local_size = local_rank, local_size
        self.topo = Topology(world_size, cfg.partitions, cfg.tensor_parallel_degree,
                             C.placement_order(cfg.placement_strategy))
        for kind in ("pp", "mp", "dp", "tp", "rdp"):
            ranks = self.topo.group(kind, rank)
            setattr(self, f"{kind}_ranks", ranks)
            setattr(self, f"{kind}_rank", ranks.index(rank))
        self.model = None

    @property
    def pp_size(self) -> int:
        return len(self.pp_ranks)

    @property
    def dp_size(self) -> int:
        return len(self.dp_ranks)

    @property
    def tp_size(self) -> int:
        return len(self.tp_ranks)

    @property
    def rdp_size(self) -> int:
        return len(self.rdp_ranks)

    @property
    def mp_size(self) -> int:
        return len(self.mp_ranks)

    def who(self) -> str:
        if self.tp_size > 1:
            return (f"rank {self.rank} (pp_rank {self.pp_rank}, tp_rank {self.tp_rank}, "
                    f"rdp_rank {self.rdp_rank})")
        return f"rank {self.rank} (pp_rank {self.pp_rank}, dp_rank {self.dp_rank})"

    def require(self) -> "State":
        """This state, once smp.init has run; else the error every API call gives."""
        if not self.initialized:
            raise SMPValidationError("smp: call smp.init() first")
        return self

    # ------------------------------------------------------------- the helpers' rank checks
    def group_ranks(self, group: CommGroup) -> List[int]:
        """The world ranks of a CommGroup (WORLD, MP, PP, TP, DP, RDP) of this rank, in group-rank order."""
        if not isinstance(group, CommGroup):
            raise SMPValidationError(f"smp: group must be an smp.CommGroup, got {group!r}")
        return self._ranks(group.value)

    def world_rank(self, r: Any, rank_type: RankType) -> int:
        """The world rank of rank `r` of the kind `rank_type` (an smp.RankType), checked."""
        if not isinstance(rank_type, RankType):
            raise SMPValidationError(f"smp: rank_type must be an smp.RankType, got {rank_type!r}")
        ranks = self._ranks(rank_type.value)
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < len(ranks):
            raise SMPValidationError(f"smp ({self.who()}): {rank_type.name.lower()} {r!r} is out of range "
                                     f"0..{len(ranks) - 1}")
        return ranks[r]

    def _ranks(self, kind: int) -> List[int]:
        # CommGroup and RankType share values (groups.py)
        return list({0: range(self.world_size), 1: self.mp_ranks, 2: self.dp_ranks, 3: self.pp_ranks,
                     4: self.tp_ranks, 5: self.rdp_ranks}[kind])


# The state of the front end whose smp.init ran last: a process runs one job with one front end, and
# the rank queries (ranks.py) serve whichever it is.
_ACTIVE: List[State] = []


def activate(state: State) -> None:
    """Called by a front end's init once `state` is set up."""
    _ACTIVE[:] = [state]


def current() -> State:
    """The initialised state (the error every API call gives before smp.init)."""
    if not _ACTIVE:
        raise SMPValidationError("smp: call smp.init() first")
    return _ACTIVE[0].require()
