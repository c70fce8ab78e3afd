"""Hugging Face models under smp tensor parallelism (smp.nn.huggingface): the state-dict
translations are exact inverses and refuse bad keys by name; the Distributed* module each mapping
builds from the config, loaded with the translated weights, computes the Hugging Face model's
logits, loss and (GPT-2) gradients; the forward hooks refuse what the modules do not do. One
process (tp 1) except the last test, a 2-rank tp 2 job (mp_tp_hf_worker.py)."""

import pytest
import torch

import transformers as T
from harness import HERE, assert_all_passed, run_job
from shoal.modelparallel.nn import huggingface as H
from shoal.modelparallel.nn.huggingface import bert, common, gpt2, gptj, gptneo, roberta
from shoal.mpcommon.errors import SMPUnsupportedError, SMPValidationError

V, S, HID, LAYERS, HEADS = 64, 12, 32, 2, 4


def tiny(family, **kw):
    base = {
        "gpt2": dict(vocab_size=V, n_positions=16, n_embd=HID, n_layer=LAYERS, n_head=HEADS, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0),
        "gptj": dict(vocab_size=V, n_positions=16, n_embd=HID, n_layer=LAYERS, n_head=HEADS, rotary_dim=4,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
        "gptneo": dict(vocab_size=V, max_position_embeddings=16, hidden_size=HID, num_layers=LAYERS, num_heads=HEADS,
                       attention_types=[[["global", "local"], 1]], window_size=3, attention_dropout=0.0,
                       resid_dropout=0.0, embed_dropout=0.0),
        "bert": dict(vocab_size=V, hidden_size=HID, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                     intermediate_size=2 * HID, max_position_embeddings=16, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0),
        "roberta": dict(vocab_size=V, hidden_size=HID, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                        intermediate_size=2 * HID, max_position_embeddings=18, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0),
    }[family]
    base.update(kw)
    cls = {"gpt2": T.GPT2Config, "gptj": T.GPTJConfig, "gptneo": T.GPTNeoConfig, "bert": T.BertConfig,
           "roberta": T.RobertaConfig}[family]
    return cls(**base)


def model_of(cls, family, **kw):
    torch.manual_seed(0)
    m = cls(tiny(family, **kw)).eval()
    with torch.no_grad():     # biases and layer norms away from their 0/1 defaults
        for p in m.parameters():
            p.add_(0.02 * torch.randn_like(p))
    return m


BODY = {"lm_head": False}   # to_hf of a GPT-2 / GPT-Neo body (its SMP keys are the causal LM's)
WHOLE = {  # family -> ([(model class, to_hf keywords)], to smp, to hf)
    "gpt2": ([(T.GPT2LMHeadModel, {}), (T.GPT2Model, BODY), (T.GPT2ForSequenceClassification, BODY)],
             gpt2.translate_hf_state_dict_to_smdistributed_gpt2, gpt2.translate_state_dict_to_hf_gpt2),
    "gptj": ([(T.GPTJForCausalLM, {})], gptj.translate_hf_state_dict_to_smdistributed_gptj,
             gptj.translate_state_dict_to_hf_gptj),
    "gptneo": ([(T.GPTNeoForCausalLM, {}), (T.GPTNeoForSequenceClassification, BODY)],
               gptneo.translate_hf_state_dict_to_smdistributed_gptneo, gptneo.translate_state_dict_to_hf_gptneo),
    "bert": ([(T.BertForMaskedLM, {}), (T.BertModel, {}), (T.BertForSequenceClassification, {})],
             bert.translate_hf_state_dict_to_smdistributed_bert, bert.translate_state_dict_to_hf_bert),
    "roberta": ([(T.RobertaForMaskedLM, {}), (T.RobertaModel, {})],
                roberta.translate_hf_state_dict_to_smdistributed_roberta, roberta.translate_state_dict_to_hf_roberta),
}


def same(got, want):
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), k


