"""Tensor-parallel embeddings.

- ``DistributedEmbedding`` (``smp.nn.DistributedEmbedding``): split along the
  embedding dimension, as SageMaker's library does: ``weight [V, H/tp]``
  (split dim 1). The ids enter the region (gathered rows in the own-batch
  mode), each rank looks up its H/tp columns, the columns are all-gathered and
  the rank keeps its own rows: output ``[.., H]`` on the rank's own batch.
- ``VocabParallelEmbedding`` (the word embedding of
  ``DistributedTransformerLMHead``): split along the vocabulary,
  ``weight [V/tp, H]`` (split dim 0). Each rank looks up the ids in its range
  (rows of other ranks' ids are zero) and the partial sums leave the region:
  output ``[.., H]`` on the rank's own batch.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ...mpcommon.errors import SMPUnsupportedError
from . import init as tp_init
from . import ops
from .base import DistributedModule


class DistributedEmbedding(DistributedModule):
    """``nn.Embedding`` split along ``embedding_dim``. The weight is drawn from
    normal(0, ``initializer_range``) (the padding row zero), or copied from ``_weight``
    (the full ``[num_embeddings, embedding_dim]`` tensor). ``max_norm`` (it renormalises
    whole rows, which no rank holds), ``sparse`` and SageMaker's internal ``_skip_*``
    switches are refused."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: Optional[int] = None,
                 max_norm: Optional[float] = None, norm_type: float = 2.0, scale_grad_by_freq: bool = False,
                 sparse: bool = False, _weight: Optional[torch.Tensor] = None, initializer_range: float = 0.02,
                 _skip_allgather: bool = False, _skip_scatter_and_merge: bool = False):
        super().__init__()
        self._check_divisible("embedding_dim", embedding_dim)
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise self._error(f"padding_idx {padding_idx} is out of range for num_embeddings {num_embeddings}")
            padding_idx %= num_embeddings
        for name, value in (("max_norm", max_norm is not None), ("sparse", sparse),
                            ("_skip_allgather", _skip_allgather), ("_skip_scatter_and_merge", _skip_scatter_and_merge)):
            if value:
                raise SMPUnsupportedError(f"smp.nn.DistributedEmbedding: {name} is not supported by shoal's "
                                          f"embedding-dimension split")
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.padding_idx, self.norm_type, self.scale_grad_by_freq = padding_idx, norm_type, scale_grad_by_freq
        self._new_param("weight", (num_embeddings, embedding_dim), 1,
                        tp_init.embedding_weight(initializer_range, padding_idx))
        if _weight is not None:
            if tuple(_weight.shape) != (num_embeddings, embedding_dim):
                raise self._error(f"_weight has shape {tuple(_weight.shape)}, expected "
                                  f"{(num_embeddings, embedding_dim)}")
            tp_init.copy_piece(self.weight, _weight, 1, self.tp_env)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        env = self.tp_env
        local = F.embedding(ops.enter_side(ids, env), self.weight, self.padding_idx, None, self.norm_type,
                            self.scale_grad_by_freq, False)
        return ops.own_rows(ops.gather_dim(local, env, -1), env)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, padding_idx={self.padding_idx}, tp_size={self.tp_size}"


class VocabParallelEmbedding(DistributedModule):
    """The LM head's word embedding: ``weight [V/tp, H]``, rows ``tp_rank*V/tp ..`` of the
    full table. ``forward(ids)`` takes this rank's ids and returns its ``[B, .., H]`` (the ids
    enter the region and the sums exit it inside)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, init_std: Optional[float]):
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.vocab_start = self.tp_rank * (num_embeddings // self.tp_size)
        self._new_param("weight", (num_embeddings, embedding_dim), 0, tp_init.embedding_weight(init_std))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ops.enter_side(ids, self.tp_env) - self.vocab_start
        outside = (local < 0) | (local >= self.weight.shape[0])
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        out = out.masked_fill(outside.unsqueeze(-1), 0.0)
        return ops.exit_region(out, self.tp_env)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, tp_size={self.tp_size}"
