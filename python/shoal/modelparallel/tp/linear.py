"""Tensor-parallel linear layers.

- ``ColumnLinear`` (query/key/value, dense1): ``weight [out/tp, in]`` and
  ``bias [out/tp]`` split along dim 0; runs on the region's input (already
  entered) and gives this rank's output features.
- ``RowLinear`` (dense, dense2): ``weight [out, in/tp]`` split along dim 1;
  its partial sums leave the region (ops.exit_region) and the replicated
  ``bias [out]`` is added after, on the rank's own batch.
- ``DistributedLinear`` (``smp.nn.DistributedLinear``, an ``nn.Linear``):
  column-parallel; the output is gathered back to all ``out_features`` on the
  rank's own batch.

With one TP rank each is ``nn.Linear`` (same initialisation, same result).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from . import init as tp_init
from . import ops
from .base import DistributedModule


class ColumnLinear(DistributedModule):
    def __init__(self, in_features: int, out_features: int, bias: bool = True, init_std: Optional[float] = None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self._new_param("weight", (out_features, in_features), 0, tp_init.linear_weight(init_std))
        if bias:
            self._new_param("bias", (out_features,), 0, tp_init.linear_bias(in_features, init_std))
        else:
            self.register_parameter("bias", None)

    def forward(self, entered: torch.Tensor) -> torch.Tensor:
        return F.linear(entered, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, tp_size={self.tp_size}"


class RowLinear(DistributedModule):
    def __init__(self, in_features: int, out_features: int, bias: bool = True, init_std: Optional[float] = None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self._new_param("weight", (out_features, in_features), 1, tp_init.linear_weight(init_std))
        if bias:
            self._new_param("bias", (out_features,), None, tp_init.linear_bias(in_features, init_std))
        else:
            self.register_parameter("bias", None)

    def forward(self, entered: torch.Tensor) -> torch.Tensor:
        """The region's last op: [tp*B, ..., in/tp] -> this rank's [B, ..., out]."""
        out = ops.exit_region(F.linear(entered, self.weight), self.tp_env)
        return out if self.bias is None else out + self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, tp_size={self.tp_size}"


class DistributedLinear(DistributedModule, torch.nn.Linear):
    """``nn.Linear(in_features, out_features)`` over the TP group: ``weight [out/tp, in]`` and
    ``bias [out/tp]`` split along dim 0. Input ``[B, ..., in]`` (dim 0 is the batch; each
    TP rank its own unless ``prescaled_batch``), output ``[B, ..., out]``."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None):
        DistributedModule.__init__(self)
        self._check_divisible("out_features", out_features)
        self.in_features, self.out_features = in_features, out_features
        self._new_param("weight", (out_features, in_features), 0, tp_init.linear_weight(None))
        if bias:
            self._new_param("bias", (out_features,), 0, tp_init.linear_bias(in_features, None))
        else:
            self.register_parameter("bias", None)
        if device is not None or dtype is not None:
            self.to(device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        env = self.tp_env
        local = F.linear(ops.enter_region(x, env), self.weight, self.bias)
        return ops.own_rows(ops.gather_dim(local, env, -1), env)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"tp_size={self.tp_size}")
