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

from typing import Any

from tensorflow import keras  # the public API (on Keras 2, a bare `import keras` is not)

from ...mpcommon.errors import SMPValidationError
from .context import HOOK, current_run, partition  # noqa: F401  (partition: smp.partition)
from .state import STATE

# ----------------------------------------------------------------- the model

class DistributedModel(keras.Model):
    """Subclass it as a Keras model (layers in ``__init__``, the forward in
    ``call``) and call it inside an ``@smp.step`` function. After the first
    step, ``trainable_variables`` holds this rank's partition's variables only
    (what the optimizer of this rank updates)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        STATE.model = self
        object.__setattr__(self, "_smp_local", None)     # ids of this partition's variables, once partitioned

    def __call__(self, *args, **kwargs):
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
