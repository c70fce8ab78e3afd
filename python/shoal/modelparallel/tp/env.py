"""Where a tensor-parallel module's group comes from: its :class:`TPEnv`.

A module reads :func:`current` once, when it is built, and keeps it: its
shapes (which piece of each tensor it holds) and its collectives follow from
it. ``current()`` is, in order:

- the group given to :func:`use` around the construction (tests, tools that
  drive the modules on a torch.distributed group of their own);
- after ``smp.init`` with ``tensor_parallel_degree`` > 1, the library's TP
  group ``STATE.tpg`` with ``STATE.tp_rank``/``tp_size`` and the config's
  ``prescaled_batch``;
- otherwise one rank: the modules compute exactly what SageMaker's reference
  implementations compute, with no collective.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import torch.distributed as dist

from ..state import STATE


@dataclass(frozen=True)
class TPEnv:
    """A tensor-parallel group as the modules see it.

    group: the torch.distributed group of the TP ranks (None with one rank);
    rank, size: this rank's index in it and its size; prescaled: whether the
    TP ranks read the same batch (SMP's ``prescaled_batch``) or each its own."""

    group: Any
    rank: int
    size: int
    prescaled: bool

    @property
    def parallel(self) -> bool:
        return self.size > 1

    def __deepcopy__(self, memo) -> "TPEnv":
        return self             # a copied module stays on the same group (groups are not copyable)


SINGLE = TPEnv(group=None, rank=0, size=1, prescaled=False)

_OVERRIDE: contextvars.ContextVar[Optional[TPEnv]] = contextvars.ContextVar("shoal_tp_env", default=None)


def current() -> TPEnv:
    """The TP group modules built now belong to (see the module docstring)."""
    env = _OVERRIDE.get()
    if env is not None:
        return env
    if STATE.initialized and STATE.tp_size > 1 and getattr(STATE, "tpg", None) is not None:
        return TPEnv(group=STATE.tpg, rank=STATE.tp_rank, size=STATE.tp_size,
                     prescaled=bool(STATE.cfg.prescaled_batch))
    return SINGLE


@contextlib.contextmanager
def use(group: Any, prescaled: bool = False) -> Iterator[TPEnv]:
    """Modules built inside split over `group` (a torch.distributed group this rank is
    in; None: one rank, no collectives) with the given batch mode."""
    if group is None:
        env = TPEnv(group=None, rank=0, size=1, prescaled=bool(prescaled))
    else:
        env = TPEnv(group=group, rank=dist.get_rank(group), size=dist.get_world_size(group),
                    prescaled=bool(prescaled))
    token = _OVERRIDE.set(env)
    try:
        yield env
    finally:
        _OVERRIDE.reset(token)


def world_rank() -> int:
    """This process's rank in the job (0 without torch.distributed): errors name it."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
