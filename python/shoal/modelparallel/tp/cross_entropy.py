"""Cross entropy over vocabulary-parallel logits.

Each TP rank holds the logits of its vocabulary piece ``[.., V/tp]`` (vocab
ids ``vocab_start .. vocab_start + V/tp``) for the same rows. In float32 (at
least)::

    m      = all-reduce(max)  of the row maxima     (stability; every rank the same m)
    s      = all-reduce(sum)  of sum(exp(x - m))    (the softmax denominator)
    t      = all-reduce(sum)  of x[label] - m       (only the rank holding the label adds it)
    loss   = log(s) - t                             (0 where label == ignore_index)

The backward needs no collective: the gradient of this rank's logits is
``(softmax - onehot(label)) * grad`` on its own vocabulary piece. The result
is the per-token loss of every row (float32, or float64 for float64 logits), the same on every TP rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from . import ops
from .env import TPEnv


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, labels, vocab_start, env, ignore_index):
        x = logits.to(torch.promote_types(logits.dtype, torch.float32))
        m = x.max(dim=-1).values
        if env.parallel:
            ops.all_reduce(m, env, dist.ReduceOp.MAX)
        x = x - m.unsqueeze(-1)
        e = x.exp()
        local = labels - vocab_start
        inside = (local >= 0) & (local < x.shape[-1])
        idx = local.clamp(0, x.shape[-1] - 1).unsqueeze(-1)
        picked = x.gather(-1, idx).squeeze(-1) * inside
        sums = torch.stack((e.sum(dim=-1), picked))
        if env.parallel:
            ops.all_reduce(sums, env)
        valid = labels != ignore_index
        loss = torch.where(valid, sums[0].log() - sums[1], torch.zeros_like(sums[1]))
        ctx.save_for_backward(e.div_(sums[0].unsqueeze(-1)), idx, inside & valid, valid)
        ctx.dtype = logits.dtype
        return loss

    @staticmethod
    def backward(ctx, g):
        softmax, idx, hit, valid = ctx.saved_tensors
        grad = softmax.scatter_add(-1, idx, -hit.to(softmax.dtype).unsqueeze(-1))
        grad = grad * (g * valid).unsqueeze(-1)
        return grad.to(ctx.dtype), None, None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, vocab_start: int, env: TPEnv,
                                 ignore_index: int = -100) -> torch.Tensor:
    """Per-token losses (float32, shape of `labels`) of this rank's vocabulary piece of the
    logits ``[.., V/tp]``; labels are full-vocabulary ids. The TP ranks call it together."""
    return _VocabParallelCrossEntropy.apply(logits, labels, vocab_start, env, ignore_index)
