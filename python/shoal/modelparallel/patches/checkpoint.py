"""``smp.patches.checkpoint``: activation checkpointing inside a forward.

    from smdistributed.modelparallel.torch.patches.checkpoint import checkpoint, checkpoint_sequential

    def forward(self, x):
        x = checkpoint(self.fc1, x)                               # fc1's activations recomputed in backward
        return checkpoint_sequential(self.layers, x, strategy="group_2")

The runtime is activation_checkpointing.py: torch's non-reentrant
checkpoint, nothing while smp measures or traces the model or without grad.
In a forward the pipeline traces (the glue above the partition units), the
checkpointed module becomes a unit of its own (kept whole in one partition)
that checkpoints whenever the pipeline calls it.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import activation_checkpointing as _ac
from ...mpcommon.errors import SMPValidationError

__all__ = ["checkpoint", "checkpoint_sequential"]


def checkpoint(module: torch.nn.Module, *args, preserve_rng_state: bool = True) -> Any:
    """``module(*args)`` with its activations recomputed in the backward pass.
    `module` must be a module (SMP checkpoints modules, not functions)."""
    where = "smp.patches.checkpoint.checkpoint"
    if not isinstance(module, torch.nn.Module):
        raise SMPValidationError(f"{where}: module must be a torch.nn.Module (checkpointing applies to modules, "
                                 f"not functions), got {type(module).__name__}")
    _ac.check_flag(where, "preserve_rng_state", preserve_rng_state)
    return _ac.checkpoint_module(module, args, preserve_rng_state)


def checkpoint_sequential(sequential_module: torch.nn.Module, input: Any, strategy: str = "each",  # noqa: A002
                          preserve_rng_state: bool = True, pack_args_as_tuple: bool = False) -> Any:
    """The children of `sequential_module` (an ``nn.Sequential`` or
    ``nn.ModuleList``) applied one after the other to `input`, checkpointed
    each ("each"), all together ("contiguous") or N at a time ("group_N");
    groups never cross partitions. A tuple (the input, or a child's output)
    is passed to the next child as one argument with ``pack_args_as_tuple``,
    else as its positional arguments."""
    where = "smp.patches.checkpoint.checkpoint_sequential"
    if not isinstance(sequential_module, (torch.nn.Sequential, torch.nn.ModuleList)):
        raise SMPValidationError(f"{where}: sequential_module must be an nn.Sequential or nn.ModuleList, got "
                                 f"{type(sequential_module).__name__}")
    _ac.check_flag(where, "preserve_rng_state", preserve_rng_state)
    _ac.check_flag(where, "pack_args_as_tuple", pack_args_as_tuple)
    return _ac.checkpoint_sequence(sequential_module, input, strategy, preserve_rng_state, pack_args_as_tuple)
