"""smp.nn's tensor-parallel modules at tp 2 (mp_tp_modules_worker.py has the checks).

Each job runs many checks in two processes: every module against itself at
tp 1 (outputs, input gradients, gathered parameter gradients, both batch
modes), the LM head configured as GPT-2, GPT-Neo and GPT-J against
transformers' own causal LMs, the constructor refusals, and the modules on the TP
group smp.init makes.
"""

import pytest

from harness import HERE, assert_all_passed, run_job

WORKER = HERE / "mp_tp_modules_worker.py"
MODULES = ["linear", "embedding", "attention_post_ln", "attention_pre_ln_causal", "attention_cross",
           "output_post_ln_gelu", "output_pre_ln_gelu_new", "layer_cross", "layer_gptj_parallel_rotary",
           "transformer_gptneo_local", "transformer_bert_post_ln", "lm_head_gpt2_style", "lm_head_bert_style",
           "lm_head_gptj_style"]
MODES = ("prescaled=False:", "prescaled=True:")


@pytest.mark.parametrize("suite, checks", [
    ("parity", [m + name for m in MODES for name in MODULES]),
    ("hf", [m + name for m in MODES for name in ("gpt2_lm_head", "gptneo_causal_lm", "gptj_causal_lm")]),
    ("errors", ["heads", "intermediate", "vocab", "out_features", "embedding_dim", "hidden", "activation",
                "layernorms", "attention_layers", "local_window", "unknown_keyword", "nothing_sent"]),
    ("smp", [m + name for m in MODES for name in ("init", "layer", "lm_head")]),
])
def test_tensor_parallel_job(suite, checks):
    passed = assert_all_passed(run_job(suite, 2, worker=WORKER, timeout=300))
    assert sorted(passed) == sorted(checks), passed
