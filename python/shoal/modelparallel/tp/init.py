"""Deterministic initialisation of distributed tensors: make the FULL tensor, keep this rank's piece.

Every TP rank draws the whole tensor from torch's default CPU generator (in
float32, in the same order), then copies its own piece (torch.chunk order
along the split dimension) into the parameter. A model built with the same
seed is therefore the same model at every tensor-parallel degree, and the
random stream advances the same way on every rank. Replicated tensors (split
dimension None) are drawn the same way and kept whole.
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

import torch

from .env import TPEnv

Fill = Callable[[torch.Tensor], None]


def linear_weight(std: Optional[float]) -> Fill:
    """nn.Linear's weight initialisation (kaiming-uniform, a=sqrt(5)), or normal(0, std)."""
    def fill(w: torch.Tensor) -> None:
        if std is None:
            torch.nn.init.kaiming_uniform_(w, a=math.sqrt(5))
        else:
            w.normal_(0.0, std)
    return fill


def linear_bias(fan_in: int, std: Optional[float]) -> Fill:
    """nn.Linear's bias initialisation (uniform +-1/sqrt(fan_in)), or zeros with normal weights."""
    def fill(b: torch.Tensor) -> None:
        if std is None:
            bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
            b.uniform_(-bound, bound)
        else:
            b.zero_()
    return fill


def embedding_weight(std: Optional[float], padding_idx: Optional[int] = None) -> Fill:
    """nn.Embedding's initialisation (normal(0, 1)), or normal(0, std); the padding row zero."""
    def fill(w: torch.Tensor) -> None:
        w.normal_(0.0, 1.0 if std is None else std)
        if padding_idx is not None:
            w[padding_idx].zero_()
    return fill


def zeros(t: torch.Tensor) -> None:
    t.zero_()


def full_then_piece(param: torch.Tensor, full_shape: Sequence[int], split_dim: Optional[int], fill: Fill,
                    env: TPEnv) -> None:
    """Draws the full tensor with `fill` and copies this rank's piece of it into `param`."""
    full = torch.empty(tuple(full_shape), dtype=torch.float32, device="cpu")
    fill(full)
    if param.is_meta:          # built under delayed initialisation: the draw keeps the stream in step
        return
    src = full if split_dim is None else full.chunk(env.size, split_dim)[env.rank]
    with torch.no_grad():
        param.copy_(src)


def copy_piece(param: torch.Tensor, full: torch.Tensor, split_dim: Optional[int], env: TPEnv) -> None:
    """Copies this rank's piece of a given full tensor into `param`."""
    if param.is_meta:
        return
    src = full if split_dim is None else full.chunk(env.size, split_dim)[env.rank]
    with torch.no_grad():
        param.copy_(src)
