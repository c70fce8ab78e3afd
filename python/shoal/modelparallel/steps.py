"""``@smp.step``: one training (or evaluation) step over microbatches.

Calling a step function:

1. binds its arguments and splits every tensor argument along its batch axis
   (0, or ``input_split_axes[name]``) into ``microbatches`` equal pieces;
   tuples, lists and dicts are split element by element, objects with an
   ``smp_slice(num_mb, mb, axis)`` method slice themselves, arguments named in
   ``non_split_inputs`` and everything else are passed whole;
2. runs the function once per microbatch up to its model call, on every rank,
   to learn the model's inputs (*capture*; the code before the model call must
   be deterministic: it runs on every rank of the model replica, and twice on
   the rank that computes the loss);
3. partitions the model on the first step, then runs the pipeline schedule
   (pipeline.py). The rank that holds the model's last segment runs the whole
   function for each microbatch when the schedule reaches it: the model call
   returns the real output, the loss is computed, and ``model.backward(loss)``
   queues that microbatch's backward for the schedule;
4. returns what the function returned, on every rank of the replica, with each
   value (tensor or not) wrapped in a :class:`StepOutput` holding one value per
   microbatch (tensors detached unless ``detach_outputs=False``).

Backward tasks run when autograd is enabled at the model call (not under
``torch.no_grad()``). Gradients are averaged over microbatches (the loss
gradient is scaled by 1/microbatches), so a mean loss gives the gradient of
the whole batch.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from ..mpcommon import outputs as core_outputs
from ..mpcommon.errors import SMPValidationError
from .model import DistributedModel
from .runtime import partition_device, to_device
from .state import require


class StepOutput(core_outputs.StepOutput):
    """One value per microbatch of something a step function returned (reductions: mpcommon/outputs.py)."""

    @staticmethod
    def _sum(values):
        if isinstance(values[0], torch.Tensor):
            return torch.stack([torch.as_tensor(o) for o in values]).sum(0)
        return sum(values)

    @staticmethod
    def _concat(values, dim):
        return torch.cat(values, dim=dim)

    @staticmethod
    def _stack(values, dim):
        return torch.stack(values, dim=dim)


class _Captured(BaseException):
    """Raised by the model call while capturing a microbatch's model inputs."""

    def __init__(self, args: tuple, kwargs: dict):
        super().__init__("smp capture")
        self.args = args
        self.kwargs = kwargs
        self.grad_enabled = torch.is_grad_enabled()
        # autocast per device type: the CPU's and the accelerator's, replayed in every stage
        self.autocast = {d: (torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in _autocast_types()}


def _autocast_types() -> List[str]:
    types = ["cpu"]
    if torch.accelerator.is_available():
        acc = torch.accelerator.current_accelerator().type
        if torch.amp.is_autocast_available(acc):
            types.append(acc)
    return types


class StepContext:
    """The state of one call of a step function on this rank."""

    def __init__(self, fn: Callable, inputs: List[tuple], microbatches: int):
        self.fn = fn
        self.inputs = inputs                    # per microbatch: (args, kwargs)
        self.m = microbatches
        self.mode: Optional[str] = None         # "capture" | "run" | None
        self.calls: List[Optional[_Captured]] = [None] * microbatches
        self.records: Dict[int, tuple] = {}
        self.results: List[Any] = [None] * microbatches
        self.current = -1
        self._forward: Optional[Callable] = None
        self._called = False

    def capture(self, i: int) -> None:
        args, kwargs = self.inputs[i]
        self.mode, self.current = "capture", i
        try:
            self.fn(*args, **kwargs)
        except _Captured as c:
            self.calls[i] = c
        finally:
            self.mode = None
        if self.calls[i] is None:
            raise SMPValidationError("smp.step: the step function returned without calling the "
                                     "smp.DistributedModel")

    def run_user(self, i: int, forward: Callable[[], Any]) -> None:
        """Runs the function for microbatch i; its model call returns forward()."""
        args, kwargs = self.inputs[i]
        self.mode, self.current, self._forward, self._called = "run", i, forward, False
        try:
            self.results[i] = self.fn(*args, **kwargs)
        finally:
            self.mode, self._forward = None, None
        if not self._called:
            raise SMPValidationError("smp.step: the step function did not call the smp.DistributedModel "
                                     f"for microbatch {i} (it did when its inputs were captured)")

    def model_call(self, args: tuple, kwargs: dict) -> Any:
        if self.mode == "capture":
            raise _Captured(args, kwargs)
        if self.mode != "run":
            raise SMPValidationError("smp: the model was called outside the step function's own code")
        if self._called:
            raise SMPValidationError("smp.step: the smp.DistributedModel was called more than once in one "
                                     "step function; the pipeline supports one model call per microbatch")
        self._called = True
        return self._forward()

    def record_backward(self, tensors, grad_tensors) -> None:
        if self.mode != "run":
            raise SMPValidationError("smp: model.backward() must be called inside an @smp.step function, "
                                     "after the model call")
        if self.current in self.records:
            raise SMPValidationError("smp: model.backward() was called twice for one microbatch")
        if not torch.is_grad_enabled() and not self.calls[self.current].grad_enabled:
            raise SMPValidationError("smp: model.backward() was called but the model ran under torch.no_grad()")
        ts = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
        if grad_tensors is None:
            gs = [None] * len(ts)
        else:
            gs = [grad_tensors] if isinstance(grad_tensors, torch.Tensor) else list(grad_tensors)
        if len(gs) != len(ts):
            raise SMPValidationError(f"smp: model.backward(): {len(ts)} tensors but {len(gs)} gradients")
        for t, g in zip(ts, gs):
            if g is None and t.numel() != 1:
                raise SMPValidationError("smp: model.backward(): a gradient can be implied only for a tensor "
                                         f"with one element; pass grad_tensors for shape {tuple(t.shape)}")
        self.records[self.current] = (ts, gs)


# ----------------------------------------------------------------- splitting

def _split(value: Any, m: int, axis: int, name: str) -> List[Any]:
    if isinstance(value, torch.Tensor):
        if value.dim() == 0:
            return [value] * m
        ax = axis if axis >= 0 else value.dim() + axis
        if not 0 <= ax < value.dim():
            raise SMPValidationError(f"smp.step: argument '{name}' has {value.dim()} dimensions; cannot "
                                     f"split it along axis {axis}")
        n = value.size(ax)
        if n % m:
            raise SMPValidationError(
                f"smp.step: argument '{name}' has {n} entries along axis {ax}, which is not divisible by "
                f"microbatches={m} (the batch size must be a multiple of the number of microbatches)")
        return list(value.split(n // m, dim=ax))
    if hasattr(value, "smp_slice") and callable(value.smp_slice):
        return [value.smp_slice(m, i, axis) for i in range(m)]
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        parts = [_split(v, m, axis, f"{name}.{f}") for f, v in zip(value._fields, value)]
        return [type(value)(*(p[i] for p in parts)) for i in range(m)]
    if isinstance(value, (list, tuple)):
        parts = [_split(v, m, axis, f"{name}[{k}]") for k, v in enumerate(value)]
        return [type(value)(p[i] for p in parts) for i in range(m)]
    if isinstance(value, dict):
        parts = {k: _split(v, m, axis, f"{name}[{k!r}]") for k, v in value.items()}
        return [type(value)((k, parts[k][i]) for k in value) for i in range(m)]
    return [value] * m


def split_inputs(fn: Callable, args: tuple, kwargs: dict, m: int, non_split: Sequence[str],
                 axes: Dict[str, int]) -> List[tuple]:
    sig = inspect.signature(fn)
    bound = sig.bind(*args, **kwargs)
    for name in list(non_split) + list(axes):
        if name not in sig.parameters:
            raise SMPValidationError(f"smp.step: '{name}' (in non_split_inputs/input_split_axes) is not a "
                                     f"parameter of {fn.__name__}")
    per_name = {}
    for name, value in bound.arguments.items():
        kind = sig.parameters[name].kind
        if name in non_split or _is_model(value):
            per_name[name] = [value] * m
        elif kind == inspect.Parameter.VAR_POSITIONAL:
            parts = [_split(v, m, axes.get(name, 0), f"{name}[{k}]") for k, v in enumerate(value)]
            per_name[name] = [tuple(p[i] for p in parts) for i in range(m)]
        elif kind == inspect.Parameter.VAR_KEYWORD:
            parts = {k: _split(v, m, axes.get(k, 0), k) for k, v in value.items()}
            per_name[name] = [{k: parts[k][i] for k in value} for i in range(m)]
        else:
            per_name[name] = _split(value, m, axes.get(name, 0), name)
    out = []
    for i in range(m):
        b = inspect.BoundArguments(sig, {k: v[i] for k, v in per_name.items()})
        out.append((b.args, b.kwargs))
    return out


def _is_model(v: Any) -> bool:
    return isinstance(v, (DistributedModel, torch.nn.Module))


# ----------------------------------------------------------------- outputs

def _detach(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return v.detach()
    if isinstance(v, tuple) and hasattr(v, "_fields"):
        return type(v)(*(_detach(x) for x in v))
    if isinstance(v, (list, tuple)):
        return type(v)(_detach(x) for x in v)
    if isinstance(v, dict):
        return type(v)((k, _detach(x)) for k, x in v.items())
    return v


def wrap_outputs(results: List[Any]) -> Any:
    """Per-microbatch results -> one structure whose leaves are StepOutputs."""
    first = results[0]
    if first is None and all(r is None for r in results):
        return None
    if isinstance(first, tuple) and hasattr(first, "_fields") and \
            all(type(r) is type(first) for r in results):
        return type(first)(*(wrap_outputs([r[k] for r in results]) for k in range(len(first))))
    if isinstance(first, (list, tuple)) and all(type(r) is type(first) and len(r) == len(first)
                                                for r in results):
        return type(first)(wrap_outputs([r[k] for r in results]) for k in range(len(first)))
    if isinstance(first, dict) and all(isinstance(r, dict) and r.keys() == first.keys() for r in results):
        return type(first)((k, wrap_outputs([r[k] for r in results])) for k in first)
    return StepOutput(results)


# ----------------------------------------------------------------- the decorator

class StepFunction:
    def __init__(self, fn: Callable, non_split_inputs=None, input_split_axes=None, detach_outputs=True):
        self.fn = fn
        self.non_split = list(non_split_inputs or [])
        self.axes = dict(input_split_axes or {})
        self.detach_outputs = detach_outputs
        functools.update_wrapper(self, fn)

    def __get__(self, obj, objtype=None):
        """As a method: binds the instance like a plain function would."""
        return self if obj is None else functools.partial(self.__call__, obj)

    def __call__(self, *args, **kwargs):
        s = require()
        s.monitor.check()
        model = s.model
        if model is None:
            raise SMPValidationError("smp.step: wrap the model in smp.DistributedModel before calling a "
                                     "step function")
        if s.step_ctx is not None:
            raise SMPValidationError("smp.step: step functions cannot be nested")
        m = s.cfg.microbatches
        where = f"in step function {getattr(self.fn, '__name__', '?')}"
        try:
            dev = partition_device()
            if dev.type != "cpu":
                args, kwargs = to_device(args, dev), to_device(kwargs, dev)
            ctx = StepContext(self.fn, split_inputs(self.fn, args, kwargs, m, self.non_split, self.axes), m)
            s.step_ctx = ctx
            for i in range(m):
                ctx.capture(i)
            results = model._run_step(ctx)
        except BaseException as e:  # noqa: BLE001 - every failure must reach the other ranks
            exc = s.monitor.fail(e, getattr(e, "_smp_where", where))
            if exc is e:
                raise
            raise exc from None
        finally:
            s.step_ctx = None
        if self.detach_outputs:
            results = [_detach(r) for r in results]
        return wrap_outputs(results)


def step(fn: Optional[Callable] = None, *, non_split_inputs=None, input_split_axes=None, detach_outputs=True):
    """Decorator: ``@smp.step`` or ``@smp.step(non_split_inputs=[...], input_split_axes={...})``."""
    if fn is not None and callable(fn):
        return StepFunction(fn)

    def deco(f):
        return StepFunction(f, non_split_inputs, input_split_axes, detach_outputs)
    if fn is not None:   # @smp.step(["x"]) : positional non_split_inputs, as in SageMaker's signature
        non_split_inputs = fn
    return deco

