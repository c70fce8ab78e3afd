"""GPT-2 under tensor parallelism: the module mappings and SMP's state-dict translations.

What is replaced, and why:

- ``GPT2LMHeadModel`` -> ``smp.nn.DistributedTransformerLMHead``: the whole causal LM (embeddings,
  blocks, final layer norm, LM head tied to the word embedding), as in SageMaker's GPT-2 example,
  which reads the blocks as ``model.get_module().transformer.seq_layers`` after wrapping.
- ``GPT2Model`` (the body other heads hold, e.g. ``GPT2ForSequenceClassification.transformer``)
  -> ``DistributedTransformerLMHead(add_lm_head=False)``: the same module without the head, so
  the head stays Hugging Face's. Inside a ``GPT2LMHeadModel`` only the outermost module is
  replaced.

The blocks are pre-layer-norm with GPT-2's final ``ln_f`` (``pre_layernorm=True,
post_layernorm=True``), causal over ``n_positions``. GPT-2 keeps its projections in ``Conv1D``
(weight [in, out], transposed here) and fuses query, key and value in ``c_attn`` (split here into
``query``, ``key``, ``value``). Older GPT-2 checkpoints carry the causal-mask buffers
``attn.bias`` / ``attn.masked_bias``: they are dropped on the way in and ``attn.bias`` (the
[1, 1, L, L] lower-triangular mask) is restored on the way back when ``max_seq_len`` (L) is given.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

import torch

from ....mpcommon.errors import SMPUnsupportedError
from . import common as C
from .common import CausalLM, Rule, StateDict, layernorm, linear

MODEL = "GPT-2"

FAMILY = CausalLM(
    MODEL,
    top=[Rule.of("wte.weight", "word_embedding.weight"), Rule.of("wpe.weight", "position_embedding.weight"),
         *layernorm("ln_f", "transformer.layernorm")],
    layer=[*layernorm("ln_1", "attention.pre_layernorm"),
           Rule.of("attn.c_attn.weight", "attention.query.weight", "attention.key.weight", "attention.value.weight",
                   transpose=True),
           Rule.of("attn.c_attn.bias", "attention.query.bias", "attention.key.bias", "attention.value.bias"),
           *linear("attn.c_proj", "attention.dense", transpose=True),
           *layernorm("ln_2", "output.pre_layernorm"),
           *linear("mlp.c_fc", "output.dense1", transpose=True),
           *linear("mlp.c_proj", "output.dense2", transpose=True)],
    dropped=("attn.bias", "attn.masked_bias"))


def _with_masks(state_dict: StateDict, max_seq_len: Optional[int]) -> StateDict:
    """Adds each layer's ``attn.bias`` ([1, 1, L, L] lower-triangular, L = max_seq_len)."""
    if max_seq_len is None:
        return state_dict
    mask = torch.tril(torch.ones(max_seq_len, max_seq_len, dtype=torch.bool)).view(1, 1, max_seq_len, max_seq_len)
    for k in [k for k in state_dict if k.endswith(".attn.c_attn.weight")]:
        state_dict[k[:-len("c_attn.weight")] + "bias"] = mask.clone()
    return state_dict


# ---------------------------------------------------------------- state dicts of the replaced modules

def lm_to_smp(state_dict: Mapping[str, torch.Tensor]) -> StateDict:
    """A ``GPT2LMHeadModel`` state dict in ``DistributedTransformerLMHead``'s naming (the LM head
    is the word embedding: ``lm_head.weight`` must equal it and is dropped)."""
    return FAMILY.lm_to_smp(state_dict)


def lm_to_hf(state_dict: Mapping[str, torch.Tensor], max_seq_len: Optional[int] = None) -> StateDict:
    return _with_masks(FAMILY.lm_to_hf(state_dict), max_seq_len)


def model_to_smp(state_dict: Mapping[str, torch.Tensor]) -> StateDict:
    """A ``GPT2Model`` state dict in ``DistributedTransformerLMHead(add_lm_head=False)``'s naming."""
    return FAMILY.body_to_smp(state_dict)


def model_to_hf(state_dict: Mapping[str, torch.Tensor], max_seq_len: Optional[int] = None) -> StateDict:
    return _with_masks(FAMILY.body_to_hf(state_dict), max_seq_len)


# ---------------------------------------------------------------- whole-model translations (SMP's names)

def translate_hf_state_dict_to_smdistributed_gpt2(state_dict: Mapping[str, Any],
                                                  max_seq_len: Optional[int] = None) -> Dict[str, Any]:
    """A Hugging Face GPT-2 model's full state dict in the naming of the model after
    ``smp.DistributedModel`` replaced its GPT-2 module: a ``GPT2LMHeadModel`` (at the root or
    under any prefix) becomes the distributed LM head's keys at its prefix; otherwise each
    ``GPT2Model`` found is translated at its prefix; other keys pass through. `max_seq_len` is
    accepted for SMP's signature (the mask buffers are dropped whatever their size)."""
    return FAMILY.whole_to_smp(state_dict)


