"""One rank of a tensor-parallel smp job: GPT-2 (from a config, random weights, dropout off) built
inside ``smp.model_creation(tensor_parallelism=True)``, wrapped, trained, checkpointed.

Usage: mp_tp_worker.py JOB SUITE[:key=value,...] ...   (the world size is the harness's)

- ``parity:tp=T,pp=P[,prescaled=1][,device=1]``: T-way tensor x P-way pipeline x the rest data
  parallel; 4 AdamW steps. The per-step loss (averaged over the data-parallel ranks) and every
  parameter at the end (the gathered state dict, translated to Hugging Face's names) equal one
  process training the plain GPT2LMHeadModel on the same global batches (fp32, float tolerance).
  ``device=1``: each rank sets its accelerator (the test device "fakegpu") first, as a SageMaker
  script does, and the batches come from the CPU.
- ``half:tp=T``: bf16 parameters (fp32 masters, loss scaling off) against the fp32 run: every
  loss within a stated bound.
- ``checkpoints``: (world 4, tp 2 x pp 2) a partial checkpoint resumes in the same layout and the
  next steps' losses are those of an uninterrupted run; a full checkpoint loads into the plain
  GPT2LMHeadModel (same logits as the smp model's) and, after ``smp.init`` with another layout
  (tp 4; tp 1 x pp 2 x dp 2), into that layout (same loss on the same batch).
- ``sharded:kind=zero1|sdp``: (world 4) tp 2 x rdp 2 with shard_optimizer_state or
  sharded_data_parallel_degree 2: training equals one process; the full model checkpoint (the
  optimizer's full state is refused) equals the plain model trained alike; a partial checkpoint
  (every rank's shards) resumes in the layout, the next steps those of an uninterrupted run.
- ``registration``: smp.tp_register_with_module with init/forward/return hooks replaces a user's
  block by DistributedTransformerLayer, called with the block's own signature; nn.Linear built
  inside smp.tensor_parallelism() becomes DistributedLinear with the original's weights, one
  built inside a nested enabled=False context does not; set_tensor_parallelism(module, False)
  keeps a module; one sharing a weight with a module outside it stays whole.
- ``errors``: heads or vocabulary that do not divide over the TP ranks, and a distributed module
  built before ``smp.init`` (for a one-rank TP group), are errors on every rank that name them.
"""

import os
import sys

import torch

if "device=1" in " ".join(sys.argv[1:]):
    import fakegpu
    fakegpu.load()

import torch.distributed as dist  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

import shoal.modelparallel as smp  # noqa: E402
from harness import Checks  # noqa: E402
from shoal.modelparallel.nn.huggingface.gpt2 import translate_state_dict_to_hf_gpt2  # noqa: E402

WS = int(os.environ["WORLD_SIZE"])
STEPS, BATCH, SEQ = 4, 8, 8


def config(**kw):
    base = dict(vocab_size=64, n_positions=SEQ, n_embd=32, n_layer=4, n_head=4, resid_pdrop=0.0,
                embd_pdrop=0.0, attn_pdrop=0.0, activation_function="gelu_new", use_cache=False)
    base.update(kw)
    return GPT2Config(**base)


def close(got, want, what, rtol=1e-4, atol=1e-5):
    got, want = torch.as_tensor(got).double().cpu(), torch.as_tensor(want).double().cpu()
    if got.shape != want.shape:
        raise AssertionError(f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}")
    if not torch.allclose(got, want, rtol=rtol, atol=atol):
        raise AssertionError(f"{what}: max difference {(got - want).abs().max().item():.3g}")


def batches(steps=STEPS):
    g = torch.Generator().manual_seed(7)
    return [torch.randint(0, 64, (BATCH, SEQ), generator=g) for _ in range(steps)]


def smp_config(tp, pp, prescaled=False, **kw):
    cfg = {"tensor_parallel_degree": tp, "pipeline_parallel_degree": pp, "ddp": True,
           "microbatches": 2, "prescaled_batch": prescaled}
    cfg.update(kw)
    return cfg


def build(cfg_kw=None, dtype=None):
    """The smp model and a plain copy with the same weights (built before the wrapping)."""
    torch.manual_seed(0)
    with smp.model_creation(tensor_parallelism=True, dtype=dtype):
        net = GPT2LMHeadModel(config(**(cfg_kw or {})))
    plain = GPT2LMHeadModel(config(**(cfg_kw or {})))
    plain.load_state_dict(net.state_dict())
    return smp.DistributedModel(net), plain.float()


@smp.step
def lm_step(model, ids):
    out = model(input_ids=ids, labels=ids)
    model.backward(out["loss"])
    return out["loss"]


