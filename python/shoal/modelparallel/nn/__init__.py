"""``smp.nn``: the SageMaker library's modules (``from smdistributed.modelparallel.torch.nn import ...``).

The tensor-parallel modules (``DistributedModule`` and its subclasses
``DistributedLinear``, ``DistributedEmbedding``, ``DistributedAttentionLayer``,
``DistributedTransformerOutputLayer``, ``DistributedTransformerLayer``,
``DistributedTransformer``, ``DistributedTransformerLMHead``) live in
shoal.modelparallel.tp (see its docstring).

``FusedLayerNorm(normalized_shape, eps=1e-5, elementwise_affine=True)`` has apex's
signature and is an ``nn.LayerNorm`` (a subclass: same parameters ``weight``
and ``bias``, same state_dict keys, ``isinstance(m, nn.LayerNorm)`` holds, so
code that treats LayerNorms specially, e.g. excluding them from weight decay,
keeps working). Its forward is ``torch.nn.functional.layer_norm``, which
dispatches to torch's fused native layer-norm kernel (one pass for the
statistics and the affine transform, forward and backward) on every device and
dtype torch supports; the results are those of ``nn.LayerNorm`` bit for bit.
apex's ``memory_efficient`` is accepted and has no effect.
"""

from __future__ import annotations

from typing import List, Union

import torch
import torch.nn.functional as F

from ..tp import (DistributedAttentionLayer, DistributedEmbedding, DistributedLinear, DistributedModule,
                  DistributedTransformer, DistributedTransformerLayer, DistributedTransformerLMHead,
                  DistributedTransformerOutputLayer)

__all__ = ["FusedLayerNorm", "DistributedModule", "DistributedLinear", "DistributedEmbedding",
           "DistributedAttentionLayer", "DistributedTransformerOutputLayer", "DistributedTransformerLayer",
           "DistributedTransformer", "DistributedTransformerLMHead"]


class FusedLayerNorm(torch.nn.LayerNorm):
    def __init__(self, normalized_shape: Union[int, List[int], torch.Size], eps: float = 1e-5,
                 elementwise_affine: bool = True, *, memory_efficient: bool = False, bias: bool = True,
                 device=None, dtype=None):
        super().__init__(normalized_shape, eps=eps, elementwise_affine=elementwise_affine, bias=bias,
                         device=device, dtype=dtype)
        self.memory_efficient = memory_efficient

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)
