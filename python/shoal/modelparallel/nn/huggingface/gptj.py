"""SageMaker's state-dict translations for Hugging Face's gptj models (see __init__.py)."""

from . import same_naming


def translate_hf_gptj_state_dict_to_smdistributed(state_dict, max_seq_len=None):
    """A Hugging Face gptj state dict as the smp model loads it (the same keys under shoal)."""
    return same_naming(state_dict, "translate_hf_gptj_state_dict_to_smdistributed", max_seq_len)


def translate_state_dict_to_hf_gptj(state_dict, max_seq_len=None):
    """An smp gptj state dict in Hugging Face's naming (the same keys under shoal)."""
    return same_naming(state_dict, "translate_state_dict_to_hf_gptj", max_seq_len)
