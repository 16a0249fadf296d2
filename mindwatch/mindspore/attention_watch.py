"""Which steps sample the attention statistics, and their values into the step's record (training thread).

Example::

    watch = AttentionWatch(attention_stats_cells(network), every=10)
    watch.plan(step)                 # before the step: sets the AttentionStats flags for it
    watch.add(rec, values)           # after it: attention_entropy/<layer>, attention_max_logit/<layer>

The flags are written with ``ops.assign``: in place, so a graph compiled by ``ms.jit`` around the
user's own step sees them (``set_data`` replaces the buffer such a graph holds).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mindspore as ms
from mindspore import ops

from mindwatch.mindspore.attention import ATTENTION_METRICS, AttentionStats

_ON, _OFF = ms.Tensor(1, ms.int32), ms.Tensor(0, ms.int32)


class AttentionWatch:
    """The sampled steps (every ``attention_entropy.every``) of the model's :class:`AttentionStats` cells."""

    def __init__(self, cells: Sequence[tuple[str, AttentionStats]], *, every: int) -> None:
        self.layers = tuple(name for name, _ in cells)
        self.cells = [cell for _, cell in cells]
        self.every = every
        #: The record keys of each layer's values, in AttentionStats' order.
        self._keys = [tuple(f"{metric}/{name}" for metric in ATTENTION_METRICS) for name in self.layers]
        #: Whether the step being run samples (what the flags hold).
        self.sampling = False
        self._set(False)

    def plan(self, step: int) -> bool:
        """Sample global step ``step`` or not; the flags change only when that changes."""
        on = step % self.every == 0
        if on != self.sampling:
            self._set(on)
        return on

    def off(self) -> None:
        """Sample nothing (the training ends; the cells may train again without us)."""
        if self.sampling:
            self._set(False)

    def values(self) -> list[Any]:
        """The cells' value Parameters (for a loop's one compiled read)."""
        return [cell.values for cell in self.cells]

    def add(self, rec: dict[str, Any], values: Sequence[Sequence[float]]) -> None:
        """``values``: ``(cells, 2)`` entropy and max logit of a sampled step."""
        for keys, pair in zip(self._keys, values, strict=True):
            rec[keys[0]], rec[keys[1]] = float(pair[0]), float(pair[1])

    def _set(self, on: bool) -> None:
        for cell in self.cells:
            ops.assign(cell.on, _ON if on else _OFF)
        self.sampling = on
