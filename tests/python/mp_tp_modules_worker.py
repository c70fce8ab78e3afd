"""One rank of a job checking smp.nn's tensor-parallel modules (test_mp_tp_modules.py).

Usage: mp_tp_modules_worker.py SUITE, with SUITE one of

- parity: every module at tp 2 against the same module built at tp 1 with the
  same seed (float64): outputs, input gradients and the full (gathered)
  parameter gradients, in both batch modes;
- hf: the LM head configured as the Hugging Face families against
  transformers' own GPT-2, GPT-Neo and GPT-J causal LMs (weights copied in
  with shards.load_full, read back with shards.gather_full); half precision;
- errors: bad constructor arguments raise on every rank, naming the argument
  and the rank, and send nothing;
- smp: the modules on the TP group of smp.init({"tensor_parallel_degree": 2}).

Batch modes: prescaled False, each rank feeds its own half of the batch and is
compared with the reference's rows of that half; prescaled True, both ranks
feed the whole batch. The reference's objective is the sum of the ranks'
objectives in the first mode, so a replicated parameter's reference gradient
is the sum of the ranks' gradients there, and each rank's own in the second.
"""

import os
import sys
import warnings

import torch
import torch.distributed as dist

import shoal.torch  # noqa: F401  (registers the backend)
import shoal.modelparallel as smp
from harness import Checks
from shoal.modelparallel import nn as smp_nn
from shoal.modelparallel.tp import env as tp_env
from shoal.modelparallel.tp import ops, shards
from shoal.modelparallel.tp.base import is_distributed

RANK = int(os.environ["RANK"])
WS = int(os.environ["WORLD_SIZE"])
STATE = "state"                 # build() without an override: the TP group smp.init made
B, S, H, HEADS, D, I, V = 2, 8, 32, 4, 8, 64, 64   # per-rank batch, seq, hidden, heads, head size, inner, vocab
ATT = dict(num_attention_heads=HEADS, attention_head_size=D, hidden_size=H, attention_dropout_prob=0.0,
           hidden_dropout_prob=0.0)
MLP = dict(hidden_size=H, intermediate_size=I, hidden_dropout_prob=0.0)
LAYER = dict(ATT, intermediate_size=I)
warnings.filterwarnings("ignore")


def close(got, want, what, tol):
    got, want = torch.as_tensor(got).double(), torch.as_tensor(want).double()
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    err = (got - want).abs().max().item() if got.numel() else 0.0
    assert err <= tol * (1 + want.abs().max().item()), f"{what}: max difference {err:.3g} (tolerance {tol})"


def own(t, prescaled):
    """This rank's part of a full-batch tensor in the batch mode."""
    return t if prescaled or not torch.is_tensor(t) else t.chunk(WS, 0)[RANK]


def build(make, group, prescaled, seed=7):
    torch.manual_seed(seed)
    if group == STATE:
        return make()
    with tp_env.use(group, prescaled):
        return make()


