"""What the TensorFlow face's modules share while a step runs: the manual
placement context (``smp.partition``), the hook on Keras layer calls that the
pipeline runs through, and the step being run. A leaf module: the model, the
runtime and the tracer all read it, and it imports none of them.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, List, Optional

from tensorflow import keras  # the public API (on Keras 2, a bare `import keras` is not)

from ...mpcommon.errors import SMPValidationError

# ----------------------------------------------------------------- smp.partition

_STACK: List[int] = []
_LIMIT: List[Optional[int]] = [None]


def set_limit(partitions: Optional[int]) -> None:
    """The number of partitions smp.partition accepts (set by smp.init)."""
    _LIMIT[0] = partitions


@contextlib.contextmanager
def partition(index: int):
    """Manual placement (auto_partition off): layers *called* (or created) inside
    the context run on partition `index`; the innermost context wins."""
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise SMPValidationError(f"smp.partition: index must be an integer >= 0, got {index!r}")
    if _LIMIT[0] is not None and index >= _LIMIT[0]:
        raise SMPValidationError(f"smp.partition({index}): there are only {_LIMIT[0]} partitions "
                                 f"(0..{_LIMIT[0] - 1})")
    _STACK.append(index)
    try:
        yield
    finally:
        _STACK.pop()


def current_partition() -> Optional[int]:
    return _STACK[-1] if _STACK else None


# ----------------------------------------------------------------- the layer hook

class _Hook(threading.local):
    handler: Optional[Callable] = None   # (layer, call, args, kwargs) -> outputs, while a run is active
    depth: int = 0


HOOK = _Hook()
_ORIG_CALL = keras.layers.Layer.__call__
_ORIG_INIT = keras.layers.Layer.__init__


def _layer_call(self, *args, **kwargs):
    h = HOOK.handler
    if h is None:
        return _ORIG_CALL(self, *args, **kwargs)
    return h(self, lambda *a, **k: _ORIG_CALL(self, *a, **k), args, kwargs)


def _layer_init(self, *args, **kwargs):
    _ORIG_INIT(self, *args, **kwargs)
    if _STACK:
        object.__setattr__(self, "_smp_partition", _STACK[-1])


keras.layers.Layer.__call__ = _layer_call
keras.layers.Layer.__init__ = _layer_init


@contextlib.contextmanager
def inside_unit():
    """While a unit layer runs: the layers it calls are not units (the hook passes them through)."""
    HOOK.depth += 1
    try:
        yield
    finally:
        HOOK.depth -= 1


def in_unit() -> bool:
    return HOOK.depth > 0


@contextlib.contextmanager
def hooked(handler: Callable):
    prev, HOOK.handler = HOOK.handler, handler
    try:
        yield
    finally:
        HOOK.handler = prev


# ----------------------------------------------------------------- the step being run

_CUR = threading.local()


def current_run() -> Optional[Any]:
    """The runtime.StepRun of the step this thread is running, if any."""
    return getattr(_CUR, "run", None)


@contextlib.contextmanager
def running(run: Any):
    _CUR.run = run
    try:
        yield
    finally:
        _CUR.run = None
