"""``smp.patches``: the functional forms of SMP's activation checkpointing
(``smp.patches.checkpoint.checkpoint``, ``checkpoint_sequential``), used inside
a module's forward. See activation_checkpointing.py."""

from . import checkpoint

__all__ = ["checkpoint"]