def rand(*shape, seed, scale=1.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * scale


def additive_mask(n, s, seed):
    """[n, 1, 1, s]: 0, or -1e4 at each sample's last 0..2 positions (a padded batch)."""
    g = torch.Generator().manual_seed(seed)
    m = torch.zeros(n, 1, 1, s, dtype=torch.float64)
    for i in range(n):
        pad = int(torch.randint(0, 3, (1,), generator=g))
        if pad:
            m[i, ..., s - pad:] = -1e4
    return m


def full_grads(mod, prescaled):
    """Each parameter's gradient as the reference has it (module docstring)."""
    out = {}
    for name, p in mod.named_parameters():
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        env = tp_env.TPEnv(mod.tp_env.group, mod.tp_env.rank, mod.tp_env.size, prescaled)
        if is_distributed(p):
            g = ops.all_gather(g, env, p._smp_split_dim)
        elif not prescaled:
            g = ops.all_reduce(g.clone(), env)
        out[name] = g
    return out


def same_grads(mod, ref, prescaled, tol):
    got = full_grads(mod, prescaled)
    for name, p in ref.named_parameters():
        want = p.grad if p.grad is not None else torch.zeros_like(p)
        close(got[name], want, f"gradient of {name}", tol)


def same_params(mod, ref):
    full, want = shards.gather_full(mod), ref.state_dict()
    assert sorted(full) == sorted(want), (sorted(full), sorted(want))
    for k in want:
        close(full[k], want[k], f"initial {k} (gathered) vs tp 1", 0.0)


# ------------------------------------------------------------------------------------------- parity
def parity(make, inputs, run, group, prescaled, diff=(0,), tol=1e-9):
    """make(): the module; inputs: full-batch tensors (dim 0 the batch, 2B rows) or None;
    run(module, inputs) -> output tensor [rows, ...]; diff: the inputs that get gradients."""
    ref = build(make, None, False)
    mod = build(make, group, prescaled)
    assert mod.tp_size == WS and ref.tp_size == 1
    same_params(mod, ref)
    ref_in = [x.clone().requires_grad_(i in diff) if torch.is_tensor(x) else x for i, x in enumerate(inputs)]
    my_in = [own(x, prescaled).clone().requires_grad_(i in diff) if torch.is_tensor(x) else x
             for i, x in enumerate(inputs)]
    ref_out, out = run(ref, ref_in), run(mod, my_in)
    g = rand(*ref_out.shape, seed=99).to(ref_out.dtype)
    (ref_out * g).sum().backward()
    (out * own(g, prescaled)).sum().backward()
    close(out, own(ref_out, prescaled), "output", tol)
    for i in diff:
        close(my_in[i].grad, own(ref_in[i].grad, prescaled), f"gradient of input {i}", tol)
    same_grads(mod, ref, prescaled, tol)


def hidden(seed=1):
    return rand(WS * B, S, H, seed=seed)


def parity_cases():
    """name -> (make, inputs, run, diff)"""
    mask, h, cross = additive_mask(WS * B, S, 3), hidden(1), rand(WS * B, S + 2, H, seed=2)
    cross_mask = additive_mask(WS * B, S + 2, 4)
    ids = torch.randint(0, 50, (WS * B, 6), generator=torch.Generator().manual_seed(5))
    ids[0, :2] = 3                                    # the padding row is looked up
    first = lambda m, xs: m(xs[0])                   # noqa: E731
    pair = lambda m, xs: m(tuple(xs))                # noqa: E731
    layer = lambda m, xs: m(tuple(xs))[0]            # noqa: E731
    return {
        "linear": (lambda: smp_nn.DistributedLinear(16, 32), [rand(WS * B, 5, 16, seed=6)], first, (0,)),
        "embedding": (lambda: smp_nn.DistributedEmbedding(50, 32, padding_idx=3), [ids], first, ()),
        "attention_post_ln": (lambda: smp_nn.DistributedAttentionLayer(**ATT), [h, mask], pair, (0,)),
        "attention_pre_ln_causal": (lambda: smp_nn.DistributedAttentionLayer(
            **ATT, causal_mask_size=S, pre_layernorm=True, post_layernorm=False, use_normal_initialization=True),
            [h, mask], pair, (0,)),
        "attention_cross": (lambda: smp_nn.DistributedAttentionLayer(**ATT, cross_attention=True),
                            [h, cross, cross_mask], pair, (0, 1)),
        "output_post_ln_gelu": (lambda: smp_nn.DistributedTransformerOutputLayer(**MLP), [h], first, (0,)),
        "output_pre_ln_gelu_new": (lambda: smp_nn.DistributedTransformerOutputLayer(
            **MLP, activation="gelu_new", pre_layernorm=True, post_layernorm=False, fp32_residual_addition=True),
            [h], first, (0,)),
        "layer_cross": (lambda: smp_nn.DistributedTransformerLayer(**LAYER, add_cross_attention=True,
                                                                   activation="relu", causal_mask_size=S),
                        [h, cross, mask, cross_mask], layer, (0, 1)),
        "layer_gptj_parallel_rotary": (lambda: smp_nn.DistributedTransformerLayer(
            **LAYER, causal_mask_size=S, pre_layernorm=True, post_layernorm=False, parallel_attn_output=True,
            rotary_dim=4, use_qkv_bias=False, use_dense_bias=False, activation="gelu_new"), [h, mask], layer, (0,)),
        "transformer_gptneo_local": (lambda: smp_nn.DistributedTransformer(
            3, **LAYER, causal_mask_size=S, pre_layernorm=True, post_layernorm=True, activation="gelu_new",
            attention_layers=["global", "local", "local"], window_size=3, use_qkv_bias=False,
            scale_attention_scores=False), [h, mask], layer, (0,)),
        "transformer_bert_post_ln": (lambda: smp_nn.DistributedTransformer(
            2, **LAYER, activation="relu", use_normal_initialization=True, initializer_range=0.3),
            [h, mask], layer, (0,)),
    }


def lm_head_parity(make, group, prescaled, tol=1e-9):
    """Loss and logits of DistributedTransformerLMHead; the reference runs each rank's batch."""
    ref, mod = build(make, None, False), build(make, group, prescaled)
    same_params(mod, ref)
    g = torch.Generator().manual_seed(11)
    ids = torch.randint(0, V, (WS * B, S), generator=g)
    mask = torch.zeros(WS * B, S, dtype=torch.long)
    mask[1, -2:] = 1                                              # padding at the end of sample 1
    labels = ids.clone()
    labels[1, -2:] = -100
    labels[2, :3] = -100
    types = torch.randint(0, 2, (WS * B, S), generator=g)
    pos = torch.arange(S).flip(0).expand(WS * B, S).contiguous()   # given positions, not 0..S-1
    grad = rand(WS * B, S, V, seed=12)
    parts = [slice(r * B, (r + 1) * B) for r in range(WS)] if not prescaled else [slice(None)]
    ref_out = []
    for sl in parts:
        loss, logits = ref((ids[sl], mask[sl], types[sl], pos[sl], labels[sl]))
        (loss + (logits * grad[sl]).sum()).backward()
        ref_out.append((loss.detach(), logits.detach()))
    mine = slice(RANK * B, (RANK + 1) * B) if not prescaled else slice(None)
    loss, logits = mod((ids[mine], mask[mine], types[mine], pos[mine], labels[mine]))
    (loss + (logits * grad[mine]).sum()).backward()
    want_loss, want_logits = ref_out[RANK if not prescaled else 0]
    assert loss.dtype == torch.float64 and torch.isfinite(loss)
    close(loss, want_loss, "loss", tol)
    close(logits, want_logits, "logits", tol)
    same_grads(mod, ref, prescaled, tol)


def lm_head_gpt2_style():
    return smp_nn.DistributedTransformerLMHead(
        num_layers=2, **LAYER, vocab_size=V, num_positions=S, num_token_types=2, causal_mask_size=S,
        activation="gelu_new", pre_layernorm=True, post_layernorm=True, use_normal_initialization=True,
        shift_labels=True)


def lm_head_bert_style():
    return smp_nn.DistributedTransformerLMHead(
        num_layers=2, **LAYER, vocab_size=V, num_positions=S, num_token_types=2, lm_head_bias=True,
        use_normal_initialization=True, initializer_range=0.2)


def lm_head_gptj_style():
    return smp_nn.DistributedTransformerLMHead(
        num_layers=2, **LAYER, vocab_size=V, num_positions=0, causal_mask_size=S, activation="gelu_new",
        pre_layernorm=True, post_layernorm=True, parallel_attn_output=True, rotary_dim=4, use_qkv_bias=False,
        use_dense_bias=False, tie_lm_head=False, lm_head_bias=True, use_normal_initialization=True,
        initializer_range=0.2, shift_labels=True)


def suite_parity(c, group):
    torch.set_default_dtype(torch.float64)
    for prescaled in (False, True):
        c.prefix = f"prescaled={prescaled}:"
        for name, (make, inputs, run, diff) in parity_cases().items():
            c.run(name, parity, make, inputs, run, group, prescaled, diff)
        c.run("lm_head_gpt2_style", lm_head_parity, lm_head_gpt2_style, group, prescaled)
        c.run("lm_head_bert_style", lm_head_parity, lm_head_bert_style, group, prescaled)
        c.run("lm_head_gptj_style", lm_head_parity, lm_head_gptj_style, group, prescaled)


# ------------------------------------------------------------------------------------------------ hf
def t_(w):
    return w.t().contiguous()


def gpt2_full_state(hf):
    """GPT2LMHeadModel's weights under DistributedTransformerLMHead's (full) keys."""
    sd, out = hf.state_dict(), {}
    out["word_embedding.weight"] = sd["transformer.wte.weight"]
    out["position_embedding.weight"] = sd["transformer.wpe.weight"]
    for i in range(hf.config.n_layer):
        p, q = f"transformer.h.{i}.", f"transformer.seq_layers.{i}."
        w, b = t_(sd[p + "attn.c_attn.weight"]).chunk(3, 0), sd[p + "attn.c_attn.bias"].chunk(3, 0)
        for j, name in enumerate(("query", "key", "value")):
            out[q + f"attention.{name}.weight"], out[q + f"attention.{name}.bias"] = w[j], b[j]
        out[q + "attention.dense.weight"], out[q + "attention.dense.bias"] = t_(sd[p + "attn.c_proj.weight"]), \
            sd[p + "attn.c_proj.bias"]
        out[q + "output.dense1.weight"], out[q + "output.dense1.bias"] = t_(sd[p + "mlp.c_fc.weight"]), \
            sd[p + "mlp.c_fc.bias"]
        out[q + "output.dense2.weight"], out[q + "output.dense2.bias"] = t_(sd[p + "mlp.c_proj.weight"]), \
            sd[p + "mlp.c_proj.bias"]
        for ln, mine in (("ln_1", "attention.pre_layernorm"), ("ln_2", "output.pre_layernorm")):
            out[q + mine + ".weight"], out[q + mine + ".bias"] = sd[p + ln + ".weight"], sd[p + ln + ".bias"]
    out["transformer.layernorm.weight"], out["transformer.layernorm.bias"] = \
        sd["transformer.ln_f.weight"], sd["transformer.ln_f.bias"]
    return out


def hf_gpt2(group, prescaled):
    import transformers as T
    torch.manual_seed(0)
    hf = T.GPT2LMHeadModel(T.GPT2Config(n_layer=2, n_embd=H, n_head=HEADS, n_inner=I, vocab_size=V, n_positions=S,
                                        bos_token_id=0, eos_token_id=0,
                                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                        attn_implementation="eager")).eval()
    mod = build(lambda: smp_nn.DistributedTransformerLMHead(
        num_layers=2, **LAYER, vocab_size=V, num_positions=S, causal_mask_size=S, activation="gelu_new",
        pre_layernorm=True, post_layernorm=True, shift_labels=True), group, prescaled)
    full = gpt2_full_state(hf)
    shards.load_full(mod, full)
    back = shards.gather_full(mod)
    for k in full:
        close(back[k], full[k], f"gather_full {k}", 0.0)
    g = torch.Generator().manual_seed(21)
    ids = torch.randint(0, V, (WS * B, S), generator=g)
    keep = torch.ones(WS * B, S, dtype=torch.long)
    keep[0, -3:] = 0
    labels = ids.masked_fill(keep == 0, -100)
    ids, keep, labels = own(ids, prescaled), own(keep, prescaled), own(labels, prescaled)
    want = hf(input_ids=ids, attention_mask=keep, labels=labels)
    loss, logits = mod((ids, 1 - keep, None, None, labels))
    close(loss, want.loss, "GPT-2 loss", 1e-5)
    close(logits, want.logits, "GPT-2 logits", 1e-5)
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in mod.parameters())
    for dtype in (torch.bfloat16, torch.float16):     # a half-precision model: same loss, roughly
        half = build(lambda: smp_nn.DistributedTransformerLMHead(
            num_layers=2, **LAYER, vocab_size=V, num_positions=S, causal_mask_size=S, activation="gelu_new",
            pre_layernorm=True, post_layernorm=True, shift_labels=True), group, prescaled).to(dtype)
        shards.load_full(half, full)
        hl, hlogits = half((ids, 1 - keep, None, None, labels))
        assert hl.dtype == torch.float32 and hlogits.dtype == dtype
        close(hl, want.loss, f"GPT-2 loss in {dtype}", 2e-2)
        hl.backward()
        assert all(p.grad is not None and p.grad.dtype == dtype and torch.isfinite(p.grad).all()
                   for p in half.parameters()), dtype


