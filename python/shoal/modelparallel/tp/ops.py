"""The autograd collectives that bound a tensor-parallel region (all over the module's TP group).

Batch dimension 0 is the one the batch modes act on:

================  ======================================  ======================================
op                prescaled_batch False (own batches)     prescaled_batch True (same batch)
================  ======================================  ======================================
enter_region      all-gather rows ``[B] -> [tp*B]``;      identity; backward all-reduce
                  backward reduce-scatter (sum)
exit_region       reduce-scatter partial sums             all-reduce partial sums;
                  ``[tp*B] -> [B]``; backward all-gather  backward identity
enter_side        all-gather rows, no gradient            identity
own_rows          this rank's ``B`` rows of ``[tp*B]``;   identity
                  backward all-gather the row gradients
================  ======================================  ======================================

``gather_dim``/``split_dim`` are the pair along any other dimension: all-gather
the pieces (backward: keep this rank's piece of the gradient) and keep this
rank's piece (backward: all-gather). Their backward rules assume what holds in
a region: the gradient arriving at a gathered tensor is the same on every TP
rank. With one rank every op is the identity.

The TP ranks must call these in the same order with the same shapes (equal
batch sizes in the own-batch mode), as for any collective.

Under :func:`local_only` (the partitioner measuring the model on one rank,
the tracer computing shapes on meta tensors) no collective runs: each is
replaced by a local operation with the result's shape (a gather repeats this
rank's piece, a reduce-scatter keeps this rank's rows, an all-reduce is the
identity), so shapes and costs are those of the real run, values are not.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch
import torch.distributed as dist

from .env import TPEnv


_LOCAL = [False]


@contextlib.contextmanager
def local_only() -> Iterator[None]:
    """Every collective of the modules becomes a local stand-in of the same shape (docstring)."""
    prev, _LOCAL[0] = _LOCAL[0], True
    try:
        yield
    finally:
        _LOCAL[0] = prev


# --------------------------------------------------------------------------- plain collectives
def all_gather(x: torch.Tensor, env: TPEnv, dim: int = 0) -> torch.Tensor:
    """The pieces of every TP rank concatenated along `dim`, in rank order."""
    if _LOCAL[0]:
        return torch.cat([x] * env.size, dim=dim)
    x = x.contiguous()
    out = x.new_empty((env.size,) + tuple(x.shape))
    dist.all_gather_into_tensor(out, x, group=env.group)
    if dim % x.dim() == 0:
        return out.view((env.size * x.shape[0],) + tuple(x.shape[1:]))
    return torch.cat(out.unbind(0), dim=dim)


def reduce_scatter_rows(x: torch.Tensor, env: TPEnv) -> torch.Tensor:
    """The sum over the TP ranks of `x`'s rows, this rank's 1/tp of them."""
    if x.shape[0] % env.size:
        raise ValueError(f"reduce_scatter_rows: {x.shape[0]} rows do not split over {env.size} TP ranks")
    if _LOCAL[0]:
        return x.chunk(env.size, 0)[env.rank].clone()
    x = x.contiguous()
    out = x.new_empty((x.shape[0] // env.size,) + tuple(x.shape[1:]))
    dist.reduce_scatter_tensor(out, x, op=dist.ReduceOp.SUM, group=env.group)
    return out


def all_reduce(x: torch.Tensor, env: TPEnv, op=dist.ReduceOp.SUM) -> torch.Tensor:
    """`x` reduced over the TP ranks, in place (and returned)."""
    if _LOCAL[0]:
        return x
    dist.all_reduce(x, op=op, group=env.group)
    return x


def piece(x: torch.Tensor, env: TPEnv, dim: int) -> torch.Tensor:
    """This rank's contiguous 1/tp piece of `x` along `dim` (torch.chunk order)."""
    return x.chunk(env.size, dim)[env.rank].contiguous()


# --------------------------------------------------------------------------- autograd ops
class _GatherRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, env):
        ctx.env = env
        return all_gather(x, env, 0)

    @staticmethod
    def backward(ctx, g):
        return reduce_scatter_rows(g, ctx.env), None


class _ScatterRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, env):
        ctx.env = env
        return reduce_scatter_rows(x, env)

    @staticmethod
    def backward(ctx, g):
        return all_gather(g, ctx.env, 0), None


class _ReduceInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, env):
        ctx.env = env
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return all_reduce(g.clone(), ctx.env), None


class _ReduceInForward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, env):
        return all_reduce(x.clone(), env)

    @staticmethod
    def backward(ctx, g):
        return g, None


class _GatherDim(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, env, dim):
        ctx.env, ctx.dim = env, dim
        return all_gather(x, env, dim)

    @staticmethod
    def backward(ctx, g):
        return piece(g, ctx.env, ctx.dim), None, None


class _SplitDim(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, env, dim):
        ctx.env, ctx.dim = env, dim
        return piece(x, env, dim)

    @staticmethod
    def backward(ctx, g):
        return all_gather(g, ctx.env, ctx.dim), None, None


def enter_region(x: torch.Tensor, env: TPEnv) -> torch.Tensor:
    """A differentiable input entering the region (the table above)."""
    if not env.parallel:
        return x
    return _ReduceInBackward.apply(x, env) if env.prescaled else _GatherRows.apply(x, env)


def exit_region(x: torch.Tensor, env: TPEnv) -> torch.Tensor:
    """Partial sums leaving the region, summed, on this rank's batch."""
    if not env.parallel:
        return x
    return _ReduceInForward.apply(x, env) if env.prescaled else _ScatterRows.apply(x, env)


def enter_side(x: Optional[torch.Tensor], env: TPEnv) -> Optional[torch.Tensor]:
    """A side input without gradient (mask, ids, labels) entering the region."""
    if x is None or not env.parallel or env.prescaled:
        return x
    with torch.no_grad():
        return all_gather(x.detach(), env, 0)


def own_rows(x: torch.Tensor, env: TPEnv) -> torch.Tensor:
    """This rank's rows of a tensor every TP rank holds for the whole gathered batch."""
    if not env.parallel or env.prescaled:
        return x
    return _SplitDim.apply(x, env, 0)


def gather_dim(x: torch.Tensor, env: TPEnv, dim: int) -> torch.Tensor:
    """Every rank's piece along `dim`, concatenated; backward keeps this rank's piece."""
    if not env.parallel:
        return x
    return _GatherDim.apply(x, env, dim % x.dim())


def split_dim(x: torch.Tensor, env: TPEnv, dim: int) -> torch.Tensor:
    """This rank's piece along `dim`; backward all-gathers."""
    if not env.parallel:
        return x
    return _SplitDim.apply(x, env, dim % x.dim())
