"""Where each rank sits in the grid of pipeline (P), tensor (T) and reduced-data (D) parallelism.

Pure rank arithmetic, no communication. The world is a grid of
``pp_size x tp_size x rdp_size`` ranks. The placement is a permutation of the
letters D, P and T; as in SageMaker the right-most letter varies fastest over
consecutive ranks (``cluster`` = ``DPT``, ``spread`` = ``TPD``). With 8 ranks,
2 partitions and tensor-parallel degree 2:

- ``DPT``: rank = rdp*4 + pp*2 + tp: tensor-parallel pairs [0,1] [2,3] ...,
  pipelines [0,2] [1,3] [4,6] [5,7];
- ``PTD``: rank = pp*4 + tp*2 + rdp: reduced-data pairs [0,1] [2,3] ...

The groups of a rank, each sorted by world rank (a rank's rank in a group is
its index there):

- ``pp`` (pipeline): same tp and rdp coordinates; indexed by pp_rank;
- ``tp``: same pp and rdp; ``rdp``: same pp and tp;
- ``dp``: same pp (the tp x rdp ranks holding this partition, whole or in
  tensor-parallel pieces);
- ``mp`` (one model replica): same rdp (pp x tp ranks).

Without tensor parallelism MP = PP and DP = RDP, and ``DP``/``PD`` name the
same layouts as ``DPT``/``PDT``.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Tuple

AXES = "DPT"


@dataclasses.dataclass(frozen=True)
class Topology:
    world_size: int
    partitions: int
    tp_size: int = 1
    order: str = "DPT"   # a permutation of D, P, T; the right-most letter varies fastest

    def __post_init__(self):
        if self.partitions < 1 or self.tp_size < 1 or self.world_size % (self.partitions * self.tp_size):
            raise ValueError(f"{self.partitions} partitions x tensor-parallel degree {self.tp_size} do not "
                             f"divide {self.world_size} ranks")
        if sorted(self.order) != sorted(AXES):
            raise ValueError(f"order must be a permutation of 'DPT', got {self.order!r}")

    # --------------------------------------------------------------- sizes and coordinates
    @property
    def rdp_size(self) -> int:
        return self.world_size // (self.partitions * self.tp_size)

    @property
    def dp_size(self) -> int:
        return self.world_size // self.partitions

    def _sizes(self) -> Dict[str, int]:
        return {"D": self.rdp_size, "P": self.partitions, "T": self.tp_size}

    def coords(self, rank: int) -> Tuple[int, int, int]:
        """(rdp_rank, pp_rank, tp_rank) of a world rank."""
        self._check(rank)
        sizes, c, r = self._sizes(), {}, rank
        for axis in reversed(self.order):
            c[axis], r = r % sizes[axis], r // sizes[axis]
        return c["D"], c["P"], c["T"]

    def rank_of(self, rdp_rank: int, pp_rank: int, tp_rank: int = 0) -> int:
        sizes, c = self._sizes(), {"D": rdp_rank, "P": pp_rank, "T": tp_rank}
        if not all(0 <= c[a] < sizes[a] for a in AXES):
            raise ValueError(f"(rdp {rdp_rank}, pp {pp_rank}, tp {tp_rank}) is outside "
                             f"{self.rdp_size} x {self.partitions} x {self.tp_size}")
        rank = 0
        for axis in self.order:
            rank = rank * sizes[axis] + c[axis]
        return rank

    def pp_rank(self, rank: int) -> int:
        return self.coords(rank)[1]

    def tp_rank(self, rank: int) -> int:
        return self.coords(rank)[2]

    def rdp_rank(self, rank: int) -> int:
        return self.coords(rank)[0]

    # --------------------------------------------------------------- groups
    def group(self, kind: str, rank: int) -> List[int]:
        """The world ranks of `rank`'s group of `kind` ('pp', 'tp', 'rdp', 'dp', 'mp'), sorted."""
        return sorted(r for r in range(self.world_size) if self._key(kind, r) == self._key(kind, rank))

    def groups(self, kind: str) -> List[List[int]]:
        """Every group of `kind`, in the order of their lowest rank (the order ranks create them in)."""
        seen: Dict[tuple, List[int]] = {}
        for r in range(self.world_size):
            seen.setdefault(self._key(kind, r), []).append(r)
        return sorted(seen.values())

    def _key(self, kind: str, rank: int) -> tuple:
        d, p, t = self.coords(rank)
        keys = {"pp": (t, d), "tp": (p, d), "rdp": (p, t), "dp": (p,), "mp": (d,)}
        if kind not in keys:
            raise ValueError(f"unknown group kind {kind!r}")
        return keys[kind]

    def _check(self, rank: int) -> None:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside a world of {self.world_size}")
