"""``smp.nn.DistributedTransformerOutputLayer``, ``DistributedTransformerLayer`` and
``DistributedTransformer``.

The output layer (the MLP) splits ``intermediate_size`` over the TP group:
``dense1`` is column-parallel, ``dense2`` row-parallel; layer norms, dropout
and the residual add run on the rank's own batch::

    n   = pre_layernorm(x)              if pre_layernorm, else x
    m   = dropout(dense2(act(dense1(enter(n)))))
    out = layernorm(x + m)              if post_layernorm
          x + m                         if only pre_layernorm (GPT style)
          m                             with parallel_attn_output (the layer adds x)

A layer is an attention layer followed by an output layer (and a cross
attention between them with ``add_cross_attention``); with
``parallel_attn_output`` (GPT-J) it is ``x + attn(ln(x)) + mlp(ln(x))`` with
the one layer norm ``attention.pre_layernorm``. A transformer is
``num_layers`` layers in ``seq_layers``; with both ``pre_layernorm`` and
``post_layernorm`` its layers are pre-LN and a final ``layernorm`` normalises
its output (GPT-2's ``ln_f``).
"""

from __future__ import annotations

from typing import List, Optional

import torch
import torch.nn.functional as F

from . import ops
from . import options as O
from .attention import DistributedAttentionLayer, residual_add
from .base import DistributedModule
from .linear import ColumnLinear, RowLinear


def activate(x: torch.Tensor, activation: str) -> torch.Tensor:
    if activation == "gelu":
        return F.gelu(x)
    if activation == "gelu_new":
        return F.gelu(x, approximate="tanh")
    return F.relu(x)


class DistributedTransformerOutputLayer(DistributedModule):
    """forward(hidden_states [N, S, H]) -> [N, S, H]; with ``parallel_attn_output`` the input is
    the already normalised states and the output is the MLP branch alone."""

    def __init__(self, hidden_size: int = 1024, intermediate_size: int = 4096, hidden_dropout_prob: float = 0.1,
                 activation: str = "gelu", layernorm_epsilon: float = 1e-5, initializer_range: float = 0.02,
                 use_normal_initialization: bool = False, pre_layernorm: bool = False, post_layernorm: bool = True,
                 fp32_residual_addition: bool = False, **extensions):
        super().__init__()
        o = O.make(type(self).__name__, dict(locals()), extensions)
        O.check_output(self, o)
        self.opts = o
        std = o.init_std
        self.dense1 = ColumnLinear(o.hidden_size, o.intermediate_size, True, std)
        self.dense2 = RowLinear(o.intermediate_size, o.hidden_size, True, std)
        self.dropout = torch.nn.Dropout(o.hidden_dropout_prob)
        if not o.parallel_attn_output:
            if o.pre_layernorm:
                self.pre_layernorm = torch.nn.LayerNorm(o.hidden_size, eps=o.layernorm_epsilon)
            if o.post_layernorm:
                self.layernorm = torch.nn.LayerNorm(o.hidden_size, eps=o.layernorm_epsilon)

    def mlp(self, norm_states: torch.Tensor) -> torch.Tensor:
        """dropout(dense2(act(dense1(n)))) on the rank's own batch."""
        h = activate(self.dense1(ops.enter_region(norm_states, self.tp_env)), self.opts.activation)
        return self.dropout(self.dense2(h))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        o = self.opts
        if o.parallel_attn_output:
            return self.mlp(hidden_states)
        norm = self.pre_layernorm(hidden_states) if o.pre_layernorm else hidden_states
        out = residual_add(hidden_states, self.mlp(norm), o.fp32_residual_addition)
        return self.layernorm(out) if o.post_layernorm else out


