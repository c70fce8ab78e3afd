"""``smp.amp.GradScaler``: torch's gradient scaler, agreeing across partitions.

torch's GradScaler skips the optimizer step when the gradients it unscaled
contain inf or NaN. Under pipeline parallelism each rank unscales only its own
partition's gradients, so the ranks could disagree and one partition would
step while another skips. This scaler takes the maximum of the inf/nan flag
over every rank (all partitions and replicas) in ``unscale_`` (which
``step`` calls), so every rank skips or steps together and the scales stay
equal. Ranks that never computed the loss (every partition but the last)
initialise the scale on first use. All ranks must call ``unscale_``/``step``
the same number of times. The scaler's state lives on the partitions' device
(``device`` defaults to its type: "cuda" on a GPU, as torch.cuda.amp's).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from ..mpcommon.errors import SMPUnsupportedError
from .runtime import partition_device
from .state import require


class GradScaler(torch.amp.GradScaler):
    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True, device: Optional[str] = None):
        if device is None:     # the partitions' device type (torch.cuda.amp.GradScaler's "cuda" on a GPU)
            device = partition_device().type
        super().__init__(device, init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval, enabled=enabled)

    def _init_here(self) -> None:
        """Ranks that never scale a loss (every partition but the last) get the scale on first use."""
        if self._enabled and self._scale is None:
            self._lazy_init_scale_growth_tracker(torch.device(self._device))

    def step(self, optimizer, *args, **kwargs):
        self._init_here()
        return super().step(optimizer, *args, **kwargs)

    def update(self, new_scale=None) -> None:
        self._init_here()
        super().update(new_scale)

    def unscale_(self, optimizer) -> None:
        if not self._enabled:
            return
        s = require()
        if s.model is not None and s.model._smp.joining is not None:
            raise SMPUnsupportedError(f"smp.amp.GradScaler ({s.who()}): not inside DistributedModel.join(): its "
                                      f"inf/nan check spans every rank, and a replica that ran out of batches "
                                      f"does not take part")
        self._init_here()
        super().unscale_(optimizer)
        state = self._per_optimizer_states[id(optimizer)]
        found = torch.zeros(1, dtype=torch.float32, device=self._device)
        for v in state["found_inf_per_device"].values():
            found += v.float().reshape(1)
        if s.world_size > 1:
            dist.all_reduce(found, op=dist.ReduceOp.MAX, group=s.ctl)
        state["found_inf_per_device"] = {torch.device(self._device): (found[0] > 0).float()}
