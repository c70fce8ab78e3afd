"""Full (unsharded) tensors in and out of a model holding tensor-parallel modules.

``load_full(module, full_state_dict)`` copies into every distributed
parameter or buffer its own piece of the full tensor (``_smp_split_dim``,
torch.chunk order) and every replicated one whole: checkpoints across
tensor-parallel degrees, and the original (e.g. Hugging Face) weights copied
into the distributed replacements. ``gather_full(module)`` is the inverse: the
module's state dict with every distributed tensor all-gathered over its TP
group; every TP rank must call it (same order of collectives).
"""

from __future__ import annotations

from typing import Dict, Mapping

import torch

from ...mpcommon.errors import SMPValidationError
from . import env as tp_env
from . import ops
from .base import DistributedModule, is_distributed


def _envs(module: torch.nn.Module) -> Dict[int, tp_env.TPEnv]:
    """id(tensor) -> the TP group of the distributed module that holds it."""
    envs = {}
    for m in module.modules():
        if isinstance(m, DistributedModule):
            for t in list(m.parameters(recurse=False)) + list(m.buffers(recurse=False)):
                envs[id(t)] = m.tp_env
    return envs


def load_full(module: torch.nn.Module, full_state_dict: Mapping[str, torch.Tensor], strict: bool = True) -> None:
    """Copies the full tensors of `full_state_dict` (keys as module.state_dict()'s) into `module`,
    each distributed tensor its own piece. strict: every key of the module, and no other, must be
    given (SMPValidationError naming them)."""
    own = module.state_dict(keep_vars=True)
    if strict:
        missing = sorted(set(own) - set(full_state_dict))
        unexpected = sorted(set(full_state_dict) - set(own))
        if missing or unexpected:
            raise SMPValidationError(f"smp tp load_full (rank {tp_env.world_rank()}): missing keys {missing}, "
                                     f"unexpected keys {unexpected}")
    envs = _envs(module)
    with torch.no_grad():
        for name, t in own.items():
            if name not in full_state_dict:
                continue
            full = torch.as_tensor(full_state_dict[name])
            if is_distributed(t):
                env, d = envs.get(id(t), tp_env.current()), t._smp_split_dim
                want = list(t.shape)
                want[d] *= env.size
                if list(full.shape) != want:
                    raise SMPValidationError(f"smp tp load_full (rank {tp_env.world_rank()}): '{name}' has full "
                                             f"shape {tuple(full.shape)}, expected {tuple(want)} (tp_size "
                                             f"{env.size} pieces of {tuple(t.shape)} along dim {d})")
                t.copy_(full.chunk(env.size, d)[env.rank])
            else:
                if full.shape != t.shape:
                    raise SMPValidationError(f"smp tp load_full (rank {tp_env.world_rank()}): '{name}' has shape "
                                             f"{tuple(full.shape)}, expected {tuple(t.shape)}")
                t.copy_(full)


def gather_full(module: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """`module`'s state dict with every distributed tensor whole (detached copies)."""
    envs = _envs(module)
    out = {}
    with torch.no_grad():
        for name, t in module.state_dict(keep_vars=True).items():
            env = envs.get(id(t))
            if is_distributed(t) and env is not None and env.parallel:
                out[name] = ops.all_gather(t.detach(), env, t._smp_split_dim)
            else:
                out[name] = t.detach().clone()
    return out
