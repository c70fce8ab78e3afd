"""The loss scale of fp16 training (``smp.DistributedOptimizer``'s loss-scale arguments).

Static: the loss is multiplied by ``static_loss_scale`` before the backward
pass and the gradients divided by it before the update.

Dynamic (``dynamic_loss_scale=True``), with SageMaker's ``dynamic_loss_args``
and their defaults: the scale starts at ``init_scale`` (2**32); a step whose
gradients hold an inf or a NaN on any rank is skipped by every rank, and the
scale is divided by ``scale_factor`` (2), but not below ``min_scale`` (1),
once ``delayed_shift`` (1) overflows in a row have been seen (hysteresis; with
``consecutive_hysteresis`` the count starts over after any step without
overflow); after ``scale_window`` (1000) steps without an overflow the scale is
multiplied by ``scale_factor``.
"""

from __future__ import annotations

from typing import Any, Dict

from ..mpcommon.errors import SMPValidationError

DEFAULTS = {"init_scale": 2.0 ** 32, "scale_factor": 2.0, "scale_window": 1000, "min_scale": 1.0,
            "delayed_shift": 1, "consecutive_hysteresis": False}


class LossScaler:
    def __init__(self, static_scale: float = 1.0, dynamic: bool = False, **args):
        unknown = sorted(set(args) - set(DEFAULTS))
        if unknown:
            raise SMPValidationError(f"smp.DistributedOptimizer: unknown dynamic_loss_args {unknown}; known: "
                                     f"{', '.join(DEFAULTS)}")
        a = {**DEFAULTS, **args}
        for k in ("init_scale", "scale_factor", "min_scale"):
            if isinstance(a[k], bool) or not isinstance(a[k], (int, float)) or a[k] <= 0:
                raise SMPValidationError(f"smp.DistributedOptimizer: dynamic_loss_args['{k}'] must be a positive "
                                         f"number, got {a[k]!r}")
        for k in ("scale_window", "delayed_shift"):
            if isinstance(a[k], bool) or not isinstance(a[k], int) or a[k] < 1:
                raise SMPValidationError(f"smp.DistributedOptimizer: dynamic_loss_args['{k}'] must be an integer "
                                         f">= 1, got {a[k]!r}")
        if not dynamic and (isinstance(static_scale, bool) or not isinstance(static_scale, (int, float))
                            or static_scale <= 0):
            raise SMPValidationError(f"smp.DistributedOptimizer: static_loss_scale must be a positive number, got "
                                     f"{static_scale!r}")
        self.dynamic = bool(dynamic)
        self.args = a
        self.scale = float(a["init_scale"]) if dynamic else float(static_scale)
        self.iteration = 0
        self.last_overflow = -1
        self.hysteresis = a["delayed_shift"]

    def update(self, overflow: bool) -> None:
        """After a step: `overflow` is whether any rank's gradients were not finite."""
        a = self.args
        if self.dynamic:
            if overflow:
                if a["delayed_shift"] == 1 or self.hysteresis == 1:
                    self.scale = max(self.scale / a["scale_factor"], float(a["min_scale"]))
                else:
                    self.hysteresis -= 1
                self.last_overflow = self.iteration
            else:
                if a["consecutive_hysteresis"]:
                    self.hysteresis = a["delayed_shift"]
                if (self.iteration - self.last_overflow) % a["scale_window"] == 0:
                    if not a["consecutive_hysteresis"]:
                        self.hysteresis = a["delayed_shift"]
                    self.scale *= a["scale_factor"]
        self.iteration += 1

    def state_dict(self) -> Dict[str, Any]:
        return {"scale": self.scale, "iteration": self.iteration, "last_overflow": self.last_overflow,
                "hysteresis": self.hysteresis, "dynamic": self.dynamic}

    def load_state_dict(self, sd: Dict[str, Any]) -> None:
        self.scale, self.iteration = float(sd["scale"]), int(sd["iteration"])
        self.last_overflow, self.hysteresis = int(sd["last_overflow"]), int(sd["hysteresis"])
