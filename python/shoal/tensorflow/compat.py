"""Keras 2 spellings that scripts written for the SageMaker libraries use and
Keras 3 (TensorFlow 2.16 and newer) dropped, restored where they cannot clash:
``optimizer.variables()`` (a list in Keras 3: the list is made callable,
returning itself). optimizer.get_gradients / compute_gradients exist inside
``@smp.step`` only (modelparallel/step.py)."""

from __future__ import annotations

from tensorflow import keras

_DONE = [False]


class _CallableList(list):
    """A list that, called, returns itself: ``opt.variables`` and ``opt.variables()`` both work."""

    def __call__(self):
        return self


def install() -> None:
    if _DONE[0]:
        return
    base = keras.optimizers.Optimizer
    prop = None
    for klass in base.__mro__:
        if isinstance(klass.__dict__.get("variables"), property):
            prop = klass.__dict__["variables"]
            break
    if prop is not None:
        base.variables = property(lambda self: _CallableList(prop.fget(self)))
    _DONE[0] = True