def hf_causal_lm(kind, group, prescaled):
    """GPTNeoForCausalLM (local attention, unscaled scores, tied head) and GPTJForCausalLM (parallel
    blocks, rotary, no position embedding, its own LM head with a bias) against the LM head."""
    import transformers as T
    torch.manual_seed(0)
    if kind == "gptneo":
        hf = T.GPTNeoForCausalLM(T.GPTNeoConfig(
            num_layers=3, attention_types=[[["global", "local", "local"], 1]], window_size=3, vocab_size=V,
            hidden_size=H, num_heads=HEADS, intermediate_size=I, max_position_embeddings=S, embed_dropout=0.0,
            attention_dropout=0.0, resid_dropout=0.0, bos_token_id=0, eos_token_id=0,
            attn_implementation="eager")).eval()
        ext = dict(num_layers=3, num_positions=S, attention_layers=["global", "local", "local"], window_size=3,
                   use_qkv_bias=False, scale_attention_scores=False)
    else:
        hf = T.GPTJForCausalLM(T.GPTJConfig(
            n_layer=2, n_embd=H, n_head=HEADS, n_inner=I, rotary_dim=4, vocab_size=V, n_positions=S,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
            attn_implementation="eager")).eval()
        ext = dict(num_layers=2, num_positions=0, parallel_attn_output=True, rotary_dim=4, use_qkv_bias=False,
                   use_dense_bias=False, tie_lm_head=False, lm_head_bias=True)
    mod = build(lambda: smp_nn.DistributedTransformerLMHead(
        **LAYER, vocab_size=V, causal_mask_size=S, activation="gelu_new", pre_layernorm=True,
        post_layernorm=True, shift_labels=True, **ext), group, prescaled)
    body = hf.transformer
    full = {"word_embedding.weight": body.wte.weight, "transformer.layernorm.weight": body.ln_f.weight,
            "transformer.layernorm.bias": body.ln_f.bias}
    if kind == "gptneo":
        full["position_embedding.weight"] = body.wpe.weight
    else:
        full["lm_head_weight"], full["lm_head_bias"] = hf.lm_head.weight, hf.lm_head.bias
    for i, blk in enumerate(body.h):
        q = f"transformer.seq_layers.{i}."
        att = blk.attn.attention if kind == "gptneo" else blk.attn
        lins = {"query": att.q_proj, "key": att.k_proj, "value": att.v_proj, "dense": att.out_proj}
        mlp = {"dense1": blk.mlp.c_fc, "dense2": blk.mlp.c_proj} if kind == "gptneo" else \
            {"dense1": blk.mlp.fc_in, "dense2": blk.mlp.fc_out}
        for pre, d in (("attention.", lins), ("output.", mlp)):
            for name, lin in d.items():
                full[q + pre + name + ".weight"] = lin.weight
                if lin.bias is not None:
                    full[q + pre + name + ".bias"] = lin.bias
        full[q + "attention.pre_layernorm.weight"], full[q + "attention.pre_layernorm.bias"] = \
            blk.ln_1.weight, blk.ln_1.bias
        if kind == "gptneo":
            full[q + "output.pre_layernorm.weight"], full[q + "output.pre_layernorm.bias"] = \
                blk.ln_2.weight, blk.ln_2.bias
    shards.load_full(mod, {k: v.detach() for k, v in full.items()})
    g = torch.Generator().manual_seed(22)
    ids = torch.randint(0, V, (WS * B, S), generator=g)
    keep = torch.ones(WS * B, S, dtype=torch.long)
    keep[-1, -2:] = 0
    labels = ids.masked_fill(keep == 0, -100)
    ids, keep, labels = own(ids, prescaled), own(keep, prescaled), own(labels, prescaled)
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=keep, labels=labels)
        loss, logits = mod((ids, 1 - keep, None, None, labels))
    close(loss, want.loss, f"{kind} loss", 1e-5)
    close(logits, want.logits, f"{kind} logits", 1e-5)


