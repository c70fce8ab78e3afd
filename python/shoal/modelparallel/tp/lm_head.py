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

The forward is pipeline-traceable (docs/modelparallel.md, "What the model's
forward may do"): every collective runs inside a submodule (``word_embedding``,
the layers, ``lm_head``), so the pipeline can split the module between its
embeddings, its layers and its head. ``lm_head`` (:class:`LMHeadLoss`) holds
the head's weight and bias as the same Parameters the module registers under
its own names (``word_embedding.weight`` when tied, else ``lm_head_weight``;
``lm_head_bias``), as Hugging Face ties ``lm_head.weight`` to ``wte.weight``;
its entries are left out of the state dict, whose names are the module's own.
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
        self.mask = AdditiveMask()
        if add_lm_head:
            self.lm_head = LMHeadLoss(self)
            self._register_state_dict_hook(_drop_head_entries)
            self._register_load_state_dict_pre_hook(_head_entries, with_module=True)

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
        h = self.word_embedding(input_ids)
        if self.num_positions > 0:
            if position_ids is None:
                position_ids = torch.arange(input_ids.shape[-1], device=input_ids.device).expand_as(input_ids)
            h = h + self.position_embedding(position_ids)
        if token_type_ids is not None and self.num_token_types > 0:
            h = h + self.token_type_embedding(token_type_ids)
        h = self.embedding_dropout(h)
        mask = self.mask(attention_mask, h)
        if self.opts.add_cross_attention:
            out = self.transformer((h, cross_states, mask, self.mask(cross_mask, h)))
        else:
            out = self.transformer((h, mask))
        if not self.add_lm_head:
            return out[0]
        return self.lm_head(out[0], labels)


class LMHeadLoss(torch.nn.Module):
    """The LM head and its loss: ``forward(h, labels) -> (loss, logits)`` (the owner's docstring)."""

    def __init__(self, owner: DistributedTransformerLMHead):
        super().__init__()
        self.tp_env = owner.tp_env
        self.weight = owner.word_embedding.weight if owner.tie_lm_head else owner.lm_head_weight
        self.bias = owner.lm_head_bias
        self.vocab_start = owner.word_embedding.vocab_start
        self.shift_labels, self.return_logits = owner.shift_labels, owner.return_logits

    def forward(self, h: torch.Tensor, labels: Optional[torch.Tensor]):
        env = self.tp_env
        logits = F.linear(ops.enter_region(h, env), self.weight, self.bias)
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
        per_token = vocab_parallel_cross_entropy(logits, entered, self.vocab_start, env)
        return ops.own_rows(per_token, env).sum() / (labels != -100).sum()


class AdditiveMask(torch.nn.Module):
    """``forward(mask, like)``: :func:`additive_mask` of `mask` for activations like `like`."""

    def forward(self, mask: Optional[torch.Tensor], like: torch.Tensor) -> Optional[torch.Tensor]:
        return additive_mask(mask, like.dtype)


def _drop_head_entries(module, state_dict, prefix, local_metadata):
    for k in [k for k in state_dict if k.startswith(prefix + "lm_head.")]:
        del state_dict[k]
    return state_dict


def _head_entries(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
    """lm_head's entries are the module's own tensors: filled from the module's names."""
    names = {"weight": "word_embedding.weight" if module.tie_lm_head else "lm_head_weight", "bias": "lm_head_bias"}
    for own, src in names.items():
        if getattr(module.lm_head, own) is not None and prefix + src in state_dict:
            state_dict[prefix + "lm_head." + own] = state_dict[prefix + src]


def additive_mask(mask: Optional[torch.Tensor], dtype: torch.dtype) -> Optional[torch.Tensor]:
    """SMP's 0-1 [N, S] mask (1 = masked) as the layers' additive [N, 1, 1, S] mask (float32 at least)."""
    if mask is None:
        return None
    acc = torch.promote_types(dtype, torch.float32)
    return mask[:, None, None, :].to(acc) * torch.finfo(acc).min
