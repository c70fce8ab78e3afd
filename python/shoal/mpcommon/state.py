"""The library's process state, free of any framework: what ``smp.init`` decided.

The SageMaker API is a module-level API (``smp.rank()``, ``smp.step``), so the
configuration, the rank layout and the current model live in one object per
front end (``STATE`` of shoal.modelparallel and of
shoal.tensorflow.modelparallel, each a subclass of :class:`State` that adds
its framework's groups). :meth:`State.setup` fills the framework-free part;
the rank queries (ranks.py) and the communication helpers read it.

Names are the SageMaker library's: ``world_size`` (``smp.size()``),
``pp_rank``/``pp_size`` (also ``mp_*`` without tensor parallelism),
``dp_rank``/``dp_size``, ``rdp_*`` (the data-parallel rank among the ranks
of one tensor-parallel slice; equal to ``dp_*`` while the tensor-parallel
degree is 1), ``tp_rank``/``tp_size``.
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
        self.pp_rank = 0
        self.dp_rank = 0
        self.mp_ranks: List[int] = [0]
        self.dp_ranks: List[int] = [0]
        self.model: Any = None            # the DistributedModel of this init

    def setup(self, cfg: C.Config, rank: int, world_size: int, local_rank: int, local_size: int) -> None:
        """The framework-free part of init: the config, the rank layout, a new epoch."""
        self.epoch += 1
        self.cfg = cfg
        self.rank, self.world_size = rank, world_size
        self.local_rank, self.local_size = local_rank, local_size
        self.topo = Topology(world_size, cfg.partitions, C.placement_order(cfg.placement_strategy))
        self.pp_rank = self.topo.pp_rank(rank)
        self.dp_rank = self.topo.dp_rank(rank)
        self.mp_ranks = self.topo.mp_group(rank)
        self.dp_ranks = self.topo.dp_group(rank)
        self.model = None

    @property
    def pp_size(self) -> int:
        return self.cfg.partitions

    @property
    def dp_size(self) -> int:
        return self.world_size // self.cfg.partitions

    @property
    def tp_rank(self) -> int:
        return 0

    @property
    def tp_size(self) -> int:
        return 1

    def who(self) -> str:
        return f"rank {self.rank} (pp_rank {self.pp_rank}, dp_rank {self.dp_rank})"

    def require(self) -> "State":
        """This state, once smp.init has run; else the error every API call gives."""
        if not self.initialized:
            raise SMPValidationError("smp: call smp.init() first")
        return self

    # ------------------------------------------------------------- the helpers' rank checks
    def group_ranks(self, group: CommGroup) -> List[int]:
        """The world ranks of a CommGroup (WORLD, MP/PP, DP) of this rank, in group-rank order."""
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
        # CommGroup and RankType share values: 0 the world, 1 the model replica (MP = PP), 2 data-parallel
        return {0: list(range(self.world_size)), 1: list(self.mp_ranks), 2: list(self.dp_ranks)}[kind]


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
