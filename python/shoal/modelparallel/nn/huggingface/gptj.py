"""GPT-J under tensor parallelism: the module mapping and SMP's state-dict translations.

What is replaced, and why: ``GPTJForCausalLM`` -> ``smp.nn.DistributedTransformerLMHead``, the
whole causal LM, as for GPT-2 (``model.transformer.seq_layers`` are the blocks after wrapping).

GPT-J's block is ``x + attn(ln_1(x)) + mlp(ln_1(x))`` (``parallel_attn_output=True``: one layer
norm, ``attention.pre_layernorm``), its attention has no biases (``use_qkv_bias=False``,
``use_dense_bias=False``) and rotates the first ``rotary_dim`` dims of each query and key head
(``rotary_dim``; all of them when the config has none), so the model has no position embedding
(``num_positions=0``). Its LM head is a linear layer of its own with a bias, not tied to the word
embedding (``tie_lm_head=False``: ``lm_head.weight`` -> ``lm_head_weight``; ``lm_head_bias=True``:
``lm_head.bias`` -> ``lm_head_bias``). Rotary positions are 0..S-1, so explicit
``position_ids`` other than those are refused.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping

import torch

from ....mpcommon.errors import SMPUnsupportedError
from . import common as C
from .common import CausalLM, Rule, StateDict, layernorm, linear

MODEL = "GPT-J"

FAMILY = CausalLM(
    MODEL,
    top=[Rule.of("wte.weight", "word_embedding.weight"), *layernorm("ln_f", "transformer.layernorm")],
    layer=[*layernorm("ln_1", "attention.pre_layernorm"),
           *linear("attn.q_proj", "attention.query", bias=False),
           *linear("attn.k_proj", "attention.key", bias=False),
           *linear("attn.v_proj", "attention.value", bias=False),
           *linear("attn.out_proj", "attention.dense", bias=False),
           *linear("mlp.fc_in", "output.dense1"),
           *linear("mlp.fc_out", "output.dense2")],
    dropped=("attn.bias", "attn.masked_bias"),
    head=[Rule.of("lm_head.weight", "lm_head_weight"), Rule.of("lm_head.bias", "lm_head_bias")])


def lm_to_smp(state_dict: Mapping[str, torch.Tensor]) -> StateDict:
    return FAMILY.lm_to_smp(state_dict)


def lm_to_hf(state_dict: Mapping[str, torch.Tensor]) -> StateDict:
    return FAMILY.lm_to_hf(state_dict)


def translate_hf_state_dict_to_smdistributed_gptj(state_dict: Mapping[str, Any], max_seq_len=None) -> Dict[str, Any]:
    """A Hugging Face ``GPTJForCausalLM``'s full state dict (at the root or under any prefix) in
    the naming of the distributed LM head that replaces it; other keys pass through.
    `max_seq_len` is accepted for SMP's signature (older checkpoints' mask buffers are dropped)."""
    return FAMILY.whole_to_smp(state_dict)


# the name this module exported before; the same function
translate_hf_gptj_state_dict_to_smdistributed = translate_hf_state_dict_to_smdistributed_gptj


def translate_state_dict_to_hf_gptj(state_dict: Mapping[str, Any], max_seq_len=None) -> Dict[str, Any]:
    """The inverse of `translate_hf_state_dict_to_smdistributed_gptj`."""
    return FAMILY.whole_to_hf(state_dict, lm_head=True)


# ---------------------------------------------------------------- module mapping

def init_hook(config) -> tuple:
    if config.tie_word_embeddings:
        raise SMPUnsupportedError(f"{MODEL} under tensor parallelism: tie_word_embeddings=True is not supported "
                                  f"(GPT-J's LM head is its own linear layer with a bias)")
    hidden = config.n_embd
    head = hidden // config.n_head
    return (), dict(num_layers=config.n_layer, num_attention_heads=config.n_head, attention_head_size=head,
                    hidden_size=hidden, intermediate_size=config.n_inner if config.n_inner is not None else 4 * hidden,
                    vocab_size=config.vocab_size, num_positions=0, attention_dropout_prob=config.attn_pdrop,
                    hidden_dropout_prob=config.resid_pdrop,
                    activation=C.activation(config.activation_function, MODEL),
                    layernorm_epsilon=config.layer_norm_epsilon, num_token_types=0,
                    causal_mask_size=config.n_positions, add_cross_attention=False, add_lm_head=True,
                    initializer_range=config.initializer_range, use_normal_initialization=True,
                    pre_layernorm=True, post_layernorm=True, use_qkv_bias=False, use_dense_bias=False,
                    rotary_dim=config.rotary_dim or head, rotary_style="gptj", parallel_attn_output=True,
                    tie_lm_head=False, lm_head_bias=True, shift_labels=True)


def forward_hook(input_ids=None, past_key_values=None, attention_mask=None, token_type_ids=None,
                 position_ids=None, inputs_embeds=None, labels=None, use_cache=None, output_attentions=None,
                 output_hidden_states=None, return_dict=None, logits_to_keep=0, **kwargs):
    C.refuse_inputs(MODEL, past_key_values=past_key_values, inputs_embeds=inputs_embeds,
                    token_type_ids=token_type_ids, use_cache=use_cache, output_attentions=output_attentions,
                    output_hidden_states=output_hidden_states, return_dict=return_dict,
                    logits_to_keep=logits_to_keep, **kwargs)
    if position_ids is not None and isinstance(input_ids, torch.Tensor):
        s = input_ids.shape[-1]
        if not torch.equal(position_ids.to(input_ids.device),
                           torch.arange(s, device=input_ids.device).expand_as(position_ids)):
            raise SMPUnsupportedError(f"{MODEL} under tensor parallelism: 'position_ids' other than 0..{s - 1} "
                                      f"are not supported (the rotary embedding uses positions 0..S-1)")
    return C.lm_inputs(MODEL, input_ids, attention_mask, None, labels)


def mappings(transformers) -> List[C.TPMapping]:
    m, out = transformers.models.gptj.modeling_gptj, transformers.modeling_outputs
    return [C.mapping(m.GPTJForCausalLM, "DistributedTransformerLMHead", init_hook, forward_hook,
                      C.lm_output(out.CausalLMOutputWithPast), lm_to_smp, lm_to_hf)]
