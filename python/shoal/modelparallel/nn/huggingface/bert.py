"""BERT under tensor parallelism: the module mapping and SMP's state-dict translations.

What is replaced, and why: ``BertEncoder`` -> ``smp.nn.DistributedTransformer`` (post-layer-norm,
no causal mask). The encoder holds all of BERT's attention and MLP weights; the embeddings
(three tables and a layer norm: SMP's LM head has no embedding layer norm), the pooler and every
task head stay Hugging Face's, so any BERT model (``BertModel``, ``BertForMaskedLM``,
``BertForSequenceClassification`` ...) is distributed the same way, its blocks becoming
``<...>.encoder.seq_layers``. RoBERTa (roberta.py) shares the layout.

Per layer: ``attention.self.{query,key,value}`` -> ``attention.{query,key,value}``,
``attention.output.dense`` / ``LayerNorm`` -> ``attention.dense`` / ``attention.layernorm``,
``intermediate.dense`` -> ``output.dense1``, ``output.dense`` / ``LayerNorm`` ->
``output.dense2`` / ``output.layernorm``. The encoder's mask (built by the Hugging Face model
from the padding mask: None, bool or additive [N, 1, S, S]) becomes the [N, 1, 1, S] additive
key mask of the distributed transformer.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping

import torch

from ....mpcommon.errors import SMPUnsupportedError
from . import common as C
from .common import StateDict, layernorm, linear, prefixes_of, sub_dict, translate, with_prefix

MODEL = "BERT"

LAYER = [*linear("attention.self.query", "attention.query"),
         *linear("attention.self.key", "attention.key"),
         *linear("attention.self.value", "attention.value"),
         *linear("attention.output.dense", "attention.dense"),
         *layernorm("attention.output.LayerNorm", "attention.layernorm"),
         *linear("intermediate.dense", "output.dense1"),
         *linear("output.dense", "output.dense2"),
         *layernorm("output.LayerNorm", "output.layernorm")]
HF_LAYER, SMP_LAYER = "layer.{}.", "seq_layers.{}."
_HF_MARK, _SMP_MARK = "layer.0.attention.self.query.weight", "seq_layers.0.attention.query.weight"


def encoder_to_smp(state_dict: Mapping[str, torch.Tensor], model: str = MODEL, shown: str = "") -> StateDict:
    """An encoder's state dict (``layer.<i>...``) in ``DistributedTransformer``'s naming."""
    return translate(state_dict, to_smp=True, what=f"{model} to smp", layer=LAYER, hf_layer=HF_LAYER,
                     smp_layer=SMP_LAYER, shown=shown)


def encoder_to_hf(state_dict: Mapping[str, torch.Tensor], model: str = MODEL, shown: str = "") -> StateDict:
    return translate(state_dict, to_smp=False, what=f"{model} to Hugging Face", layer=LAYER, hf_layer=HF_LAYER,
                     smp_layer=SMP_LAYER, shown=shown)


def whole_to_smp(state_dict: Mapping[str, Any], model: str = MODEL) -> Dict[str, Any]:
    """Each encoder found (``<p>layer.0.attention.self.query.weight``) translated at its prefix;
    other keys pass through."""
    out = dict(state_dict)
    for p in prefixes_of(state_dict, _HF_MARK):
        inner, out = sub_dict(out, p)
        mine = {k: v for k, v in inner.items() if k.startswith("layer.")}
        out.update(with_prefix({k: v for k, v in inner.items() if k not in mine}, p))
        out.update(with_prefix(encoder_to_smp(mine, model, p), p))
    return out


def whole_to_hf(state_dict: Mapping[str, Any], model: str = MODEL) -> Dict[str, Any]:
    out = dict(state_dict)
    for p in prefixes_of(state_dict, _SMP_MARK):
        inner, out = sub_dict(out, p)
        mine = {k: v for k, v in inner.items() if k.startswith("seq_layers.")}
        out.update(with_prefix({k: v for k, v in inner.items() if k not in mine}, p))
        out.update(with_prefix(encoder_to_hf(mine, model, p), p))
    return out


def translate_hf_state_dict_to_smdistributed_bert(state_dict: Mapping[str, Any], max_seq_len=None) -> Dict[str, Any]:
    """A Hugging Face BERT model's full state dict in the naming of the model after its encoder
    was replaced (``bert.encoder.layer.<i>...`` -> ``bert.encoder.seq_layers.<i>...``); the
    embeddings, pooler and heads keep their keys. `max_seq_len` is accepted for SMP's signature."""
    return whole_to_smp(state_dict, MODEL)