@pytest.mark.parametrize("family", sorted(WHOLE))
def test_whole_model_translations_round_trip_exactly(family):
    classes, to_smp, to_hf = WHOLE[family]
    for cls, back_kw in classes:
        sd = model_of(cls, family).state_dict()
        for prefix in ("", "outer."):          # the model itself, and inside a user's module
            hf = {prefix + k: v for k, v in sd.items()}
            smp_sd = to_smp(hf)
            assert not any(".h.0." in k or ".layer.0." in k or k.startswith(("h.0.", "layer.0.")) for k in smp_sd)
            assert any(k.endswith("seq_layers.0.attention.query.weight") for k in smp_sd), (cls, sorted(smp_sd))
            same(to_hf(smp_sd, **back_kw), hf)


def test_gpt2_translation_names_transposes_and_splits_the_fused_projection():
    m = model_of(T.GPT2LMHeadModel, "gpt2")
    sd = m.state_dict()
    out = gpt2.translate_hf_state_dict_to_smdistributed_gpt2(sd)
    q, k, v = (out[f"transformer.seq_layers.1.attention.{n}.weight"] for n in ("query", "key", "value"))
    assert torch.equal(torch.cat([q, k, v]), sd["transformer.h.1.attn.c_attn.weight"].t())
    assert torch.equal(out["transformer.seq_layers.0.output.dense1.weight"], sd["transformer.h.0.mlp.c_fc.weight"].t())
    assert torch.equal(out["transformer.layernorm.weight"], sd["transformer.ln_f.weight"])
    assert "lm_head.weight" not in out and torch.equal(out["word_embedding.weight"], sd["transformer.wte.weight"])
    # older checkpoints' mask buffers: dropped, and restored with max_seq_len
    old = dict(sd)
    for i in range(LAYERS):
        old[f"transformer.h.{i}.attn.bias"] = torch.tril(torch.ones(16, 16, dtype=torch.bool)).view(1, 1, 16, 16)
    same(gpt2.translate_hf_state_dict_to_smdistributed_gpt2(old), out)
    same(gpt2.translate_state_dict_to_hf_gpt2(out, max_seq_len=16), old)
    assert gptj.translate_hf_gptj_state_dict_to_smdistributed is gptj.translate_hf_state_dict_to_smdistributed_gptj


def test_missing_unexpected_and_untied_keys_are_errors_naming_the_key():
    sd = model_of(T.GPT2LMHeadModel, "gpt2").state_dict()
    missing = {k: v for k, v in sd.items() if k != "transformer.h.1.ln_2.bias"}
    with pytest.raises(SMPValidationError, match=r"no 'transformer\.h\.1\.ln_2\.bias'"):
        gpt2.lm_to_smp(missing)
    with pytest.raises(SMPValidationError, match=r"unexpected key 'transformer\.extra'"):
        gpt2.lm_to_smp({**sd, "transformer.extra": torch.zeros(1)})
    untied = {**sd, "lm_head.weight": sd["lm_head.weight"] + 1}
    with pytest.raises(SMPUnsupportedError, match="'lm_head.weight' differs from 'transformer.wte.weight'"):
        gpt2.lm_to_smp(untied)
    enc = model_of(T.BertModel, "bert").encoder.state_dict()
    smp_enc = bert.encoder_to_smp(enc)
    with pytest.raises(SMPValidationError, match=r"no 'seq_layers\.0\.attention\.key\.bias'"):
        bert.encoder_to_hf({k: v for k, v in smp_enc.items() if k != "seq_layers.0.attention.key.bias"})
    with pytest.raises(SMPValidationError, match=r"layers \[0, 2\]"):
        bert.encoder_to_smp({k.replace("layer.1.", "layer.2."): v for k, v in enc.items()})


def test_mappings_cover_every_family_with_its_distributed_class():
    got = {m.hf_class_name: (m.dist_class_name, m.dist_class.__name__, m.hf_class.__name__) for m in H.mappings()}
    want = {"GPT2LMHeadModel": "DistributedTransformerLMHead", "GPT2Model": "DistributedTransformerLMHead",
            "GPTJForCausalLM": "DistributedTransformerLMHead", "GPTNeoForCausalLM": "DistributedTransformerLMHead",
            "GPTNeoModel": "DistributedTransformerLMHead", "BertEncoder": "DistributedTransformer",
            "RobertaEncoder": "DistributedTransformer"}
    assert got == {k: (v, v, k) for k, v in want.items()}


