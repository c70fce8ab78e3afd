"""Tensor parallelism: the distributed modules of ``smp.nn`` and what they are built on.

Bottom up: env (the TP group a module is built for), ops (the autograd
collectives that bound a tensor-parallel region, for both batch modes),
init (full-tensor initialisation, own piece kept), base
(``smp.nn.DistributedModule``), linear, embedding, cross_entropy
(vocabulary-parallel), options (the transformer modules' arguments),
attention, transformer (output layer, layer, transformer), lm_head, shards
(full tensors in and out: ``load_full``, ``gather_full``).

Distributed tensors carry ``_smp_distributed = True`` and
``_smp_split_dim``; the rest of a distributed module's parameters are
replicated over the TP group.

Dropout: the attention-probability dropout runs inside the region (on the
gathered batch, this rank's heads), so with dropout > 0 a tp > 1 model draws
other masks than the tp 1 model (exact agreement needs dropout 0). Dropout
outside the region acts on replicated activations when ``prescaled_batch`` is
True: the TP ranks must then draw the same masks (seed them alike).
"""

from . import env, ops, shards
from .attention import DistributedAttentionLayer
from .base import DistributedModule, is_distributed
from .embedding import DistributedEmbedding
from .linear import DistributedLinear
from .lm_head import DistributedTransformerLMHead
from .transformer import DistributedTransformer, DistributedTransformerLayer, DistributedTransformerOutputLayer

__all__ = ["env", "ops", "shards", "is_distributed", "DistributedModule", "DistributedLinear",
           "DistributedEmbedding", "DistributedAttentionLayer", "DistributedTransformerOutputLayer",
           "DistributedTransformerLayer", "DistributedTransformer", "DistributedTransformerLMHead"]