@smp.step
def eval_step(model, ids):
    return model(input_ids=ids, labels=ids)["loss"]


def my_rows(ids):
    """This rank's rows of a global batch: by dp_rank, or by rdp_rank when the batch is prescaled."""
    prescaled = smp.state.cfg.prescaled_batch
    n, r = (smp.rdp_size(), smp.rdp_rank()) if prescaled else (smp.dp_size(), smp.dp_rank())
    b = ids.size(0) // n
    return ids[r * b:(r + 1) * b]


def reference(plain, data, chunks, lr=1e-2):
    """One process: the mean of the Hugging Face losses of `chunks` equal row chunks per batch."""
    opt = torch.optim.AdamW(plain.parameters(), lr=lr)
    losses = []
    for ids in data:
        opt.zero_grad()
        loss = sum(plain(input_ids=c, labels=c)["loss"] for c in ids.chunk(chunks)) / chunks
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def global_loss(lm):
    """A step's loss averaged over the ranks reading distinct data (the DP group, or RDP when prescaled)."""
    group = smp.get_rdp_process_group() if smp.state.cfg.prescaled_batch else smp.get_dp_process_group()
    n = smp.rdp_size() if smp.state.cfg.prescaled_batch else smp.dp_size()
    t = lm.detach().float().reshape(1).cpu()
    dist.all_reduce(t, group=group)
    return t.item() / n


def train(model, opt, data):
    losses = []
    for ids in data:
        opt.zero_grad()
        losses.append(global_loss(lm_step(model, my_rows(ids)).reduce_mean()))
        opt.step()
    return losses


def hf_state(model):
    sd = translate_state_dict_to_hf_gpt2(model.state_dict(), max_seq_len=SEQ)
    return {k: v for k, v in sd.items() if not k.endswith(("attn.bias", "attn.masked_bias"))}


# ----------------------------------------------------------------- suites

def parity(tp, pp, prescaled=False, device=False):
    smp.init(smp_config(tp, pp, prescaled))
    if device:
        torch.accelerator.set_device_index(smp.local_rank() % torch.accelerator.device_count())
    assert (smp.tp_size(), smp.pp_size(), smp.dp_size()) == (tp, pp, WS // pp)
    model, plain = build()
    inner = model.get_module()
    assert len(inner.transformer.seq_layers) == 4, "the GPT-2 blocks are the distributed transformer's layers"
    assert model.distributed_modules(), "no tensor-parallel module after wrapping"
    opt = smp.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-2))
    data = batches()
    chunks = (smp.rdp_size() if prescaled else smp.dp_size()) * smp.num_microbatches()
    want = reference(plain, data, chunks)
    got = train(model, opt, data)
    close(got, want, f"losses {got} vs one process {want}")
    pieces = [n for n, p in model.local_named_parameters() if model.is_distributed_parameter(p)]
    if tp > 1:
        assert pieces, "no tensor-parallel piece on this rank"
        dev = torch.device(torch.accelerator.current_accelerator().type) if device else torch.device("cpu")
        for n, p in model.local_named_parameters():
            assert p.device.type == dev.type, f"{n} is on {p.device}"
    sd = hf_state(model)
    ref = {k: v for k, v in plain.state_dict().items() if not k.endswith(("attn.bias", "attn.masked_bias"))}
    assert set(sd) == set(ref), f"keys differ: {sorted(set(sd) ^ set(ref))[:6]}"
    for k, v in ref.items():
        close(sd[k], v, f"parameter {k}", rtol=2e-4, atol=2e-5)


def half(tp):
    smp.init(smp_config(tp, 1, bf16=True))
    model, plain = build(dtype=torch.bfloat16)
    opt = smp.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-2))
    data = batches(6)
    want = reference(plain, data, smp.dp_size())
    got = train(model, opt, data)
    worst = max(abs(a - b) for a, b in zip(got, want))
    if smp.rank() == 0:
        print(f"bf16 tp={tp}: losses {got[0]:.4f} -> {got[-1]:.4f}, worst |loss - fp32 loss| {worst:.4f}",
              flush=True)
    assert worst < 0.1, f"a bf16 loss differs from fp32's by {worst:.4f} (bound 0.1)"


