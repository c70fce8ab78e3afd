"""Small models for the model-parallel tests (tests/python/test_mp_*.py).

Each is deterministic given the seed, so every rank builds the same initial
parameters and a plain single-process copy trains as the reference.

- Chain: input layer, residual blocks, output layer (a plain sequence);
- TinyGPT: a causal transformer language model whose forward has glue code
  (``b, t = idx.size()``, positions from ``torch.arange``, an addition), a
  position table read as a parameter, blocks that get an argument they do
  not use, tied input/output embeddings (the partitions are then not
  contiguous), and a dict output with an unused tensor and a plain int;
- Branchy: modules that pass nested tuples/dicts with ints and integer
  tensors, and a skip connection from the first module to the last;
- Manual: Chain whose modules are placed with smp.partition.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        return x + torch.tanh(self.lin(x))


class Chain(nn.Module):
    def __init__(self, d=16, depth=4, n_in=8, n_out=4):
        super().__init__()
        self.inp = nn.Linear(n_in, d)
        self.blocks = nn.ModuleList([Block(d) for _ in range(depth)])
        self.out = nn.Linear(d, n_out)

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        for b in self.blocks:
            h = b(h)
        return self.out(h)


class Manual(nn.Module):
    """Chain with modules placed by smp.partition contexts (`smp` passed in)."""

    def __init__(self, smp, partitions, d=16, depth=4):
        super().__init__()
        per = max(1, depth // partitions)
        with smp.partition(0):
            self.inp = nn.Linear(8, d)
        blocks = []
        for i in range(depth):
            with smp.partition(min(partitions - 1, i // per)):
                blocks.append(Block(d))
        self.blocks = nn.ModuleList(blocks)
        with smp.partition(partitions - 1):
            self.out = nn.Linear(d, 4)

    forward = Chain.forward


class Attention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        b, t, c = x.size()                       # inside a unit: never traced
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        return self.proj(y)


class GPTBlock(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = Attention(d, heads)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, positions):             # `positions` is unused on purpose
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab=13, d=16, layers=4, heads=2, max_t=32, tied=True):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(max_t, d) * 0.02)
        self.blocks = nn.ModuleList([GPTBlock(d, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        if tied:
            self.head.weight = self.tok.weight

    def forward(self, idx):
        b, t = idx.size()
        positions = torch.arange(t)
        x = self.tok(idx) + self.pos[:t]
        for blk in self.blocks:
            x = blk(x, positions)
        x = self.ln_f(x)
        return {"logits": self.head(x), "unused": x.mean(dim=1), "t": t}


class MaskedLM(nn.Module):
    """Ordinary model code in the traced forward: a registered mask buffer
    sliced by the input's length, `if self.training`, torch's own
    TransformerEncoderLayer as the units."""

    def __init__(self, vocab=13, d=16, layers=2, max_t=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList([nn.TransformerEncoderLayer(d, 2, 2 * d, dropout=0.0, batch_first=True)
                                     for _ in range(layers)])
        self.head = nn.Linear(d, vocab)
        self.register_buffer("mask", torch.triu(torch.full((max_t, max_t), float("-inf")), 1))

    def forward(self, idx):
        t = idx.shape[-1]
        h = self.emb(idx)
        if self.training:
            h = h * 1.0
        m = self.mask[:t, :t]
        for layer in self.layers:
            h = layer(h, src_mask=m)
        return {"logits": self.head(h)}


class Split(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.a = nn.Linear(8, d)
        self.b = nn.Linear(8, d)

    def forward(self, x):
        h = torch.relu(self.a(x))
        return h, {"side": torch.tanh(self.b(x)), "n": 3, "idx": torch.arange(x.size(0))}


class Mix(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, pair):
        h, extra = pair
        assert extra["n"] == 3 and extra["idx"].dtype == torch.int64
        return self.lin(h) * extra["side"], extra


class Branchy(nn.Module):
    def __init__(self, d=12):
        super().__init__()
        self.split = Split(d)
        self.mix1 = Mix(d)
        self.mix2 = Mix(d)
        self.mid = nn.Linear(d, d)
        self.out = nn.Linear(2 * d, 4)

    def forward(self, x):
        first = self.split(x)
        y, extra = self.mix1(first)
        y, extra = self.mix2((torch.tanh(self.mid(y)), extra))
        return self.out(torch.cat([y, first[0]], dim=-1))


def chain_data(steps, batch, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, 8, generator=g), torch.randint(0, 4, (batch,), generator=g))
            for _ in range(steps)]


def text_data(steps, batch, lengths, vocab=13, seed=2):
    g = torch.Generator().manual_seed(seed)
    out = []
    for s in range(steps):
        t = lengths[s % len(lengths)]
        seq = torch.randint(0, vocab, (batch, t + 1), generator=g)
        out.append((seq[:, :-1], seq[:, 1:]))
    return out


def lm_loss(out, y):
    return F.cross_entropy(out["logits"].reshape(-1, out["logits"].size(-1)), y.reshape(-1))


# ----------------------------------------------------------------- shared by the workers

def train_plain(model: nn.Module, batches, make_opt=None):
    """The reference: `model` trained in one process with cross entropy and `make_opt(params)`
    (SGD, lr 0.1, by default); the losses."""
    opt = make_opt(model.parameters()) if make_opt else torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for x, y in batches:
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def cross_entropy_step(smp):
    """An @smp.step training step with cross entropy, the shape of every SageMaker example."""
    @smp.step
    def train_step(model, x, y):
        loss = F.cross_entropy(model(x), y)
        model.backward(loss)
        return loss
    return train_step