def translate_state_dict_to_hf_bert(state_dict: Mapping[str, Any], max_seq_len=None) -> Dict[str, Any]:
    """The inverse of `translate_hf_state_dict_to_smdistributed_bert`."""
    return whole_to_hf(state_dict, MODEL)


# ---------------------------------------------------------------- module mapping

def encoder_kwargs(config, model: str = MODEL) -> Dict[str, Any]:
    """DistributedTransformer's arguments for a BERT-style encoder's config."""
    if config.is_decoder or config.add_cross_attention:
        raise SMPUnsupportedError(f"{model} under tensor parallelism: a decoder (is_decoder / "
                                  f"add_cross_attention) is not supported, only the bidirectional encoder")
    if getattr(config, "position_embedding_type", "absolute") != "absolute":
        raise SMPUnsupportedError(f"{model} under tensor parallelism: position_embedding_type "
                                  f"{config.position_embedding_type!r} is not supported (only 'absolute')")
    hidden = config.hidden_size
    return dict(num_layers=config.num_hidden_layers, num_attention_heads=config.num_attention_heads,
                attention_head_size=hidden // config.num_attention_heads, hidden_size=hidden,
                intermediate_size=config.intermediate_size,
                attention_dropout_prob=config.attention_probs_dropout_prob,
                hidden_dropout_prob=config.hidden_dropout_prob,
                activation=C.activation(config.hidden_act, model), layernorm_epsilon=config.layer_norm_eps,
                initializer_range=config.initializer_range, use_normal_initialization=True,
                causal_mask_size=None, add_cross_attention=False, pre_layernorm=False, post_layernorm=True)


def init_hook(config) -> tuple:
    return (), encoder_kwargs(config, MODEL)


def encoder_inputs(model: str, hidden_states, attention_mask, encoder_hidden_states, encoder_attention_mask,
                   past_key_values, use_cache, kwargs) -> tuple:
    kwargs = dict(kwargs)
    kwargs.pop("position_ids", None)    # the model hands its positions down; the embeddings used them
    C.refuse_inputs(model, encoder_hidden_states=encoder_hidden_states,
                    encoder_attention_mask=encoder_attention_mask, past_key_values=past_key_values,
                    use_cache=use_cache, **kwargs)
    return ((hidden_states, C.additive_key_mask(attention_mask, hidden_states, model)),), {}


def forward_hook(hidden_states, attention_mask=None, encoder_hidden_states=None, encoder_attention_mask=None,
                 past_key_values=None, use_cache=None, **kwargs) -> tuple:
    """BertEncoder.forward's arguments as DistributedTransformer's ((hidden_states, mask),)."""
    return encoder_inputs(MODEL, hidden_states, attention_mask, encoder_hidden_states, encoder_attention_mask,
                          past_key_values, use_cache, kwargs)


def mappings(transformers) -> List[C.TPMapping]:
    m, out = transformers.models.bert.modeling_bert, transformers.modeling_outputs
    return [C.mapping(m.BertEncoder, "DistributedTransformer", init_hook, forward_hook,
                      C.body_output(out.BaseModelOutputWithPastAndCrossAttentions), encoder_to_smp, encoder_to_hf)]
