"""RoBERTa under tensor parallelism: the module mapping and SMP's state-dict translations.

What is replaced, and why: ``RobertaEncoder`` -> ``smp.nn.DistributedTransformer``, exactly as
BERT's encoder (bert.py): RoBERTa's encoder has BERT's layout and key names, and only its
embeddings (padding-aware positions, kept as Hugging Face's) differ. The embeddings, pooler and
heads keep their keys; ``roberta.encoder.layer.<i>...`` becomes ``roberta.encoder.seq_layers.<i>...``.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping

import torch

from . import bert
from . import common as C
from .common import StateDict

MODEL = "RoBERTa"


def encoder_to_smp(state_dict: Mapping[str, torch.Tensor]) -> StateDict:
    return bert.encoder_to_smp(state_dict, MODEL)


def encoder_to_hf(state_dict: Mapping[str, torch.Tensor]) -> StateDict:
    return bert.encoder_to_hf(state_dict, MODEL)


def translate_hf_state_dict_to_smdistributed_roberta(state_dict: Mapping[str, Any],
                                                     max_seq_len=None) -> Dict[str, Any]:
    """A Hugging Face RoBERTa model's full state dict in the naming of the model after its
    encoder was replaced; other keys pass through. `max_seq_len` is accepted for SMP's signature."""
    return bert.whole_to_smp(state_dict, MODEL)


def translate_state_dict_to_hf_roberta(state_dict: Mapping[str, Any], max_seq_len=None) -> Dict[str, Any]:
    """The inverse of `translate_hf_state_dict_to_smdistributed_roberta`."""
    return bert.whole_to_hf(state_dict, MODEL)


def init_hook(config) -> tuple:
    return (), bert.encoder_kwargs(config, MODEL)


def forward_hook(hidden_states, attention_mask=None, encoder_hidden_states=None, encoder_attention_mask=None,
                 past_key_values=None, use_cache=None, **kwargs) -> tuple:
    """RobertaEncoder.forward's arguments as DistributedTransformer's ((hidden_states, mask),)."""
    return bert.encoder_inputs(MODEL, hidden_states, attention_mask, encoder_hidden_states, encoder_attention_mask,
                               past_key_values, use_cache, kwargs)


def mappings(transformers) -> List[C.TPMapping]:
    m, out = transformers.models.roberta.modeling_roberta, transformers.modeling_outputs
    return [C.mapping(m.RobertaEncoder, "DistributedTransformer", init_hook, forward_hook,
                      C.body_output(out.BaseModelOutputWithPastAndCrossAttentions), encoder_to_smp, encoder_to_hf)]
