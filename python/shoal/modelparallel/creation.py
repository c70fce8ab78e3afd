"""Building the model: ``smp.model_creation`` and ``smp.delay_param_initialization``.

``with smp.model_creation(dtype=torch.float16): model = Net()`` builds the
model's floating-point parameters and buffers in `dtype` (the config's
``fp16``/``bf16`` need a half-precision model; smp.DistributedModel checks).
With ``tensor_parallelism=True`` the model is built as inside
``smp.tensor_parallelism(**tp_config)`` (tensor_parallel.py): its supported
modules become tensor-parallel when it is wrapped, the keyword arguments
(``fused_softmax``, ...) going to the distributed modules. With the config's
``delayed_parameter_initialization``, the model is built as under
``smp.delay_param_initialization()``.
"""

from __future__ import annotations

import contextlib
from typing import Optional

import torch

from ..mpcommon.errors import SMPValidationError
from .state import require
from .tensor_parallel import tensor_parallelism as tensor_parallelism_ctx


@contextlib.contextmanager
def model_creation(tensor_parallelism: bool = False, dtype: Optional[torch.dtype] = None, **tp_config):
    s = require()
    if not isinstance(tensor_parallelism, bool):
        raise SMPValidationError(f"smp.model_creation: tensor_parallelism must be True or False, got "
                                 f"{tensor_parallelism!r}")
    if dtype is not None and (not isinstance(dtype, torch.dtype) or not dtype.is_floating_point):
        raise SMPValidationError(f"smp.model_creation: dtype must be a floating-point torch.dtype, got {dtype!r}")
    prev = torch.get_default_dtype()
    if dtype is not None:
        torch.set_default_dtype(dtype)
    tp = tensor_parallelism_ctx(True, **tp_config) if tensor_parallelism else contextlib.nullcontext()
    try:
        with tp, delay_param_initialization(s.cfg.delayed_parameter_initialization):
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
