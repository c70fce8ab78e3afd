"""``StepOutput``: what a step function returned, one value per microbatch.

The reductions are written once here; a front end's subclass supplies the
three framework operations they need (sum, concatenate, stack).
Microbatches that produced nothing (None) are left out of sums; the mean
divides by the number of microbatches, so it stays the batch's mean.
"""

from __future__ import annotations

import abc
from typing import Any, Callable, List, Optional, Sequence


class StepOutput(abc.ABC):
    def __init__(self, outputs: Sequence[Any]):
        self.outputs = list(outputs)

    # ------------------------------------------------------------- framework operations
    @staticmethod
    def _sum(values: List[Any]) -> Any:
        return sum(values)

    @staticmethod
    @abc.abstractmethod
    def _concat(values: List[Any], dim: int) -> Any:
        """The values joined along `dim` (each face with its framework's op)."""

    @staticmethod
    @abc.abstractmethod
    def _stack(values: List[Any], dim: int) -> Any:
        """The values stacked along a new `dim`."""

    # ------------------------------------------------------------- the API
    def _live(self) -> List[Any]:
        return [o for o in self.outputs if o is not None]

    def reduce_sum(self):
        live = self._live()
        return self._sum(live) if live else None

    def reduce_mean(self):
        total = self.reduce_sum()
        return None if total is None else total / len(self.outputs)

    def concat(self, dim: int = 0, *, axis: Optional[int] = None):
        return self._concat(self.outputs, dim if axis is None else axis)

    def stack(self, dim: int = 0, *, axis: Optional[int] = None):
        return self._stack(self.outputs, dim if axis is None else axis)

    def map(self, fn: Callable[[Any], Any]) -> "StepOutput":
        """Applies `fn` to every microbatch's value, in place; returns self."""
        self.outputs = [fn(o) for o in self.outputs]
        return self

    def __iter__(self):
        return iter(self.outputs)

    def __len__(self) -> int:
        return len(self.outputs)

    def __getitem__(self, i):
        return self.outputs[i]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self.outputs)} microbatches)"
