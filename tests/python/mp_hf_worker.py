"""One rank of the Hugging Face job (test_mp_hf.py): transformers models built
from configs (random weights, no downloads) wrapped unchanged in
smp.DistributedModel, trained with the pipeline and, in the same process, as
plain modules on the same data; losses and parameters must agree.

Usage: mp_hf_worker.py PARTITIONS. Prints one RESULT line (harness.py).
"""

import sys
import warnings

import torch

from mp_worker import Checks, close, dp_mean, same_state  # noqa: E402  (also sets up smp's imports)
import shoal.modelparallel as smp  # noqa: E402

warnings.filterwarnings("ignore")
V = 97


def gpt2():
    import transformers as T
    return T.GPT2LMHeadModel(T.GPT2Config(
        n_layer=4, n_embd=32, n_head=2, vocab_size=V, n_positions=32, bos_token_id=0, eos_token_id=0,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))        # tied embeddings (the default)


def bert():
    import transformers as T
    return T.BertForMaskedLM(T.BertConfig(
        num_hidden_layers=4, hidden_size=32, num_attention_heads=2, intermediate_size=64, vocab_size=V,
        max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))


def llama():
    import transformers as T
    return T.LlamaForCausalLM(T.LlamaConfig(
        num_hidden_layers=4, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
        vocab_size=V, max_position_embeddings=64))


def t5():
    import transformers as T
    return T.T5ForConditionalGeneration(T.T5Config(
        num_layers=2, num_decoder_layers=2, d_model=32, d_kv=16, d_ff=64, num_heads=2, vocab_size=V,
        dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0))   # encoder-decoder, three-way ties


def train(name, make, cfg, steps=3, batch=4, t=8, place=None):
    """Loss through labels=, attention_mask, the ModelOutput's .loss, model.backward.
    place(model): manual placement (smp.set_partition) of the built model."""
    smp.init(cfg)
    dp, r = smp.dp_size(), smp.dp_rank()
    data = [torch.randint(0, V, (batch * dp, t), generator=torch.Generator().manual_seed(s)) for s in range(steps)]
    torch.manual_seed(0)
    ref = make()
    torch.manual_seed(0)
    net = make()
    if place is not None:
        place(net)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
    ref_losses = []
    for x in data:
        ropt.zero_grad()
        out = ref(input_ids=x, attention_mask=torch.ones_like(x), labels=x)
        out.loss.backward()
        ropt.step()
        ref_losses.append(out.loss.item())

    model = smp.DistributedModel(net)
    opt = smp.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1))

    @smp.step
    def step(model, x):
        out = model(input_ids=x, attention_mask=torch.ones_like(x), labels=x)
        from transformers.utils import ModelOutput
        assert isinstance(out, ModelOutput), type(out)   # the ModelOutput, as the model returns it
        model.backward(out.loss)
        return out.loss

    losses = []
    for x in data:
        opt.zero_grad()
        losses.append(dp_mean(step(model, x[r * batch:(r + 1) * batch]).reduce_mean()))
        opt.step()
    if place is not None:
        pl = model._smp.rt.pl
        assert pl.mode == "manual" and set(pl.unit_part.values()) == set(range(smp.pp_size())), pl.unit_part
    close(losses, ref_losses, f"{name}: losses")
    same_state(model.state_dict(), ref.state_dict(), f"{name}: parameters")
    return model


def place_gpt2(m):
    """The second half of the blocks and the final norm on partition 1; lm_head stays
    with the embedding it is tied to (partition 0): the pipeline goes 0 -> 1 -> 0."""
    h = m.transformer.h
    for block in h[len(h) // 2:]:
        smp.set_partition(block, 1)
    smp.set_partition(m.transformer.ln_f, 1)


def place_llama(m):
    layers = m.model.layers
    for layer in layers[len(layers) // 2:]:
        smp.set_partition(layer, 1)
    smp.set_partition(m.model.norm, 1)
    smp.set_partition(m.lm_head, 1)


def main():
    p = int(sys.argv[-1])
    c = Checks()
    base = {"partitions": p, "microbatches": 2, "ddp": smp_ddp(p)}

    def gpt2_tied():
        # Balanced by memory (memory_weight 1: deterministic, unlike timings of a tiny model).
        model = train("gpt2", gpt2, {**base, "pipeline": "interleaved", "memory_weight": 1.0})
        pl = model._smp.rt.pl
        assert pl.unit_part["transformer.wte"] == pl.unit_part["lm_head"], "tied modules on different stages"
        per_stage = [sum(pl.unit_cost[u][1] + pl.unit_cost[u][2] for u in pl.units if pl.unit_part[u] == s)
                     for s in range(p)]
        assert min(per_stage) > 0.5 * max(per_stage), f"tied embeddings unbalanced the stages: {per_stage}"
    c.run("GPT-2 (tied embeddings), interleaved", gpt2_tied)
    # Without replicas every model runs under both schedules; with them, one each.
    both = not base["ddp"]
    for label, make, first in (("BERT (masked LM)", bert, "simple"), ("Llama-style", llama, "interleaved"),
                               ("T5 (encoder-decoder)", t5, "simple")):
        for pipe in (("simple", "interleaved") if both else (first,)):
            c.run(f"{label}, {pipe}", train, label, make, {**base, "pipeline": pipe})
    if both:
        c.run("GPT-2 (tied embeddings), simple", train, "gpt2", gpt2, {**base, "pipeline": "simple"})
    manual = {**base, "auto_partition": False}
    c.run("GPT-2, manual (set_partition), interleaved", train, "gpt2 manual", gpt2,
          {**manual, "pipeline": "interleaved"}, 3, 4, 8, place_gpt2)
    if both:
        c.run("Llama-style, manual (set_partition), simple", train, "llama manual", llama,
              {**manual, "pipeline": "simple"}, 3, 4, 8, place_llama)
    return c.report()


def smp_ddp(p):
    import os
    return int(os.environ["WORLD_SIZE"]) // p > 1


if __name__ == "__main__":
    sys.exit(main())