def checkpoints():
    d = os.environ["TEST_CKPT_DIR"]
    data = batches(6)
    # an uninterrupted run: 3 steps, a partial checkpoint, a full checkpoint, 3 more steps
    smp.init(smp_config(2, 2))
    model, _ = build()
    opt = smp.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-2))
    train(model, opt, data[:3])
    smp.save_checkpoint(d, "p3", partial=True, model=model, optimizer=opt, user_content={"step": 3})
    smp.save_checkpoint(d, "full3", partial=False, model=model)
    with torch.no_grad():
        smp_loss = global_loss(eval_step(model, my_rows(data[0])).reduce_mean())   # the model it wrote
    after = train(model, opt, data[3:])
    probe = data[0][:2]

    # the partial checkpoint resumes in the same layout: the next steps are the same
    smp.init(smp_config(2, 2))
    model, _ = build()
    opt = smp.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-2))
    uc = smp.resume_from_checkpoint(d, tag="p3", partial=True)
    assert uc == {"step": 3}, uc
    close(train(model, opt, data[3:]), after, "losses after resuming the partial checkpoint")

    # the full checkpoint has Hugging Face's names: it loads into the plain model
    full = torch.load(os.path.join(d, "full3"), weights_only=False)
    plain = GPT2LMHeadModel(config())
    missing, unexpected = plain.load_state_dict(full, strict=False)
    assert not unexpected and all(k.endswith(("attn.bias", "attn.masked_bias")) for k in missing), \
        (missing, unexpected)
    with torch.no_grad():
        plain_logits = plain(input_ids=probe)["logits"]
    want = eval_plain(plain, data[0])
    close(want, smp_loss, "the plain model's loss with the full checkpoint, against the smp model that wrote it")

    # ... and into other layouts
    for tp, pp in ((4, 1), (1, 2)):
        smp.init(smp_config(tp, pp))
        model, _ = build()
        smp.resume_from_checkpoint(d, tag="full3", partial=False)
        with torch.no_grad():
            got = global_loss(eval_step(model, my_rows(data[0])).reduce_mean())
        close(got, want, f"loss after loading the full checkpoint into tp {tp} x pp {pp}")
        model.cpu()     # every partition's weights, this rank's TP pieces
        if tp == 1:
            with torch.no_grad():
                close(model.get_module()(input_ids=probe)["logits"], plain_logits, "logits after cpu()")


def sharded(kind):
    """tp 2 x rdp 2 with sharded state (`kind` "zero1": shard_optimizer_state; "sdp":
    sharded_data_parallel_degree 2): 3 steps equal one process (the full checkpoint, loaded into the
    plain model, equals the plain model trained alike); a partial checkpoint resumes in the layout
    and the next steps are an uninterrupted run's."""
    d = os.path.join(os.environ["TEST_CKPT_DIR"], kind)
    # (sdp_gradient_clipping 0: no clipping, which SageMaker's default of 1.0 would apply at step())
    extra = {"shard_optimizer_state": True} if kind == "zero1" else \
        {"sharded_data_parallel_degree": 2, "sdp_gradient_clipping": 0.0}
    data = batches(6)
    smp.init(smp_config(2, 1, **extra))
    model, plain = build()
    opt = smp.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-2))
    close(train(model, opt, data[:3]), reference(plain, data[:3], smp.dp_size() * smp.num_microbatches()),
          f"{kind}: losses against one process")
    smp.save_checkpoint(d, "p3", partial=True, model=model, optimizer=opt)
    try:
        smp.save_checkpoint(d, "f3", partial=False, model=model, optimizer=opt)
    except smp.SMPValidationError as e:
        assert "partial" in str(e), str(e)
    else:
        raise AssertionError(f"{kind}: a full checkpoint of a sharded optimizer state was written")
    smp.save_checkpoint(d, "f3", partial=False, model=model)
    after = train(model, opt, data[3:])
    full = torch.load(os.path.join(d, "f3"), weights_only=False)
    for k, v in plain.state_dict().items():
        if k in full:
            # (Adam's first steps amplify the summation-order noise of near-zero gradients)
            close(full[k], v, f"{kind}: full checkpoint '{k}' against one process", rtol=2e-4, atol=1e-4)

    smp.init(smp_config(2, 1, **extra))
    model, _ = build()
    opt = smp.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-2))
    smp.resume_from_checkpoint(d, tag="p3", partial=True)
    close(train(model, opt, data[3:]), after, f"{kind}: losses after resuming the partial checkpoint")


class Block(torch.nn.Module):
    """A user's transformer block, functionally SageMaker's reference layer (post-layernorm)."""

    def __init__(self, hidden, heads):
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(hidden, heads, batch_first=True)
        self.norm = torch.nn.LayerNorm(hidden)

    def forward(self, x, pad):
        return self.norm(x + self.attn(x, x, x, key_padding_mask=pad)[0])


