"""``smp.nn.huggingface``: tensor parallelism for Hugging Face's GPT-2, GPT-J, BERT, RoBERTa and GPT-Neo.

Two things per family (one module each):

- the module mappings (`mappings`): which Hugging Face module class ``smp.DistributedModel``
  replaces by which ``smp.nn.Distributed*`` module, with SMP's hooks (constructor arguments from
  the config, forward arguments, the Hugging Face return object) and the replaced module's
  state-dict translation both ways;
- SageMaker's whole-model translations, ``smp.nn.huggingface.<family>.translate_*``, between a
  Hugging Face model's full state dict and the model's after the replacement.

=============  =====================================  ====================================
family         replaced                               by
=============  =====================================  ====================================
gpt2           GPT2LMHeadModel; GPT2Model             DistributedTransformerLMHead (the
                                                      body without its LM head)
gptj           GPTJForCausalLM                        DistributedTransformerLMHead
gptneo         GPTNeoForCausalLM; GPTNeoModel         DistributedTransformerLMHead
bert           BertEncoder                            DistributedTransformer
roberta        RobertaEncoder                         DistributedTransformer
=============  =====================================  ====================================

The causal LMs are replaced whole, so that ``model.transformer.seq_layers`` are the blocks after
wrapping, as SageMaker's GPT-2 example reads them; BERT and RoBERTa keep their own embeddings
(with a layer norm SMP's LM head lacks), pooler and task heads. Each family module says what it
maps and what it refuses. The mapping record and the renaming engine are in common.py.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import List

from ... import nn as _smp_nn   # the package of the smp.nn.Distributed* classes (read when called)
from .common import TPMapping

__all__ = ["TPMapping", "mappings", "FAMILIES"]

FAMILIES = ("gpt2", "gptj", "bert", "roberta", "gptneo")


def mappings() -> List[TPMapping]:
    """The mapping records of the Hugging Face classes this transformers install has (imported
    here, when called), each with its ``hf_class`` and ``dist_class`` (the smp.nn class named
    ``dist_class_name``). A family whose classes or distributed module are missing is left out."""
    import transformers

    found: List[TPMapping] = []
    for name in FAMILIES:
        family = importlib.import_module(f"{__name__}.{name}")
        try:
            records = family.mappings(transformers)
        except (AttributeError, ImportError):
            continue      # a transformers version without this model
        for m in records:
            dist = getattr(_smp_nn, m.dist_class_name, None)
            if dist is not None:
                found.append(dataclasses.replace(m, dist_class=dist))
    return found