def suite_hf(c, group):
    for prescaled in (False, True):
        c.prefix = f"prescaled={prescaled}:"
        c.run("gpt2_lm_head", hf_gpt2, group, prescaled)
        c.run("gptneo_causal_lm", hf_causal_lm, "gptneo", group, prescaled)
        c.run("gptj_causal_lm", hf_causal_lm, "gptj", group, prescaled)


# -------------------------------------------------------------------------------------------- errors
BAD = {
    "heads": (lambda: smp_nn.DistributedAttentionLayer(num_attention_heads=3, attention_head_size=8,
                                                       hidden_size=24), "num_attention_heads 3 is not divisible"),
    "intermediate": (lambda: smp_nn.DistributedTransformerOutputLayer(hidden_size=32, intermediate_size=63),
                     "intermediate_size 63 is not divisible"),
    "vocab": (lambda: smp_nn.DistributedTransformerLMHead(num_layers=1, **LAYER, vocab_size=63),
              "vocab_size 63 is not divisible"),
    "out_features": (lambda: smp_nn.DistributedLinear(8, 7), "out_features 7 is not divisible"),
    "embedding_dim": (lambda: smp_nn.DistributedEmbedding(10, 7), "embedding_dim 7 is not divisible"),
    "hidden": (lambda: smp_nn.DistributedTransformerLayer(num_attention_heads=4, attention_head_size=8,
                                                          hidden_size=30, intermediate_size=64),
               "hidden_size 30 is not num_attention_heads 4 x attention_head_size 8"),
    "activation": (lambda: smp_nn.DistributedTransformer(1, **LAYER, activation="swish"),
                   "activation 'swish' is not one of"),
    "layernorms": (lambda: smp_nn.DistributedTransformerLayer(**LAYER, pre_layernorm=False, post_layernorm=False),
                   "at least one of pre_layernorm and post_layernorm"),
    "attention_layers": (lambda: smp_nn.DistributedTransformer(2, **LAYER, attention_layers=["global"]),
                         "attention_layers has 1 entries for num_layers 2"),
    "local_window": (lambda: smp_nn.DistributedTransformer(1, **LAYER, causal_mask_size=S,
                                                           attention_layers=["local"]),
                     "local attention needs a positive window_size"),
}


