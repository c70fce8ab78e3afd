"""``smp.nn.DistributedModule``: the base class of every tensor-parallel module.

A distributed module reads its TP group once, when it is built (env.py), and
keeps it as ``tp_env``. It marks every tensor it shards with
``_smp_distributed = True`` and ``_smp_split_dim = d``: the full tensor is
chunked contiguously along ``d`` into ``tp_size`` equal pieces and this rank
holds piece ``tp_rank``. Unmarked parameters are replicated over the TP group.
Bad constructor arguments raise :class:`SMPValidationError` naming the class,
the argument and the rank before anything is sent.
"""

from __future__ import annotations

from typing import Optional

import torch

from ...mpcommon.errors import SMPValidationError
from . import env as tp_env_mod
from . import init as tp_init


class DistributedModule(torch.nn.Module):
    def __init__(self):
        # nn.Module's own init, not the next class in the MRO: DistributedLinear is also an nn.Linear
        torch.nn.Module.__init__(self)
        self.tp_env = tp_env_mod.current()
        self._tp_fills = {}    # parameter name -> (full shape, split dim, fill): reset_parameters redraws

    @property
    def tp_rank(self) -> int:
        return self.tp_env.rank

    @property
    def tp_size(self) -> int:
        return self.tp_env.size

    # ------------------------------------------------------------ construction helpers
    def _error(self, what: str) -> SMPValidationError:
        return SMPValidationError(f"smp.nn.{type(self).__name__} (rank {tp_env_mod.world_rank()}, "
                                  f"tp_size {self.tp_size}): {what}")

    def _check_divisible(self, name: str, value: int) -> None:
        if value % self.tp_size:
            raise self._error(f"{name} {value} is not divisible by tp_size {self.tp_size}")

    def _new_param(self, name: str, full_shape, split_dim: Optional[int], fill: tp_init.Fill) -> torch.nn.Parameter:
        """Registers parameter `name` holding this rank's piece of a tensor of `full_shape`, drawn
        with `fill` (init.py); marked distributed when `split_dim` is not None."""
        shape = list(full_shape)
        if split_dim is not None:
            shape[split_dim] //= self.tp_size
        self.register_parameter(name, torch.nn.Parameter(torch.empty(shape)))
        p = getattr(self, name)            # the registered object (delayed initialisation replaces it)
        if split_dim is not None:
            p._smp_distributed = True
            p._smp_split_dim = split_dim
        self._tp_fills[name] = (tuple(full_shape), split_dim, fill)
        tp_init.full_then_piece(p, full_shape, split_dim, fill, self.tp_env)
        return p

    def reset_parameters(self) -> None:
        """Draws this module's own parameters again, as at construction (full tensor, own piece)."""
        for name, (full_shape, split_dim, fill) in self._tp_fills.items():
            tp_init.full_then_piece(getattr(self, name), full_shape, split_dim, fill, self.tp_env)


def is_distributed(t: torch.Tensor) -> bool:
    """Whether `t` is a piece of a tensor split over the TP group."""
    return bool(getattr(t, "_smp_distributed", False))