def translate_state_dict_to_hf_gpt2(state_dict: Mapping[str, Any], max_seq_len: Optional[int] = None, *,
                                    lm_head: bool = True) -> Dict[str, Any]:
    """The inverse of `translate_hf_state_dict_to_smdistributed_gpt2`: each distributed GPT-2
    found becomes a ``GPT2LMHeadModel``'s keys at its prefix (a ``GPT2Model``'s with
    ``lm_head=False``: the two have the same SMP keys, the head being tied); with `max_seq_len`,
    each layer's ``attn.bias`` mask of that size is added, as older checkpoints hold it."""
    return _with_masks(FAMILY.whole_to_hf(state_dict, lm_head=lm_head), max_seq_len)


# ---------------------------------------------------------------- module mappings

def lm_init_hook(config) -> tuple:
    return (), dict(_kwargs(config), add_lm_head=True, shift_labels=True)


def model_init_hook(config) -> tuple:
    return (), dict(_kwargs(config), add_lm_head=False)


def _kwargs(config) -> Dict[str, Any]:
    if config.add_cross_attention:
        raise SMPUnsupportedError(f"{MODEL} under tensor parallelism: add_cross_attention=True is not supported")
    if config.scale_attn_by_inverse_layer_idx:
        raise SMPUnsupportedError(f"{MODEL} under tensor parallelism: scale_attn_by_inverse_layer_idx=True is "
                                  f"not supported")
    hidden = config.n_embd
    return dict(num_layers=config.n_layer, num_attention_heads=config.n_head,
                attention_head_size=hidden // config.n_head, hidden_size=hidden,
                intermediate_size=config.n_inner if config.n_inner is not None else 4 * hidden,
                vocab_size=config.vocab_size, num_positions=config.n_positions,
                attention_dropout_prob=config.attn_pdrop, hidden_dropout_prob=config.resid_pdrop,
                activation=C.activation(config.activation_function, MODEL),
                layernorm_epsilon=config.layer_norm_epsilon, num_token_types=0,
                causal_mask_size=config.n_positions, add_cross_attention=False,
                initializer_range=config.initializer_range, use_normal_initialization=True,
                pre_layernorm=True, post_layernorm=True, scale_attention_scores=bool(config.scale_attn_weights))


def lm_forward_hook(input_ids=None, past_key_values=None, attention_mask=None, token_type_ids=None,
                    position_ids=None, inputs_embeds=None, encoder_hidden_states=None,
                    encoder_attention_mask=None, labels=None, use_cache=None, logits_to_keep=0, **kwargs):
    """GPT2LMHeadModel.forward's arguments as the distributed LM head's; GPT-2's token types
    (looked up in the word embedding) are refused with the cache, embeddings and cross attention."""
    C.refuse_inputs(MODEL, past_key_values=past_key_values, inputs_embeds=inputs_embeds,
                    token_type_ids=token_type_ids, encoder_hidden_states=encoder_hidden_states,
                    encoder_attention_mask=encoder_attention_mask, use_cache=use_cache,
                    logits_to_keep=logits_to_keep, **kwargs)
    return C.lm_inputs(MODEL, input_ids, attention_mask, position_ids, labels)


def model_forward_hook(input_ids=None, past_key_values=None, attention_mask=None, token_type_ids=None,
                       position_ids=None, inputs_embeds=None, encoder_hidden_states=None,
                       encoder_attention_mask=None, use_cache=None, **kwargs):
    C.refuse_inputs(MODEL, past_key_values=past_key_values, inputs_embeds=inputs_embeds,
                    token_type_ids=token_type_ids, encoder_hidden_states=encoder_hidden_states,
                    encoder_attention_mask=encoder_attention_mask, use_cache=use_cache, **kwargs)
    return C.lm_inputs(MODEL, input_ids, attention_mask, position_ids, None)


def mappings(transformers) -> List[C.TPMapping]:
    m, out = transformers.models.gpt2.modeling_gpt2, transformers.modeling_outputs
    return [C.mapping(m.GPT2LMHeadModel, "DistributedTransformerLMHead", lm_init_hook, lm_forward_hook,
                      C.lm_output(out.CausalLMOutputWithCrossAttentions), lm_to_smp, lm_to_hf),
            C.mapping(m.GPT2Model, "DistributedTransformerLMHead", model_init_hook, model_forward_hook,
                      C.body_output(out.BaseModelOutputWithPastAndCrossAttentions), model_to_smp, model_to_hf)]
