"""SageMaker's state-dict translations for Hugging Face's roberta models (see __init__.py)."""

from . import same_naming


def translate_hf_state_dict_to_smdistributed_roberta(state_dict, max_seq_len=None):
    """A Hugging Face roberta state dict as the smp model loads it (the same keys under shoal)."""
    return same_naming(state_dict, "translate_hf_state_dict_to_smdistributed_roberta", max_seq_len)


def translate_state_dict_to_hf_roberta(state_dict, max_seq_len=None):
    """An smp roberta state dict in Hugging Face's naming (the same keys under shoal)."""
    return same_naming(state_dict, "translate_state_dict_to_hf_roberta", max_seq_len)
