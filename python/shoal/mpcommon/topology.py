"""Where each rank sits: its pipeline (MP) group and its data-parallel (DP) group.

Pure rank arithmetic, no communication. The world is a grid of
``partitions`` x ``dp_size`` ranks. The placement is a permutation of the
letters D and P; as in SageMaker the right-most letter varies fastest over
consecutive ranks:

- ``"DP"`` (``cluster``): a model replica occupies consecutive ranks:
  with 8 ranks and 2 partitions the MP groups are [0,1] [2,3] [4,5] [6,7]
  and the DP groups [0,2,4,6] [1,3,5,7].
- ``"PD"`` (``spread``): a replica is spread out: MP groups [0,4] [1,5]
  [2,6] [3,7], DP groups [0,1,2,3] [4,5,6,7].
"""

from __future__ import annotations

import dataclasses
from typing import List


@dataclasses.dataclass(frozen=True)
class Topology:
    world_size: int
    partitions: int
    order: str = "DP"   # "DP" (cluster) or "PD" (spread)

    def __post_init__(self):
        if self.partitions < 1 or self.world_size % self.partitions:
            raise ValueError(f"{self.partitions} partitions do not divide {self.world_size} ranks")
        if self.order not in ("DP", "PD"):
            raise ValueError(f"order must be 'DP' or 'PD', got {self.order!r}")

    @property
    def dp_size(self) -> int:
        return self.world_size // self.partitions

    def pp_rank(self, rank: int) -> int:
        self._check(rank)
        return rank % self.partitions if self.order == "DP" else rank // self.dp_size

    def dp_rank(self, rank: int) -> int:
        self._check(rank)
        return rank // self.partitions if self.order == "DP" else rank % self.dp_size

    def rank_of(self, pp_rank: int, dp_rank: int) -> int:
        if not (0 <= pp_rank < self.partitions and 0 <= dp_rank < self.dp_size):
            raise ValueError(f"(pp_rank {pp_rank}, dp_rank {dp_rank}) is outside "
                             f"{self.partitions} x {self.dp_size}")
        if self.order == "DP":
            return dp_rank * self.partitions + pp_rank
        return pp_rank * self.dp_size + dp_rank

    def mp_group(self, rank: int) -> List[int]:
        """The world ranks of `rank`'s model replica, indexed by pp_rank."""
        d = self.dp_rank(rank)
        return [self.rank_of(p, d) for p in range(self.partitions)]

    def dp_group(self, rank: int) -> List[int]:
        """The world ranks holding `rank`'s partition, indexed by dp_rank."""
        p = self.pp_rank(rank)
        return [self.rank_of(p, d) for d in range(self.dp_size)]

    def mp_groups(self) -> List[List[int]]:
        return [self.mp_group(self.rank_of(0, d)) for d in range(self.dp_size)]

    def dp_groups(self) -> List[List[int]]:
        return [self.dp_group(self.rank_of(p, 0)) for p in range(self.partitions)]

    def _check(self, rank: int) -> None:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside a world of {self.world_size}")