def expect_error(make, fragment, group):
    with tp_env.use(group):
        try:
            make()
        except smp.SMPValidationError as e:
            msg = str(e)
            assert fragment in msg and f"(rank {RANK}, tp_size {WS})" in msg, msg
            assert msg.startswith("smp.nn.Distributed"), msg
            return
    raise AssertionError(f"no error (wanted {fragment!r})")


def unknown_keyword(group):
    with tp_env.use(group):
        try:
            smp_nn.DistributedTransformerLayer(**LAYER, rotary_diim=4)
        except TypeError as e:
            assert "rotary_diim" in str(e), e
            return
    raise AssertionError("no TypeError")


def nothing_sent(group):
    """After the refusals the TP group's next collective pairs with the other rank's."""
    t = torch.full((3,), float(RANK + 1))
    dist.all_reduce(t, group=group)
    assert t.tolist() == [float(sum(range(1, WS + 1)))] * 3, t


def suite_errors(c, group):
    for name, (make, fragment) in BAD.items():
        c.run(name, expect_error, make, fragment, group)
    c.run("unknown_keyword", unknown_keyword, group)
    c.run("nothing_sent", nothing_sent, group)


# ----------------------------------------------------------------------------------------------- smp
def through_smp(c):
    torch.set_default_dtype(torch.float64)
    for prescaled in (False, True):
        c.prefix = f"prescaled={prescaled}:"

        def init():
            smp.init({"tensor_parallel_degree": WS, "ddp": True, "pipeline_parallel_degree": 1,
                      "prescaled_batch": prescaled})
            env = tp_env.current()
            assert env.size == WS and env.rank == smp.tp_rank() and env.prescaled is prescaled, env
            assert env.group is smp.state.tpg
        c.run("init", init)
        make, inputs, run, diff = parity_cases()["layer_gptj_parallel_rotary"]
        c.run("layer", parity, make, inputs, run, STATE, prescaled, diff)
        c.run("lm_head", lm_head_parity, lm_head_gpt2_style, STATE, prescaled)
    smp.shutdown()


def main():
    suite = sys.argv[1]
    c = Checks()
    if suite == "smp":
        through_smp(c)
        return c.report()
    dist.init_process_group(backend="shoal")
    group = dist.new_group(list(range(WS)), backend="shoal")
    {"parity": suite_parity, "hf": suite_hf, "errors": suite_errors}[suite](c, group)
    code = c.report()
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
