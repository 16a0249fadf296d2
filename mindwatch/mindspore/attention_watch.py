"""Which steps sample the attention statistics, and their values into the step's record (training thread).

Example::

    watch = AttentionWatch(attention_stats_cells(network), every=10)
    watch.plan(step)                 # before the step: sets the AttentionStats flags for it
    watch.add(rec, values)           # after it: attention_entropy/<layer>, attention_max_logit/<layer>

The flags are :class:`~mindwatch.mindspore.measured_cells.MeasuredCells`'.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mindwatch.mindspore.attention import ATTENTION_METRICS, AttentionStats
from mindwatch.mindspore.measured_cells import MeasuredCells


class AttentionWatch(MeasuredCells):
    """The sampled steps (every ``attention_entropy.every``) of the model's :class:`AttentionStats` cells."""

    def __init__(self, cells: Sequence[tuple[str, AttentionStats]], *, every: int) -> None:
        super().__init__(cells, every=every)
        #: The record keys of each layer's values, in AttentionStats' order.
        self._keys = [tuple(f"{metric}/{name}" for metric in ATTENTION_METRICS) for name in self.layers]

    def add(self, rec: dict[str, Any], values: Sequence[Sequence[float]]) -> None:
        """``values``: ``(cells, 2)`` entropy and max logit of a sampled step."""
        for keys, pair in zip(self._keys, values, strict=True):
            rec[keys[0]], rec[keys[1]] = float(pair[0]), float(pair[1])
