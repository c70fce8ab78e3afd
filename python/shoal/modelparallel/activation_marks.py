"""The marks activation checkpointing leaves on modules, read by placement and tracing.

``smp.set_activation_checkpointing`` (activation_checkpointing.py) stores a
:class:`Mark` on each module it checkpoints, under the attribute
:data:`ATTR`. The placement (placement.py) keeps every marked module whole in
one partition, and the graph capture (graph.py) refuses to trace through one.
This module imports nothing of the library, so that both can read the marks
without importing the runtime that acts on them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator, Optional, Tuple

import torch

ATTR = "_smp_activation_checkpointing"


@dataclasses.dataclass
class Mark:
    """How one module is checkpointed.

    group: for a child of a sequence checkpointed with "contiguous" or
    "group_N", the shared group state (activation_checkpointing._Group), and
    index: the child's position in the sequence; None for a module
    checkpointed on its own."""
    preserve_rng_state: bool = True
    pack_args_as_tuple: bool = False
    strategy: str = "each"
    group: Any = None
    index: int = 0
    functional: bool = False       # made by patches.checkpoint while the forward was traced


def mark_of(module: torch.nn.Module) -> Optional[Mark]:
    return module.__dict__.get(ATTR)


def marked_modules(root: torch.nn.Module) -> Iterator[Tuple[str, torch.nn.Module, Mark]]:
    """(qualified name, module, mark) of every marked module below `root` (and root itself)."""
    for name, m in root.named_modules():
        mk = mark_of(m)
        if mk is not None:
            yield name, m, mk
