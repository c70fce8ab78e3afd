"""``smp.nn.DistributedAttentionLayer``: multi-head attention split by heads over the TP group.

Each TP rank holds ``num_attention_heads / tp`` heads: ``query``, ``key`` and
``value`` are column-parallel (their output features are this rank's heads)
and ``dense`` is row-parallel (its partial sums leave the region, then its
replicated bias is added). The layer norms and the residual add run outside
the region on the rank's own batch. In order::

    n   = pre_layernorm(x)              if pre_layernorm, else x
    a   = dropout2(dense(attention(enter(n), enter(mask))))
    out = layernorm(x + a)              if post_layernorm
          x + a                         if only pre_layernorm (GPT style)
          a                             with parallel_attn_output (the layer adds x)

Scores and softmax are computed in float32 for half-precision parameters,
scaled by 1/sqrt(head size) unless ``scale_attention_scores`` is False; the
causal mask (``causal_mask_size``) and GPT-Neo's local window
(``attention_layers="local"``, ``window_size``) replace masked scores with the
scores' dtype's minimum; the additive ``attention_mask [N, 1, 1, S]`` is added after.
GPT-J's rotary embedding (``rotary_dim``) rotates interleaved pairs of the
first ``rotary_dim`` dims of each query and key head at positions 0..S-1.

Dropout on the attention probabilities runs inside the region on the gathered
``[tp*B]`` rows of this rank's heads: with dropout > 0 the result is a valid
dropout but not the single-process model's draw.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

from ...mpcommon.errors import SMPValidationError
from . import ops
from . import options as O
from .base import DistributedModule
from .linear import ColumnLinear, RowLinear


class DistributedAttentionLayer(DistributedModule):
    """forward((hidden_states, attention_mask)) or, with ``cross_attention``,
    forward((hidden_states, cross_states, attention_mask)) -> hidden states ``[N, S, H]``
    (``attention_mask`` additive, ``[N, 1, 1, S]`` or None)."""

    def __init__(self, num_attention_heads: int = 32, attention_head_size: int = 32, hidden_size: int = 1024,
                 attention_dropout_prob: float = 0.1, hidden_dropout_prob: float = 0.1,
                 layernorm_epsilon: float = 1e-5, initializer_range: float = 0.02,
                 use_normal_initialization: bool = False, cross_attention: bool = False,
                 causal_mask_size: Optional[int] = None, pre_layernorm: bool = False, post_layernorm: bool = True,
                 **extensions):
        super().__init__()
        documented = dict(locals())
        o = O.make(type(self).__name__, documented, extensions)
        if cross_attention:
            o.add_cross_attention, o.parallel_attn_output = True, False
        O.check_attention(self, o)
        if isinstance(o.attention_layers, list):
            raise self._error("attention_layers of one attention layer is 'global', 'local' or None, not a list")
        self.opts = o
        self.cross_attention = cross_attention
        self.local_heads = o.num_attention_heads // self.tp_size
        h, std = o.hidden_size, o.init_std
        self.query = ColumnLinear(h, h, o.use_qkv_bias, std)
        self.key = ColumnLinear(h, h, o.use_qkv_bias, std)
        self.value = ColumnLinear(h, h, o.use_qkv_bias, std)
        self.dense = RowLinear(h, h, o.use_dense_bias, std)
        self.dropout1 = torch.nn.Dropout(o.attention_dropout_prob)
        self.dropout2 = torch.nn.Dropout(o.hidden_dropout_prob)
        if o.pre_layernorm:
            self.pre_layernorm = torch.nn.LayerNorm(h, eps=o.layernorm_epsilon)
        if o.post_layernorm and not o.parallel_attn_output:
            self.layernorm = torch.nn.LayerNorm(h, eps=o.layernorm_epsilon)
        self.local = o.attention_layers == "local" and not cross_attention

    def forward(self, inputs):
        if self.cross_attention:
            hidden_states, cross_states, attention_mask = inputs
        else:
            (hidden_states, attention_mask), cross_states = inputs, None
        o = self.opts
        norm = self.pre_layernorm(hidden_states) if o.pre_layernorm else hidden_states
        out = self.attend(norm, attention_mask, cross_states)
        if o.parallel_attn_output:
            return out
        if o.post_layernorm:
            return self.layernorm(residual_add(hidden_states, out, o.fp32_residual_addition))
        return residual_add(hidden_states, out, o.fp32_residual_addition)

    def attend(self, norm_states: torch.Tensor, attention_mask: Optional[torch.Tensor],
               cross_states: Optional[torch.Tensor] = None) -> torch.Tensor:
        """dropout2(dense(attention)) of already normalised states, on the rank's own batch."""
        env, o = self.tp_env, self.opts
        x = ops.enter_region(norm_states, env)
        kv = x if cross_states is None else ops.enter_region(cross_states, env)
        q, k, v = self._heads(self.query(x)), self._heads(self.key(kv)), self._heads(self.value(kv))
        if o.rotary_dim is not None:
            q, k = rotary_gptj(q, o.rotary_dim), rotary_gptj(k, o.rotary_dim)
        acc = torch.promote_types(q.dtype, torch.float32)       # half precision: scores in float32
        scores = torch.matmul(q.to(acc), k.to(acc).transpose(-1, -2))
        if o.scale_attention_scores:
            scores = scores / math.sqrt(o.attention_head_size)
        if cross_states is None and o.causal_mask_size is not None:
            scores = self._causal(scores)
        if attention_mask is not None:
            mask = attention_mask
            if mask.dim() >= 1 and mask.shape[0] == 1 and norm_states.shape[0] != 1:
                mask = mask.expand((norm_states.shape[0],) + tuple(mask.shape[1:]))
            scores = scores + ops.enter_side(mask, env).to(acc)
        probs = self.dropout1(F.softmax(scores, dim=-1).to(v.dtype))
        context = torch.matmul(probs, v).permute(0, 2, 1, 3)
        context = context.reshape(context.shape[:-2] + (self.local_heads * o.attention_head_size,))
        return self.dropout2(self.dense(context))

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        """[N, S, local_heads*D] -> [N, local_heads, S, D]"""
        return t.view(t.shape[:-1] + (self.local_heads, self.opts.attention_head_size)).permute(0, 2, 1, 3)

    def _causal(self, scores: torch.Tensor) -> torch.Tensor:
        sq, sk = scores.shape[-2], scores.shape[-1]
        if sk > self.opts.causal_mask_size:
            raise SMPValidationError(f"smp.nn.{type(self).__name__}: sequence length {sk} is longer than "
                                     f"causal_mask_size {self.opts.causal_mask_size}")
        allowed = causal_allowed(sq, sk, scores.device, self.opts.window_size if self.local else None)
        return scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)


