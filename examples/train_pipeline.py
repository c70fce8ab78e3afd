#!/usr/bin/env python3
"""Pipeline-parallel training of a small transformer language model, written the
way the SageMaker model-parallel guide writes it, running on shoal.

    build/bin/shoalrun --standalone --nproc-per-node 2 examples/train_pipeline.py

The model is a character-level GPT (4 blocks, width 96, context 64) trained on
the text of Python's own help topics (``pydoc_data.topics``, about 460 KB of
English shipped with every Python). It is split into 2 partitions (one per
process) and every batch of 32 sequences into 4 microbatches of 8, pipelined
with the interleaved (1F1B) schedule. The structure is the guide's:
``smp.init``, the model and optimizer wrapped in ``smp.DistributedModel`` /
``smp.DistributedOptimizer``, an ``@smp.step`` function that calls the model
and ``model.backward(loss)``, ``reduce_mean()`` of the step's losses. With more
processes than partitions the extra ones become data-parallel replicas (each
reads its own batches).

Rank 0 prints the training loss, the held-out loss and the throughput every
--log-every steps. At the end the full model is saved (``smp.save_checkpoint``,
partial=False), rank 0 loads it with plain ``torch.load`` into a plain copy of
the model and prints a sample of generated text. The exit status is 1 if the
final held-out loss (nats per character) is above --max-loss.
"""

import argparse
import math
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import smdistributed.modelparallel.torch as smp


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=32, help="sequences per step and replica (default 32)")
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--partitions", type=int, default=2)
    p.add_argument("--pipeline", default="interleaved", choices=["interleaved", "simple"])
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--width", type=int, default=96)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--log-every", type=int, default=25)
    p.add_argument("--max-loss", type=float, default=2.3,
                   help="exit 1 if the final held-out loss is above this "
                        "(default 2.3 nats/char; an untrained model: 4.6)")
    p.add_argument("--checkpoint-dir", default="build/demo/pipeline_lm")
    return p.parse_args()


# ----------------------------------------------------------------- the model

class SelfAttention(nn.Module):
    def __init__(self, width, heads, context):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.register_buffer("causal", torch.ones(context, context, dtype=torch.bool).tril(), persistent=False)

    def forward(self, x):
        b, t, c = x.size()
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=self.causal[:t, :t])
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, width, heads, context):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = SelfAttention(width, heads, context)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class CharGPT(nn.Module):
    def __init__(self, vocab, width, layers, heads, context):
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(context, width)
        self.blocks = nn.ModuleList([Block(width, heads, context) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, idx):
        b, t = idx.size()
        x = self.tok(idx) + self.pos(torch.arange(t))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


# ----------------------------------------------------------------- data

def corpus():
    import pydoc_data.topics
    return "\n\n".join(pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics))


def batches(data, batch, context, generator):
    starts = torch.randint(0, len(data) - context - 1, (batch,), generator=generator)
    x = torch.stack([data[s:s + context] for s in starts])
    y = torch.stack([data[s + 1:s + context + 1] for s in starts])
    return x, y


@torch.no_grad()
def generate(model, idx, n, context, generator, temperature=0.8):
    for _ in range(n):
        logits = model(idx[:, -context:])[:, -1, :] / temperature
        idx = torch.cat([idx, torch.multinomial(logits.softmax(-1), 1, generator=generator)], dim=1)
    return idx


# ----------------------------------------------------------------- training

def main():
    args = parse_args()
    config = None if os.environ.get("SHOAL_MP_CONFIG") or os.environ.get("SM_HP_MP_PARAMETERS") else {
        "partitions": args.partitions, "microbatches": args.microbatches, "pipeline": args.pipeline,
        "optimize": "speed", "ddp": int(os.environ.get("WORLD_SIZE", "1")) > args.partitions}
    smp.init(config)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // smp.local_size()))
    torch.manual_seed(args.seed)   # the same initial model on every rank

    text = corpus()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    split = int(0.95 * len(data))
    train_data, val_data = data[:split], data[split:]

    model = CharGPT(len(chars), args.width, args.layers, heads=4, context=args.context)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    model = smp.DistributedModel(model)
    optimizer = smp.DistributedOptimizer(optimizer)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=args.steps,
                                                    pct_start=min(0.5, max(0.1, 3 / args.steps)))

    @smp.step
    def train_step(model, x, y):
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        model.backward(loss)
        return loss

    @smp.step
    def eval_step(model, x, y):
        logits = model(x)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))

    def held_out_loss():
        model.eval()
        g = torch.Generator().manual_seed(1234)       # the same batches on every rank and every time
        with torch.no_grad():
            losses = [eval_step(model, *batches(val_data, args.batch_size, args.context, g)).reduce_mean()
                      for _ in range(4)]
        model.train()
        return torch.stack(losses).mean().item()

    if smp.rank() == 0:
        print(f"train_pipeline: {smp.size()} processes = {smp.pp_size()} partitions x {smp.dp_size()} "
              f"replica(s), {args.microbatches} microbatches of {args.batch_size // args.microbatches}, "
              f"{len(chars)} characters, {len(train_data):,} training / {len(val_data):,} held-out "
              f"characters (pydoc_data.topics)", flush=True)
    # every rank of a replica reads the same batches; replicas read different ones
    g = torch.Generator().manual_seed(args.seed * 1000 + smp.dp_rank())
    t_last, tokens = time.perf_counter(), 0
    val = float("nan")
    for step in range(1, args.steps + 1):
        x, y = batches(train_data, args.batch_size, args.context, g)
        optimizer.zero_grad()
        loss = train_step(model, x, y).reduce_mean()
        smp.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        tokens += x.numel() * smp.dp_size()
        if step % args.log_every == 0 or step == args.steps:
            val = held_out_loss()
            dt = time.perf_counter() - t_last
            if smp.rank() == 0:
                print(f"step {step:4d}  train loss {loss.item():.3f}  held-out loss {val:.3f} "
                      f"({math.exp(val):5.2f} perplexity)  {tokens / dt:8.0f} chars/s", flush=True)
            t_last, tokens = time.perf_counter(), 0

    smp.save_checkpoint(args.checkpoint_dir, "final", partial=False, model=model,
                        user_content={"chars": chars, "args": vars(args)})
    if smp.rank() == 0:
        plain = CharGPT(len(chars), args.width, args.layers, heads=4, context=args.context)
        plain.load_state_dict(torch.load(os.path.join(args.checkpoint_dir, "final")))
        plain.eval()
        prompt = torch.tensor([[stoi[c] for c in "The "]])
        out = generate(plain, prompt, 200, args.context, torch.Generator().manual_seed(0))
        print("sample from the saved model:\n" + "".join(chars[i] for i in out[0].tolist()), flush=True)
        print(f"train_pipeline: final held-out loss {val:.3f} nats/char; checkpoint "
              f"{os.path.join(args.checkpoint_dir, 'final')}", flush=True)
    ok = val <= args.max_loss
    if not ok and smp.rank() == 0:
        print(f"train_pipeline: held-out loss {val:.3f} is above {args.max_loss}", flush=True)
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