class DistributedTransformerLayer(DistributedModule):
    """forward((hidden_states, attention_mask)) -> (hidden_states, attention_mask); with
    ``add_cross_attention``: forward((h, cross_states, attention_mask, cross_mask)) -> the same
    four with h replaced. ``attention_layers`` is this layer's 'global'/'local' (GPT-Neo)."""

    def __init__(self, num_attention_heads: int = 32, attention_head_size: int = 32, hidden_size: int = 1024,
                 intermediate_size: int = 4096, attention_dropout_prob: float = 0.1, hidden_dropout_prob: float = 0.1,
                 activation: str = "gelu", layernorm_epsilon: float = 1e-5, initializer_range: float = 0.02,
                 use_normal_initialization: bool = False, causal_mask_size: Optional[int] = None,
                 add_cross_attention: bool = False, pre_layernorm: bool = False, post_layernorm: bool = True,
                 **extensions):
        super().__init__()
        o = O.make(type(self).__name__, dict(locals()), extensions)
        O.check_attention(self, o)
        O.check_output(self, o)
        if isinstance(o.attention_layers, list):
            raise self._error("attention_layers of one layer is 'global', 'local' or None, not a list")
        self.opts = o
        self.attention = DistributedAttentionLayer(**o.kwargs())
        if o.add_cross_attention:
            self.cross_attention = DistributedAttentionLayer(cross_attention=True,
                                                             **o.kwargs(attention_layers=None, rotary_dim=None))
        self.output = DistributedTransformerOutputLayer(**o.kwargs())

    def forward(self, inputs):
        o = self.opts
        if o.add_cross_attention:
            hidden_states, cross_states, attention_mask, cross_mask = inputs
        else:
            hidden_states, attention_mask = inputs
        if o.parallel_attn_output:
            norm = self.attention.pre_layernorm(hidden_states)
            attn = self.attention.attend(norm, attention_mask)
            out = residual_add(attn + self.output.mlp(norm), hidden_states, o.fp32_residual_addition)
            return out, attention_mask
        out = self.attention((hidden_states, attention_mask))
        if o.add_cross_attention:
            out = self.cross_attention((out, cross_states, cross_mask))
        out = self.output(out)
        if o.add_cross_attention:
            return out, cross_states, attention_mask, cross_mask
        return out, attention_mask


class DistributedTransformer(DistributedModule):
    """``num_layers`` DistributedTransformerLayers in ``seq_layers``; forward(inputs) as a layer's.
    ``attention_layers`` is None or a list of 'global'/'local', one per layer (GPT-Neo)."""

    def __init__(self, num_layers: int = 12, num_attention_heads: int = 32, attention_head_size: int = 32,
                 hidden_size: int = 1024, intermediate_size: int = 4096, attention_dropout_prob: float = 0.1,
                 hidden_dropout_prob: float = 0.1, activation: str = "gelu", layernorm_epsilon: float = 1e-5,
                 initializer_range: float = 0.02, use_normal_initialization: bool = False,
                 causal_mask_size: Optional[int] = None, add_cross_attention: bool = False,
                 pre_layernorm: bool = False, post_layernorm: bool = True, **extensions):
        super().__init__()
        o = O.make(type(self).__name__, dict(locals()), extensions)
        final_norm = o.pre_layernorm and o.post_layernorm
        layer_kwargs = o.kwargs(post_layernorm=o.post_layernorm and not final_norm)
        if num_layers < 1:
            raise self._error(f"num_layers {num_layers} must be at least 1")
        types = self._layer_types(o.attention_layers, num_layers)
        checked = O.Options(**dict(layer_kwargs, attention_layers=types))
        O.check_attention(self, checked)
        O.check_output(self, checked)
        self.opts, self.num_layers = o, num_layers
        self.seq_layers = torch.nn.Sequential(*[
            DistributedTransformerLayer(**dict(layer_kwargs, attention_layers=t)) for t in types])
        if final_norm:
            self.layernorm = torch.nn.LayerNorm(o.hidden_size, eps=o.layernorm_epsilon)

    def _layer_types(self, attention_layers, num_layers: int) -> List[Optional[str]]:
        if attention_layers is None or isinstance(attention_layers, str):
            return [attention_layers] * num_layers
        types = list(attention_layers)
        if len(types) != num_layers:
            raise self._error(f"attention_layers has {len(types)} entries for num_layers {num_layers}")
        return types

    def forward(self, inputs):
        out = self.seq_layers(inputs)
        if hasattr(self, "layernorm"):
            out = (self.layernorm(out[0]),) + tuple(out[1:])
        return out
