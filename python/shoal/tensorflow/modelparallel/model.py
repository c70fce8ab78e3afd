"""``smp.DistributedModel`` (a Keras model whose ``call`` is partitioned),
``smp.partition`` and the hook on Keras layer calls the pipeline runs through.

A *unit* is a layer the model's ``call`` calls directly (or, when there are
fewer of those than partitions, a layer one level further down, see
trace.py): the unit of placement. Every rank runs the model's ``call`` for
every microbatch; a unit call on this rank's partition runs, any other
returns a stand-in of the right shape (zeros), and values that cross
partitions are sent and received at the unit calls that consume them
(runtime.py).
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
def hooked(handler: Callable):
    prev, HOOK.handler = HOOK.handler, handler
    try:
        yield
    finally:
        HOOK.handler = prev


# ----------------------------------------------------------------- the model

class DistributedModel(keras.Model):
    """Subclass it as a Keras model (layers in ``__init__``, the forward in
    ``call``) and call it inside an ``@smp.step`` function. After the first
    step, ``trainable_variables`` holds this rank's partition's variables only
    (what the optimizer of this rank updates)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        from .state import STATE
        STATE.model = self
        object.__setattr__(self, "_smp_local", None)     # ids of this partition's variables, once partitioned

    def __call__(self, *args, **kwargs):
        from .runtime import current_run
        run = current_run()
        if run is None:
            if HOOK.handler is not None:      # the pipeline's own call (recording, tracing)
                return super().__call__(*args, **kwargs)
            raise SMPValidationError(f"smp: call {type(self).__name__} inside an @smp.step function (the pipeline "
                                     f"runs it one microbatch at a time across the partitions)")
        return run.model_call(self, lambda *a, **k: keras.Model.__call__(self, *a, **k), args, kwargs)

    def _local(self, variables):
        ids = getattr(self, "_smp_local", None)
        if ids is None:
            return variables
        return [v for v in variables if id(v) in ids]

    @property
    def trainable_variables(self):
        return self._local(super().trainable_variables)

    @property
    def trainable_weights(self):
        return self._local(super().trainable_weights)

    def full_trainable_variables(self):
        """Every trainable variable of the model, on every partition."""
        ids = getattr(self, "_smp_local", None)
        object.__setattr__(self, "_smp_local", None)    # Keras 2's trainable_variables reads trainable_weights
        try:
            return super().trainable_variables
        finally:
            object.__setattr__(self, "_smp_local", ids)


def layer_name(layer: Any, path: str = "") -> str:
    return path or getattr(layer, "name", type(layer).__name__)
