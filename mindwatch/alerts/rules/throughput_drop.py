"""Throughput or device utilization falling while the loss looks normal: the accelerator is waiting ("fake training").

Example::

    alerts: {throughput_drop: {fraction: 0.5, count: 3}}

The utilization (``device_util``, sampled by :mod:`mindwatch.system` where a GPU or NPU is present)
is judged like the throughput, with its own rolling median: a device that fell from 90 % to 5 %
while the loss looked fine is the case this rule exists for. A new batch size (``batch_size``, a DynamicBatch's)
starts both medians anew: fewer samples per step is no drop.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import Field

from mindwatch import metrics as vocab
from mindwatch.alerts.alert import Alert
from mindwatch.alerts.rules.base import (
    Record,
    RollingMedian,
    RuleBase,
    RuleContext,
    RuleSpec,
    Streak,
    data_share,
    settings_from,
    value_of,
)
from mindwatch.schema import RuleSettings
from mindwatch.units import format_number


class ThroughputDropSettings(RuleSettings):
    metric: str = "samples_per_second"
    #: The device utilization watched the same way ("" to ignore it).
    util_metric: str = "device_util"
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
        self, settings: ThroughputDropSettings | None = None, *, loss_factor: float = 3.0, rank: int = 0, **values: Any
    ) -> None:
        """``settings`` as ``alerts.throughput_drop`` validated them; keywords (``ThroughputDropRule(count=3)``) are
        validated the same way. ``loss_factor``: a loss above this x its rolling median is not "normal"."""
        s = settings_from(ThroughputDropSettings, settings, values)
        super().__init__(rank, s.actions)
        self.metric, self.fraction, self.loss_factor = s.metric, s.fraction, loss_factor
        self._streak_settings = (s.window, s.warmup, s.count)
        self.streak = Streak(*self._streak_settings)
        self.util_metric = s.util_metric
        self.util_streak = Streak(*self._streak_settings)
        #: The batch size of the records judged (a DynamicBatch's ``batch_size``; None: not recorded).
        self.batch_size: float | None = None
        self.loss = RollingMedian(s.window)

    def check(self, rec: Record) -> list[Alert]:
        if rec.get(vocab.PROFILED):  # the profiler slows the steps it records: not a drop to judge, nor a baseline
            return []
        size = value_of(rec, "batch_size")
        if size is not None and size != self.batch_size:
            if self.batch_size is not None:  # a new batch size: a new baseline, after a new warm-up
                self.streak, self.util_streak = Streak(*self._streak_settings), Streak(*self._streak_settings)
            self.batch_size = size
        loss = value_of(rec, "loss")
        loss_normal = loss is None or (
            math.isfinite(loss) and (len(self.loss) == 0 or loss <= self.loss_factor * abs(self.loss.median))
        )
        if loss is not None:
            self.loss.add(loss)
        out = []
        for metric, streak in ((self.metric, self.streak), (self.util_metric, self.util_streak)):
            v = value_of(rec, metric) if metric else None
            if v is None or not math.isfinite(v):
                continue
            median = streak.feed(v, lambda v, m: v < self.fraction * m and loss_normal)
            if median is None:
                continue
            share = data_share(rec)
            why = f"; {100 * share:.0f} % of the step is spent waiting for data" if share is not None else ""
            msg = (
                f"{metric} fell to {format_number(v)}, below {self.fraction:g} x its rolling median {format_number(median)}, "
                f"while the loss looks normal{why}"
            )
            out.append(self._alert(rec, msg, metric=metric, value=v, threshold=self.fraction * median))
        return out


def _build(s: ThroughputDropSettings, ctx: RuleContext) -> list[ThroughputDropRule]:
    return [ThroughputDropRule(s, rank=ctx.rank)]


SPEC = RuleSpec(
    "throughput_drop",
    ThroughputDropSettings,
    _build,
    doc="throughput or device utilization below `fraction` x its rolling median for `count` records while the loss looks normal",
)
