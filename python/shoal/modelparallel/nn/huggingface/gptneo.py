"""GPT-Neo under tensor parallelism: the module mappings and SMP's state-dict translations.

What is replaced, and why: ``GPTNeoForCausalLM`` -> ``smp.nn.DistributedTransformerLMHead``, the
whole causal LM (word and position embeddings, blocks, ``ln_f``, LM head tied to the word
embedding), as for GPT-2, so that ``model.transformer.seq_layers`` are the blocks after wrapping;
``GPTNeoModel`` (the body of the other heads) -> the same module with ``add_lm_head=False``.

GPT-Neo's blocks are GPT-2's with plain ``nn.Linear`` projections (no transposes), no query, key or
value biases (``use_qkv_bias=False``), unscaled attention scores (``scale_attention_scores=False``),
and per-layer ``"global"``/``"local"`` attention (``attention_layers``), the local layers attending
to the last ``window_size`` positions (``window_size``). The layers' causal-mask buffers
(``attn.attention.bias`` / ``masked_bias``, in older checkpoints) are dropped on the way in.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping

import torch

from ....mpcommon.errors import SMPUnsupportedError
from . import common as C
from .common import CausalLM, Rule, StateDict, layernorm, linear

MODEL = "GPT-Neo"

FAMILY = CausalLM(
    MODEL,
    top=[Rule.of("wte.weight", "word_embedding.weight"), Rule.of("wpe.weight", "position_embedding.weight"),
         *layernorm("ln_f", "transformer.layernorm")],
    layer=[*layernorm("ln_1", "attention.pre_layernorm"),
           *linear("attn.attention.q_proj", "attention.query", bias=False),
           *linear("attn.attention.k_proj", "attention.key", bias=False),
           *linear("attn.attention.v_proj", "attention.value", bias=False),
           *linear("attn.attention.out_proj", "attention.dense"),
           *layernorm("ln_2", "output.pre_layernorm"),
           *linear("mlp.c_fc", "output.dense1"),
           *linear("mlp.c_proj", "output.dense2")],
    dropped=("attn.attention.bias", "attn.attention.masked_bias"))


def lm_to_smp(state_dict: Mapping[str, torch.Tensor]) -> StateDict:
    return FAMILY.lm_to_smp(state_dict)


def lm_to_hf(state_dict: Mapping[str, torch.Tensor]) -> StateDict:
    return FAMILY.lm_to_hf(state_dict)


def model_to_smp(state_dict: Mapping[str, torch.Tensor]) -> StateDict:
    return FAMILY.body_to_smp(state_dict)


def model_to_hf(state_dict: Mapping[str, torch.Tensor]) -> StateDict:
    return FAMILY.body_to_hf(state_dict)


def translate_hf_state_dict_to_smdistributed_gptneo(state_dict: Mapping[str, Any], max_seq_len=None) -> Dict[str, Any]:
    """A Hugging Face GPT-Neo model's full state dict in the naming of the model after its
    ``GPTNeoForCausalLM`` (or ``GPTNeoModel``) was replaced, at whatever prefix; other keys pass
    through. `max_seq_len` is accepted for SMP's signature."""
    return FAMILY.whole_to_smp(state_dict)


def translate_state_dict_to_hf_gptneo(state_dict: Mapping[str, Any], max_seq_len=None, *,
                                      lm_head: bool = True) -> Dict[str, Any]:
    """The inverse of `translate_hf_state_dict_to_smdistributed_gptneo` (a ``GPTNeoModel``'s keys
    with ``lm_head=False``). The layers' mask buffers are not restored: Hugging Face rebuilds them."""
    return FAMILY.whole_to_hf(state_dict, lm_head=lm_head)


# ---------------------------------------------------------------- module mappings

def lm_init_hook(config) -> tuple:
    return (), dict(_kwargs(config), add_lm_head=True, shift_labels=True)


def model_init_hook(config) -> tuple:
    return (), dict(_kwargs(config), add_lm_head=False)


def _kwargs(config) -> Dict[str, Any]:
    hidden = config.hidden_size
    types = list(config.attention_layers)
    if any(t not in ("global", "local") for t in types):
        raise SMPUnsupportedError(f"{MODEL} under tensor parallelism: attention_layers {types} are not all "
                                  f"'global' or 'local'")
    return dict(num_layers=config.num_layers, num_attention_heads=config.num_heads,
                attention_head_size=hidden // config.num_heads, hidden_size=hidden,
                intermediate_size=config.intermediate_size if config.intermediate_size is not None else 4 * hidden,
                vocab_size=config.vocab_size, num_positions=config.max_position_embeddings,
                attention_dropout_prob=float(config.attention_dropout),
                hidden_dropout_prob=float(config.resid_dropout),
                activation=C.activation(config.activation_function, MODEL),
                layernorm_epsilon=config.layer_norm_epsilon, num_token_types=0,
                causal_mask_size=config.max_position_embeddings, add_cross_attention=False,
                initializer_range=config.initializer_range, use_normal_initialization=True,
                pre_layernorm=True, post_layernorm=True, use_qkv_bias=False, scale_attention_scores=False,
                attention_layers=types, window_size=config.window_size if "local" in types else None)


def lm_forward_hook(input_ids=None, past_key_values=None, attention_mask=None, token_type_ids=None,
                    position_ids=None, inputs_embeds=None, labels=None, use_cache=None, output_attentions=None,
                    output_hidden_states=None, return_dict=None, logits_to_keep=0, **kwargs):
    C.refuse_inputs(MODEL, past_key_values=past_key_values, inputs_embeds=inputs_embeds,
                    token_type_ids=token_type_ids, use_cache=use_cache, output_attentions=output_attentions,
                    output_hidden_states=output_hidden_states, return_dict=return_dict,
                    logits_to_keep=logits_to_keep, **kwargs)
    return C.lm_inputs(MODEL, input_ids, attention_mask, position_ids, labels)


def model_forward_hook(input_ids=None, past_key_values=None, attention_mask=None, token_type_ids=None,
                       position_ids=None, inputs_embeds=None, use_cache=None, output_attentions=None,
                       output_hidden_states=None, return_dict=None, **kwargs):
    C.refuse_inputs(MODEL, past_key_values=past_key_values, inputs_embeds=inputs_embeds,
                    token_type_ids=token_type_ids, use_cache=use_cache, output_attentions=output_attentions,
                    output_hidden_states=output_hidden_states, return_dict=return_dict, **kwargs)
    return C.lm_inputs(MODEL, input_ids, attention_mask, position_ids, None)


def mappings(transformers) -> List[C.TPMapping]:
    m, out = transformers.models.gpt_neo.modeling_gpt_neo, transformers.modeling_outputs
    return [C.mapping(m.GPTNeoForCausalLM, "DistributedTransformerLMHead", lm_init_hook, lm_forward_hook,
                      C.lm_output(out.CausalLMOutputWithPast), lm_to_smp, lm_to_hf),
            C.mapping(m.GPTNeoModel, "DistributedTransformerLMHead", model_init_hook, model_forward_hook,
                      C.body_output(out.BaseModelOutputWithPast), model_to_smp, model_to_hf)]