# ---------------------------------------------------------------- the distributed modules compute the model

MAPPINGS = {m.hf_class_name: m for m in H.mappings()}


class Replaced(torch.nn.Module):
    """The distributed module called through the mapping's hooks, as smp.DistributedModel calls it."""

    def __init__(self, hf_module, mapping):
        super().__init__()
        args, kwargs = mapping.init_hook(hf_module.config)
        self.dist = mapping.dist_class(*args, **kwargs)
        self.dist.load_state_dict(mapping.to_smp(hf_module.state_dict()), strict=True)
        self.dist.train(hf_module.training)
        self.mapping = mapping

    def forward(self, *args, **kwargs):
        args, kwargs = self.mapping.forward_hook(*args, **kwargs)
        return self.mapping.return_hook(self.dist(*args, **kwargs))


def batch():
    """Ids, a padding mask (row 0 padded on the right, row 2 on the left) and labels (-100 where
    padded, and where a left-padded row's first token would be predicted from padding)."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, V, (3, S), generator=g)
    mask = torch.ones(3, S, dtype=torch.long)
    mask[0, 8:] = 0
    mask[2, :3] = 0
    labels = ids.masked_fill(mask == 0, -100)
    labels[2, 3] = -100
    return ids, mask, labels


def close(got, want, what, rel=1e-5):
    scale = want.abs().max().item()
    err = (got - want).abs().max().item()
    assert err <= rel * max(scale, 1e-6), f"{what}: max difference {err:.3g} (scale {scale:.3g})"


CAUSAL = [("gpt2", T.GPT2LMHeadModel), ("gptneo", T.GPTNeoForCausalLM), ("gptj", T.GPTJForCausalLM)]


@pytest.mark.parametrize("family, cls", CAUSAL, ids=[f for f, _ in CAUSAL])
def test_causal_lm_replacement_gives_the_hugging_face_logits_and_loss(family, cls):
    hf = model_of(cls, family)
    rep = Replaced(hf, MAPPINGS[cls.__name__])
    ids, mask, labels = batch()
    want = hf(input_ids=ids, attention_mask=mask, labels=labels)
    got = rep(input_ids=ids, attention_mask=mask, labels=labels)
    assert type(got) is type(want)
    keep = mask.bool()
    close(got.logits[keep], want.logits[keep], "logits")
    close(got.loss, want.loss, "loss")
    assert rep(input_ids=ids).loss is None


def test_gpt2_gradients_mapped_back_are_the_hugging_face_gradients():
    hf = model_of(T.GPT2LMHeadModel, "gpt2")
    mapping = MAPPINGS["GPT2LMHeadModel"]
    rep = Replaced(hf, mapping)
    ids, mask, labels = batch()
    hf(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
    rep(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
    got = mapping.to_hf({n: p.grad for n, p in rep.dist.named_parameters()})
    want = {n: p.grad for n, p in hf.named_parameters()}
    assert set(want) <= set(got) and set(got) - set(want) == {"lm_head.weight"}   # the tied head
    for name, g in want.items():
        close(got[name], g, name)


ENCODERS = [("bert", T.BertForMaskedLM, "bert"), ("roberta", T.RobertaForMaskedLM, "roberta")]


@pytest.mark.parametrize("family, cls, base", ENCODERS, ids=[f for f, _, _ in ENCODERS])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_encoder_replacement_inside_the_hugging_face_model_gives_its_logits_and_loss(family, cls, base, attn):
    hf = model_of(cls, family, attn_implementation=attn)
    ids, mask, labels = batch()
    ids[:, 0] = 5            # RoBERTa's positions count non-padding tokens: no padding id in the ids
    ids[ids == 1] = 2
    want = hf(input_ids=ids, attention_mask=mask, labels=labels)
    body = getattr(hf, base)
    body.encoder = Replaced(body.encoder, MAPPINGS[type(body.encoder).__name__])
    got = hf(input_ids=ids, attention_mask=mask, labels=labels)
    close(got.logits, want.logits, "logits")
    close(got.loss, want.loss, "loss")
    assert len(body.encoder.dist.seq_layers) == LAYERS


# ---------------------------------------------------------------- what the hooks refuse

def test_forward_hooks_refuse_what_the_distributed_modules_do_not_do_naming_it():
    ids, mask, _ = batch()
    lm = MAPPINGS["GPT2LMHeadModel"].forward_hook
    for kw, name in [(dict(past_key_values=object()), "past_key_values"), (dict(use_cache=True), "use_cache"),
                     (dict(output_attentions=True), "output_attentions"), (dict(token_type_ids=ids), "token_type_ids"),
                     (dict(logits_to_keep=1), "logits_to_keep"), (dict(return_dict=False), "return_dict"),
                     (dict(head_mask=torch.ones(HEADS)), "head_mask")]:
        with pytest.raises(SMPUnsupportedError, match=f"'{name}'"):
            lm(input_ids=ids, attention_mask=mask, **kw)
    (inputs,), kwargs = lm(input_ids=ids, attention_mask=mask, use_cache=False, output_attentions=False)
    assert torch.equal(inputs[1], 1 - mask) and kwargs == {}       # SMP's mask: 1 = masked
    with pytest.raises(SMPUnsupportedError, match="'attention_mask'"):
        lm(input_ids=ids, attention_mask=mask[:, None, None, :])
    j = MAPPINGS["GPTJForCausalLM"].forward_hook
    j(input_ids=ids, position_ids=torch.arange(S).expand(3, S))
    with pytest.raises(SMPUnsupportedError, match="'position_ids'"):
        j(input_ids=ids, position_ids=torch.arange(S).expand(3, S) + 1)
    enc = MAPPINGS["BertEncoder"].forward_hook
    h = torch.zeros(3, S, HID)
    with pytest.raises(SMPUnsupportedError, match="'encoder_hidden_states'"):
        enc(h, None, encoder_hidden_states=h)
    causal = torch.tril(torch.ones(S, S, dtype=torch.bool)).expand(3, 1, S, S)
    with pytest.raises(SMPUnsupportedError, match="masks queries differently"):
        enc(h, causal)
    with pytest.raises(SMPUnsupportedError, match="decoder"):
        MAPPINGS["BertEncoder"].init_hook(tiny("bert", is_decoder=True))
    with pytest.raises(SMPUnsupportedError, match="activation 'silu'"):
        MAPPINGS["GPT2Model"].init_hook(tiny("gpt2", activation_function="silu"))


def test_every_form_of_the_encoder_mask_gives_the_same_key_mask():
    _, mask, _ = batch()
    h = torch.zeros(3, S, HID)
    keep4 = mask.bool()[:, None, None, :].expand(3, 1, S, S)
    forms = [mask, keep4, torch.zeros(3, 1, S, S).masked_fill(~keep4, torch.finfo(torch.float32).min)]
    want = torch.zeros(3, 1, 1, S).masked_fill(mask[:, None, None, :] == 0, common.MASKED_SCORE)
    for form in forms:
        assert torch.equal(common.additive_key_mask(form, h, "BERT"), want)
    assert torch.equal(common.additive_key_mask(None, h, "BERT"), torch.zeros(3, 1, 1, S))


# ---------------------------------------------------------------- tp 2, through smp.DistributedModel

def test_tensor_parallel_job_gives_the_hugging_face_loss_and_logits():
    """GPT-2 (built in smp.tensor_parallelism()) and BERT's encoder (smp.set_tensor_parallelism)
    over 2 tensor-parallel ranks: each rank's loss and logits are the plain model's on its rows,
    and the state dict comes back in Hugging Face's names unchanged (mp_tp_hf_worker.py)."""
    passed = assert_all_passed(run_job("tp2", 2, worker=HERE / "mp_tp_hf_worker.py", timeout=300))
    assert len(passed) == 2, passed
