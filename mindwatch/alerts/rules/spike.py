"""A metric above ``factor`` x its own rolling median, ``count`` records in a row.

Example::

    alerts: {spike: {metrics: [loss, grad_norm], factor: 3, count: 3, actions: [lr_backoff]}}
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import Field

from mindwatch import metrics as vocab
from mindwatch.alerts.alert import Alert
from mindwatch.alerts.rules.base import Record, RuleBase, RuleContext, RuleSpec, Streak, settings_from, value_of
from mindwatch.schema import RuleSettings
from mindwatch.units import format_number, format_times


class SpikeSettings(RuleSettings):
    metrics: list[str] = Field(default_factory=lambda: list(vocab.TRAINING_SIGNALS))
    #: A value above ``factor`` x the rolling median of the last ``window`` values is a spike.
    factor: float = Field(default=3.0, gt=1)
    window: int = Field(default=50, ge=3)
    #: Recorded values before the rule judges (early training is noisy).
    warmup: int = Field(default=20, ge=1)
    #: Consecutive spikes before it fires.
    count: int = Field(default=3, ge=1)


class SpikeRule(RuleBase):
    """``metric`` above ``factor`` x its rolling median for ``count`` recorded steps in a row, after ``warmup`` values."""

    name = "spike"

    def __init__(self, metric: str, settings: SpikeSettings | None = None, *, rank: int = 0, **values: Any) -> None:
        """One of ``settings.metrics``; ``settings`` as ``alerts.spike`` validated them, or keywords validated the same way."""
        s = settings_from(SpikeSettings, settings, values)
        super().__init__(rank, s.actions)
        self.metric, self.factor, self.count = metric, s.factor, s.count
        self.streak = Streak(s.window, s.warmup, s.count)

    def check(self, rec: Record) -> list[Alert]:
        v = value_of(rec, self.metric)
        if v is None or not math.isfinite(v):
            return []
        median = self.streak.feed(v, lambda v, m: m > 0 and v > self.factor * m)
        if median is None:
            return []
        in_a_row = f" for {self.count} recorded steps in a row" if self.count > 1 else ""
        times = format_times(v / median, f"its rolling median {format_number(median)}")
        msg = f"{self.metric} spiked to {format_number(v)}, {times} (limit {self.factor:g} x){in_a_row}"
        return [self._alert(rec, msg, metric=self.metric, value=v, threshold=self.factor * median)]


def _build(s: SpikeSettings, ctx: RuleContext) -> list[SpikeRule]:
    return [SpikeRule(m, s, rank=ctx.rank) for m in s.metrics]


SPEC = RuleSpec("spike", SpikeSettings, _build, doc="a metric above `factor` x its rolling median for `count` records in a row")