def causal_allowed(sq: int, sk: int, device, window: Optional[int] = None) -> torch.Tensor:
    """[sq, sk] booleans: query i (the last sq of sk positions) may attend key j when j <= i,
    and, with a local window, i - j < window."""
    i = torch.arange(sq, device=device).unsqueeze(1) + (sk - sq)
    j = torch.arange(sk, device=device).unsqueeze(0)
    allowed = j <= i
    if window is not None:
        allowed = allowed & (i - j < window)
    return allowed


def rotary_gptj(t: torch.Tensor, rotary_dim: int) -> torch.Tensor:
    """GPT-J's rotary position embedding of heads t [N, heads, S, D] at positions 0..S-1: pairs
    (2i, 2i+1) of the first rotary_dim dims rotated by position / 10000^(2i/rotary_dim)."""
    s = t.shape[-2]
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64, device=t.device) / rotary_dim))
    angles = torch.arange(s, dtype=torch.float32, device=t.device).unsqueeze(1) * inv_freq.float().unsqueeze(0)
    sin = angles.sin().repeat_interleave(2, dim=-1)
    cos = angles.cos().repeat_interleave(2, dim=-1)
    rot, rest = t[..., :rotary_dim], t[..., rotary_dim:]
    pairs = torch.stack((-rot[..., 1::2], rot[..., ::2]), dim=-1).flatten(-2)
    rot = (rot * cos + pairs * sin).to(t.dtype)
    return torch.cat((rot, rest), dim=-1)


def residual_add(x: torch.Tensor, y: torch.Tensor, fp32: bool) -> torch.Tensor:
    """x + y, computed in float32 when asked (SMP's fp32_residual_addition)."""
    if fp32 and x.dtype != torch.float32:
        return (x.float() + y.float()).to(x.dtype)
    return x + y
