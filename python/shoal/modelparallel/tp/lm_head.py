"""``smp.nn.DistributedTransformerLMHead``: embeddings, a DistributedTransformer and a tied LM head.

Modules: ``word_embedding`` (vocabulary-parallel, ``weight [V/tp, H]`` split
dim 0), ``position_embedding`` (an ``nn.Embedding``, replicated; none with
``num_positions=0``, e.g. GPT-J whose positions are rotary),
``token_type_embedding`` (with ``num_token_types`` > 0, replicated),
``embedding_dropout``, ``transformer`` (its layers are
``transformer.seq_layers``). The LM head is the word embedding's weight (no
parameter of its own), or with ``tie_lm_head=False`` a vocabulary-parallel
``lm_head_weight [V/tp, H]`` (split dim 0); ``lm_head_bias=True`` adds a
vocabulary-parallel ``lm_head_bias [V/tp]``.

The logits stay vocabulary-parallel (``[tp*B, S, V/tp]`` on each rank in the
own-batch mode) for the loss: a vocabulary-parallel cross entropy
(cross_entropy.py) gives the per-token losses of the gathered batch, the rank
keeps its own rows and averages them over its tokens whose label is not
``-100``. With ``shift_labels=True`` the loss is Hugging Face's causal-LM loss
(the logits of position i predict the label of position i+1). The full logits,
when returned (``return_logits=True``), are gathered over the vocabulary, the
rank's own rows.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from . import init as tp_init
from . import ops
from . import options as O
from .base import DistributedModule
from .cross_entropy import vocab_parallel_cross_entropy
from .embedding import VocabParallelEmbedding
from .transformer import DistributedTransformer


class DistributedTransformerLMHead(DistributedModule):
    """forward((input_ids, attention_mask, token_type_ids, position_ids, labels)); with
    ``add_cross_attention``: forward((input_ids, attention_mask, token_type_ids, position_ids,
    cross_states, cross_states, cross_mask, labels)) (SageMaker's tuple; the second
    ``cross_states`` is not read).

    ``input_ids [N, S]``; ``attention_mask`` (and ``cross_mask``) 0-1 ``[N, S]`` with 1 at
    MASKED positions, or None; ``token_type_ids``/``position_ids`` ``[N, S]`` or None
    (positions 0..S-1; not read with ``num_positions=0``); ``labels [N, S]`` or None, -100
    ignored.

    Returns, with ``add_lm_head`` (the default), the tuple ``(loss, logits)``: ``loss`` the mean
    float32 cross entropy over this rank's labelled tokens (None without labels), ``logits``
    ``[N, S, vocab_size]`` (None with ``return_logits=False``). Without the LM head it
    returns the transformer's output ``[N, S, H]``."""

    def __init__(self, num_layers: int = 12, num_attention_heads: int = 32, attention_head_size: int = 32,
                 hidden_size: int = 1024, intermediate_size: int = 4096, vocab_size: int = 30522,
                 num_positions: int = 1024, attention_dropout_prob: float = 0.1, hidden_dropout_prob: float = 0.1,
                 activation: str = "gelu", layernorm_epsilon: float = 1e-5, num_token_types: int = 0,
                 causal_mask_size: Optional[int] = None, add_cross_attention: bool = False, add_lm_head: bool = True,
                 initializer_range: float = 0.02, use_normal_initialization: bool = False,
                 pre_layernorm: bool = False, post_layernorm: bool = True, *, tie_lm_head: bool = True,
                 lm_head_bias: bool = False, shift_labels: bool = False, return_logits: bool = True,
                 **extensions):
        super().__init__()
        o = O.make(type(self).__name__, dict(locals()), extensions)
        if vocab_size <= 0 or num_positions < 0:
            raise self._error(f"vocab_size {vocab_size} must be positive and num_positions {num_positions} "
                              f"not negative")
        self._check_divisible("vocab_size", vocab_size)
        O.check_attention(self, O.Options(**o.kwargs(attention_layers=None, parallel_attn_output=False)))
        O.check_output(self, o)
        self.opts = o
        self.vocab_size, self.num_positions, self.num_token_types = vocab_size, num_positions, num_token_types
        self.add_lm_head, self.shift_labels, self.return_logits = add_lm_head, shift_labels, return_logits
        self.tie_lm_head = tie_lm_head
        std = o.init_std
        self.word_embedding = VocabParallelEmbedding(vocab_size, hidden_size, std)
        if num_positions > 0:
            self.position_embedding = torch.nn.Embedding(num_positions, hidden_size)
            self._redraw(self.position_embedding.weight, std)
        if num_token_types > 0:
            self.token_type_embedding = torch.nn.Embedding(num_token_types, hidden_size)
            self._redraw(self.token_type_embedding.weight, std)
        self.embedding_dropout = torch.nn.Dropout(hidden_dropout_prob)
        self.transformer = DistributedTransformer(num_layers, **o.kwargs())
        if add_lm_head and not tie_lm_head:
            self._new_param("lm_head_weight", (vocab_size, hidden_size), 0, tp_init.linear_weight(std))
        if add_lm_head and lm_head_bias:
            self._new_param("lm_head_bias", (vocab_size,), 0, tp_init.zeros)
        else:
            self.register_parameter("lm_head_bias", None)

    @staticmethod
    def _redraw(weight: torch.Tensor, std: Optional[float]) -> None:
        if std is not None and not weight.is_meta:
            with torch.no_grad():
                weight.normal_(0.0, std)

    def forward(self, inputs):
        if self.opts.add_cross_attention:
            if len(inputs) == 8:
                input_ids, attention_mask, token_type_ids, position_ids, cross_states, _, cross_mask, labels = inputs
            else:
                input_ids, attention_mask, token_type_ids, position_ids, cross_states, cross_mask, labels = inputs
        else:
            input_ids, attention_mask, token_type_ids, position_ids, labels = inputs
        env = self.tp_env
        h = self.word_embedding(ops.enter_side(input_ids, env))
        if self.num_positions > 0:
            if position_ids is None:
                position_ids = torch.arange(input_ids.shape[-1], device=input_ids.device).expand_as(input_ids)
            h = h + self.position_embedding(position_ids)
        if token_type_ids is not None and self.num_token_types > 0:
            h = h + self.token_type_embedding(token_type_ids)
        h = self.embedding_dropout(h)
        mask = additive_mask(attention_mask, h.dtype)
        if self.opts.add_cross_attention:
            out = self.transformer((h, cross_states, mask, additive_mask(cross_mask, h.dtype)))
        else:
            out = self.transformer((h, mask))
        h = out[0]
        if not self.add_lm_head:
            return h
        head = self.word_embedding.weight if self.tie_lm_head else self.lm_head_weight
        logits = F.linear(ops.enter_region(h, env), head, self.lm_head_bias)
        loss = None if labels is None else self._loss(logits, labels)
        full = ops.own_rows(ops.gather_dim(logits, env, -1), env) if self.return_logits else None
        return loss, full

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Mean cross entropy over this rank's labelled tokens (`labels` its own [B, S]), from the
        gathered batch's vocabulary-parallel logits."""
        env = self.tp_env
        entered = ops.enter_side(labels, env)
        if self.shift_labels:
            logits, entered, labels = logits[..., :-1, :], entered[..., 1:], labels[..., 1:]
        per_token = vocab_parallel_cross_entropy(logits, entered, self.word_embedding.vocab_start, env)
        return ops.own_rows(per_token, env).sum() / (labels != -100).sum()


def additive_mask(mask: Optional[torch.Tensor], dtype: torch.dtype) -> Optional[torch.Tensor]:
    """SMP's 0-1 [N, S] mask (1 = masked) as the layers' additive [N, 1, 1, S] mask (float32 at least)."""
    if mask is None:
        return None
    acc = torch.promote_types(dtype, torch.float32)
    return mask[:, None, None, :].to(acc) * torch.finfo(acc).min
