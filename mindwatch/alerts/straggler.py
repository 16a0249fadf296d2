"""The straggler rule and its settings (``distributed.straggler``): a rank slower than the others, run on rank 0.

Example::

    rule = StragglerRule(["data_time"], factor=2.0, min_excess=0.05, count=5)
    rule.check({"step": 12, "ranks": {0: {"data_time": 0.01}, 1: {"data_time": 0.30}}})   # [] until 5 steps in a row

Rank 0's :class:`~mindwatch.alerts.crossrank.CrossRankWatch` feeds it one step across ranks at a time: from the
train step's collective signal (every rank's step and data time, in every step, with or without a shared file
system) or, for train cells that are not ours, from the other ranks' metrics files in a shared run directory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import Field

from mindwatch import metrics as vocab
from mindwatch.alerts.alert import Alert, make_alert
from mindwatch.alerts.rules.base import value_of
from mindwatch.schema import RuleSettings
from mindwatch.units import format_ms

#: The rule's name in ``alerts.jsonl``.
STRAGGLER = "straggler"

if TYPE_CHECKING:
    _StragglerMetric = str
else:  # the names as a Literal: the error lists them
    _StragglerMetric = Literal[vocab.STRAGGLER_METRICS]


class StragglerSettings(RuleSettings):
    """A rank whose step or data time stays above the other ranks' median (checked on rank 0)."""

    metrics: list[_StragglerMetric] = list(vocab.STRAGGLER_METRICS)  # pydantic copies the default
    #: A rank is slow at a step when its value is above ``factor`` x the median of the other ranks ...
    factor: float = Field(default=2.0, gt=1)
    #: ... and above it by at least this many seconds (tiny times are noise).
    min_excess: float = Field(default=0.05, ge=0)
    #: Steps in a row a rank must be slow before it is named.
    count: int = Field(default=5, ge=1)


def medians_of_the_others(values: np.ndarray) -> np.ndarray:
    """For each element, the median of all the other elements (``statistics.median`` of the rest), in O(n log n)."""
    n = len(values)
    order = np.argsort(values, kind="stable")
    s = values[order]
    position = np.empty(n, np.int64)
    position[order] = np.arange(n)
    m = n - 1  # how many values are left without one
    lo, hi = (m - 1) // 2, m // 2  # the middle of what is left (one index when m is odd)
    at_lo = np.where(lo < position, s[lo], s[min(lo + 1, n - 1)])  # without element i, index k of the rest is s[k] or s[k + 1]
    at_hi = np.where(hi < position, s[hi], s[min(hi + 1, n - 1)])
    return (at_lo + at_hi) / 2


class StragglerRule:
    """A rank whose ``metric`` stays above ``factor`` x the other ranks' median (and by ``min_excess`` seconds)
    for ``count`` steps in a row. It fires once per streak and re-arms when the rank catches up.

    Input: one step across ranks, ``{"step": 12, "ranks": {0: record, 1: record, ...}}``.
    """

    name = STRAGGLER
    severity = "warning"

    @classmethod
    def from_settings(cls, s: StragglerSettings) -> StragglerRule:
        """The rule as ``distributed.straggler`` configures it."""
        return cls(s.metrics, factor=s.factor, min_excess=s.min_excess, count=s.count, actions=s.actions)

    def __init__(
        self,
        metrics: Sequence[str] = vocab.STRAGGLER_METRICS,
        *,
        factor: float = 2.0,
        min_excess: float = 0.05,
        count: int = 5,
        actions: Sequence[str] = (),
    ) -> None:
        self.metrics = tuple(metrics)
        self.factor, self.min_excess, self.count = factor, min_excess, count
        self.actions = list(actions)
        self.streak: dict[tuple[int, str], int] = {}

    def check(self, step_record: dict[str, Any]) -> list[Alert]:
        ranks: dict[int, dict[str, Any]] = step_record["ranks"]
        if len(ranks) < 2:
            return []
        out = []
        for metric in self.metrics:
            values = {r: v for r, rec in ranks.items() if (v := value_of(rec, metric)) is not None and v == v}
            if len(values) < 2:
                continue
            who = np.fromiter(values, np.int64, len(values))
            column = np.fromiter(values.values(), np.float64, len(values))
            median = medians_of_the_others(column)
            slow = (column > self.factor * median) & (column - median > self.min_excess)
            for rank, is_slow, value, med in zip(who.tolist(), slow.tolist(), column.tolist(), median.tolist(), strict=True):
                key = (rank, metric)
                if is_slow:
                    self.streak[key] = self.streak.get(key, 0) + 1
                    if self.streak[key] == self.count:
                        out.append(self._alert(step_record["step"], rank, metric, value, med))
                elif self.streak.get(key):
                    self.streak[key] = 0
        return out

    def _alert(self, step: int, rank: int, metric: str, value: float, median: float) -> Alert:
        times = f"{value / median:.1f} x " if median > 0 else ""
        msg = (
            f"rank {rank} is a straggler: its {metric} {format_ms(value)} is {times}the other ranks' median {format_ms(median)}, "
            f"{self.count} steps in a row"
        )
        return make_alert(
            self.name,
            step=step,
            rank=rank,
            message=msg,
            metric=metric,
            value=value,
            threshold=self.factor * median,
            severity=self.severity,
            actions=self.actions,
            straggler=rank,
            others_median=median,
            reported_by=0,
        )
