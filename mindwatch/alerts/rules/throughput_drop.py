"""Throughput falling while the loss looks normal: the accelerator is waiting ("fake training").

Example::

    alerts: {throughput_drop: {fraction: 0.5, count: 3}}
"""

from __future__ import annotations

import math

from pydantic import Field

from mindwatch.alerts.alert import Alert
from mindwatch.alerts.rules.base import Record, RollingMedian, RuleBase, RuleContext, RuleSpec, Streak, data_share, value_of
from mindwatch.schema import RuleSettings


class ThroughputDropSettings(RuleSettings):
    metric: str = "samples_per_second"
    #: Fires below ``fraction`` x the rolling median while the loss looks normal.
    fraction: float = Field(default=0.5, gt=0, lt=1)
    window: int = Field(default=50, ge=3)
    warmup: int = Field(default=20, ge=1)
    count: int = Field(default=3, ge=1)


class ThroughputDropRule(RuleBase):
    """Throughput below ``fraction`` x its rolling median for ``count`` records while the loss looks normal
    (finite and not spiking): the accelerator is likely waiting ("fake training")."""

    name = "throughput_drop"

    def __init__(
        self,
        metric: str = "samples_per_second",
        *,
        fraction: float = 0.5,
        window: int = 50,
        warmup: int = 20,
        count: int = 3,
        loss_factor: float = 3.0,
        rank: int = 0,
        actions=(),
    ) -> None:
        super().__init__(rank, actions)
        self.metric, self.fraction, self.loss_factor = metric, fraction, loss_factor
        self.streak = Streak(window, warmup, count)
        self.loss = RollingMedian(window)

    def check(self, rec: Record) -> list[Alert]:
        v = value_of(rec, self.metric)
        if v is None or not math.isfinite(v):
            return []
        loss = value_of(rec, "loss")
        loss_normal = loss is None or (
            math.isfinite(loss) and (len(self.loss) == 0 or loss <= self.loss_factor * abs(self.loss.median))
        )
        median = self.streak.feed(v, lambda v, m: v < self.fraction * m and loss_normal)
        if loss is not None:
            self.loss.add(loss)
        if median is None:
            return []
        share = data_share(rec)
        why = f"; {100 * share:.0f} % of the step is spent waiting for data" if share is not None else ""
        msg = (
            f"{self.metric} fell to {v:.4g}, below {self.fraction:g} x its rolling median {median:.4g}, "
            f"while the loss looks normal{why}"
        )
        return [self._alert(rec, msg, metric=self.metric, value=v, threshold=self.fraction * median)]


def _build(s: ThroughputDropSettings, ctx: RuleContext) -> list[ThroughputDropRule]:
    return [
        ThroughputDropRule(
            s.metric, fraction=s.fraction, window=s.window, warmup=s.warmup, count=s.count, rank=ctx.rank, actions=s.actions
        )
    ]


SPEC = RuleSpec(
    "throughput_drop",
    ThroughputDropSettings,
    _build,
    doc="throughput below `fraction` x its rolling median for `count` records while the loss looks normal",
)