def registration():
    """tp_register with its three hooks; nn.Linear under smp.tensor_parallelism() (nested contexts:
    the innermost decides); set_tensor_parallelism(module, False); a module sharing a weight with one
    outside it stays whole."""
    smp.init(smp_config(2, 1))
    smp.tp_register_with_module(
        Block, smp.nn.DistributedTransformerLayer,
        init_hook=lambda hidden, heads: ((), {"num_attention_heads": heads, "attention_head_size": hidden // heads,
                                              "hidden_size": hidden, "intermediate_size": 4 * hidden,
                                              "attention_dropout_prob": 0.0, "hidden_dropout_prob": 0.0}),
        forward_hook=lambda x, pad: (((x, pad[:, None, None, :].float() * -1e4),), {}),
        return_hook=lambda out: out[0])
    torch.manual_seed(0)
    with smp.tensor_parallelism():
        outer = torch.nn.Linear(8, 16)
        with smp.tensor_parallelism(enabled=False):
            inner = torch.nn.Linear(16, 8)
        block = Block(8, 2)
        kept = Block(8, 2)
        tied_a, tied_b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
    tied_b.weight = tied_a.weight
    smp.set_tensor_parallelism(kept, False)
    net = torch.nn.ModuleDict({"outer": outer, "inner": inner, "block": block, "kept": kept,
                               "tied_a": tied_a, "tied_b": tied_b})
    x = torch.randn(4, 3, 8)
    want = outer(x[smp.tp_rank() * 2:(smp.tp_rank() + 1) * 2])
    model = smp.DistributedModel(net)
    m = model.get_module()
    assert isinstance(m["outer"], smp.nn.DistributedLinear) and m["outer"].weight.shape == (8, 8)
    assert type(m["inner"]) is torch.nn.Linear, "a Linear built under enabled=False was distributed"
    assert isinstance(m["block"], smp.nn.DistributedTransformerLayer), type(m["block"])
    assert type(m["kept"]) is Block, "set_tensor_parallelism(module, False) did not keep it"
    assert type(m["tied_a"]) is torch.nn.Linear and type(m["tied_b"]) is torch.nn.Linear, \
        "a module sharing a weight with another was distributed"
    assert model.is_distributed_parameter(m["outer"].weight) and not model.is_distributed_parameter(m["inner"].weight)
    assert {n for n, _ in model.scaled_batch_reducer_named_parameters()} >= {"outer.weight", "outer.bias"}
    rows = x[smp.tp_rank() * 2:(smp.tp_rank() + 1) * 2]
    with torch.no_grad():
        close(m["outer"](rows), want, "DistributedLinear from nn.Linear (the original's weights)")
        pad = torch.zeros(2, 3, dtype=torch.bool)
        out = m["block"](rows, pad)     # the user's call signature, through the hooks
    assert out.shape == (2, 3, 8), out.shape


def eval_plain(plain, ids):
    with torch.no_grad():
        return plain(input_ids=ids, labels=ids)["loss"].item()


def errors():
    smp.init(smp_config(2, 1))
    rank = smp.rank()
    for kw, words in (({"n_head": 3, "n_embd": 33}, ["'the model' (GPT2LMHeadModel)", "num_attention_heads 3"]),
                      ({"vocab_size": 63}, ["vocab_size 63", "not divisible by tp_size 2"])):
        try:
            build(kw)
        except smp.SMPValidationError as e:
            msg = str(e)
            assert all(w in msg for w in words) and f"rank {rank}" in msg, msg
        else:
            raise AssertionError(f"{kw}: no error")


def early_module():
    """A distributed module built before smp.init belongs to no TP group: wrapping it is an error."""
    layer = smp.nn.DistributedLinear(8, 8)
    smp.init(smp_config(2, 1))
    try:
        smp.DistributedModel(torch.nn.Sequential(layer))
    except smp.SMPValidationError as e:
        assert "before smp.init" in str(e) and "rank" in str(e), str(e)
    else:
        raise AssertionError("wrapping a distributed module built before smp.init: no error")


SUITES = {"parity": parity, "half": half, "checkpoints": checkpoints, "errors": errors,
          "early_module": early_module, "sharded": sharded, "registration": registration}


def main():
    c = Checks()
    for arg in sys.argv[2:]:
        name, _, opts = arg.partition(":")
        kw = {k: v if k == "kind" else int(v) if k in ("tp", "pp") else bool(int(v))
              for k, v in (o.split("=") for o in opts.split(",") if o)}
        c.run(arg, SUITES[name], **kw)
    return c.report()


if __name__ == "__main__":
    sys.exit(main())
