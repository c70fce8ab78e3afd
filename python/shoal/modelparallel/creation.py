"""Building the model: ``smp.model_creation`` and ``smp.delay_param_initialization``.

``with smp.model_creation(dtype=torch.float16): model = Net()`` builds the
model's floating-point parameters and buffers in `dtype` (the config's
``fp16``/``bf16`` need a half-precision model; smp.DistributedModel checks).
The tensor-parallel arguments (``tensor_parallelism=True`` and the
distributed modules' options such as ``fused_softmax``) belong to tensor
parallelism: without it they are accepted and have no effect, as in
SageMaker's library; with it they are refused by name. With the config's
``delayed_parameter_initialization``, the model is built as under
``smp.delay_param_initialization()``.
"""

from __future__ import annotations

import contextlib
from typing import Optional

import torch

from ..mpcommon.errors import SMPUnsupportedError, SMPValidationError
from .state import require


@contextlib.contextmanager
def model_creation(tensor_parallelism: bool = False, dtype: Optional[torch.dtype] = None, **tp_config):
    s = require()
    if tensor_parallelism:
        raise SMPUnsupportedError(f"smp.model_creation(tensor_parallelism=True) ({s.who()}): tensor parallelism "
                                  f"is not implemented by shoal; see docs/modelparallel.md")
    if dtype is not None and (not isinstance(dtype, torch.dtype) or not dtype.is_floating_point):
        raise SMPValidationError(f"smp.model_creation: dtype must be a floating-point torch.dtype, got {dtype!r}")
    prev = torch.get_default_dtype()
    if dtype is not None:
        torch.set_default_dtype(dtype)
    try:
        with delay_param_initialization(s.cfg.delayed_parameter_initialization):
            yield
    finally:
        torch.set_default_dtype(prev)


@contextlib.contextmanager
def delay_param_initialization(enabled: bool = True):
    """Parameters of modules built inside are made on the meta device (a shape, no memory); at
    partitioning each rank gives memory to its own partition's parameters only and initialises
    them with their modules' own initialisation (runtime.py). Buffers are built as usual."""
    require()
    if not enabled:
        yield
        return
    orig = torch.nn.Module.register_parameter

    def register_on_meta(self, name, param):
        orig(self, name, param)
        if param is not None and not param.is_meta:
            self._parameters[name] = torch.nn.Parameter(param.detach().to("meta"), requires_grad=param.requires_grad)
    torch.nn.Module.register_parameter = register_on_meta
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = orig
