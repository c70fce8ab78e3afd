"""One rank of a 2-rank tensor-parallel smp job (tp 2) running Hugging Face models through the
mappings of smp.nn.huggingface (test_mp_tp_hf.py). Usage: mp_tp_hf_worker.py tp2.

Each rank reads its own rows (prescaled_batch off) with padding and -100 labels; the smp model's
loss and logits on them equal a plain copy of the Hugging Face model's, and the full state dict
translated back to Hugging Face's names equals the plain model's:

- GPT-2 built inside ``smp.tensor_parallelism()``: GPT2LMHeadModel becomes the distributed LM
  head, its blocks ``get_module().transformer.seq_layers``;
- BERT with ``smp.set_tensor_parallelism(model.bert.encoder)``: the encoder becomes a
  distributed transformer inside the Hugging Face BertForMaskedLM.
"""

import sys

import torch
import transformers as T

import shoal.modelparallel as smp
from harness import Checks
from shoal.modelparallel.nn.huggingface import bert, gpt2

V, S, HID, LAYERS, HEADS, ROWS = 64, 12, 32, 2, 4, 3


def close(got, want, what, rel=1e-5):
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    err, scale = (got - want).abs().max().item(), want.abs().max().item()
    assert err <= rel * max(scale, 1e-6), f"{what}: max difference {err:.3g} (scale {scale:.3g})"


def my_batch():
    """This rank's rows of a global batch (2 x ROWS rows): ids, padding mask, labels."""
    g = torch.Generator().manual_seed(11)
    ids = torch.randint(2, V, (2 * ROWS, S), generator=g)
    mask = torch.ones(2 * ROWS, S, dtype=torch.long)
    mask[0, 9:] = 0
    mask[ROWS + 1, 5:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    rows = slice(smp.dp_rank() * ROWS, (smp.dp_rank() + 1) * ROWS)
    return ids[rows], mask[rows], labels[rows]


@smp.step
def forward_step(model, ids, mask, labels):
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    return out.loss, out.logits


def twins(cls, config, enable):
    """The model to wrap (tensor parallelism enabled by `enable`) and a plain copy."""
    torch.manual_seed(0)
    net = enable(lambda: cls(config))
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.02 * torch.randn_like(p))
    plain = cls(config)
    plain.load_state_dict(net.state_dict())
    return net.eval(), plain.eval()


def compare(model, plain, to_hf):
    ids, mask, labels = my_batch()
    loss, logits = forward_step(model, ids, mask, labels)
    want = plain(input_ids=ids, attention_mask=mask, labels=labels)
    close(loss.reduce_mean(), want.loss, "loss")
    keep = mask.bool()
    close(logits.concat()[keep], want.logits[keep], "logits")
    sd = to_hf(model.state_dict())
    ref = plain.state_dict()
    assert sorted(sd) == sorted(ref), f"keys differ: {sorted(set(sd) ^ set(ref))[:6]}"
    for k, v in ref.items():
        assert torch.equal(sd[k].cpu(), v), f"parameter {k} differs after the round trip"


def gpt2_lm():
    config = T.GPT2Config(vocab_size=V, n_positions=16, n_embd=HID, n_layer=LAYERS, n_head=HEADS, resid_pdrop=0.0,
                          embd_pdrop=0.0, attn_pdrop=0.0)

    def enable(build):
        with smp.tensor_parallelism():
            return build()
    net, plain = twins(T.GPT2LMHeadModel, config, enable)
    model = smp.DistributedModel(net)
    inner = model.get_module()
    assert type(inner).__name__ == "DistributedTransformerLMHead", type(inner).__name__
    assert len(inner.transformer.seq_layers) == LAYERS
    q = inner.transformer.seq_layers[0].attention.query.weight
    assert tuple(q.shape) == (HID // 2, HID) and getattr(q, "_smp_distributed", False), tuple(q.shape)
    compare(model, plain, gpt2.translate_state_dict_to_hf_gpt2)


def bert_mlm():
    config = T.BertConfig(vocab_size=V, hidden_size=HID, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                          intermediate_size=2 * HID, max_position_embeddings=16, hidden_dropout_prob=0.0,
                          attention_probs_dropout_prob=0.0)

    def enable(build):
        m = build()
        smp.set_tensor_parallelism(m.bert.encoder)
        return m
    net, plain = twins(T.BertForMaskedLM, config, enable)
    model = smp.DistributedModel(net)
    enc = model.get_module().bert.encoder
    assert type(enc).__name__ == "DistributedTransformer" and len(enc.seq_layers) == LAYERS, type(enc).__name__
    compare(model, plain, bert.translate_state_dict_to_hf_bert)


def tp2(c):
    smp.init({"tensor_parallel_degree": 2, "ddp": True, "pipeline_parallel_degree": 1})
    assert (smp.tp_size(), smp.dp_size(), smp.rdp_size()) == (2, 2, 1)
    c.run("GPT-2 built in smp.tensor_parallelism()", gpt2_lm)
    c.run("BERT with smp.set_tensor_parallelism(encoder)", bert_mlm)


SUITES = {"tp2": tp2}


def main():
    c = Checks()
    SUITES[sys.argv[1]](c)
    return c.report()


if __name__ == "__main__":
    sys.exit(main())
