"""The loss rising over a window, beyond the noise.

Example::

    alerts: {divergence: {window: 50, min_rise: 0.2, min_t: 4}}
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from pydantic import Field

from mindwatch.alerts.alert import Alert
from mindwatch.alerts.rules.base import Record, RuleBase, RuleContext, RuleSpec, settings_from, value_of
from mindwatch.schema import RuleSettings
from mindwatch.units import format_change, format_number


class DivergenceSettings(RuleSettings):
    metric: str = "loss"
    #: Recorded steps the trend is fitted over.
    window: int = Field(default=50, ge=5)
    #: The fitted rise over the window, relative to the window's median, that counts.
    min_rise: float = Field(default=0.2, gt=0)
    #: The rise must stand out of the noise: slope / its standard error.
    min_t: float = Field(default=4.0, gt=0)


class DivergenceRule(RuleBase):
    """The loss rising over the last ``window`` recorded steps, beyond the noise.

    A least-squares line through the window must rise by more than ``min_rise`` x the
    window's median, and its slope must be ``min_t`` standard errors above zero.
    """

    name = "divergence"

    def __init__(self, settings: DivergenceSettings | None = None, *, rank: int = 0, **values: Any) -> None:
        """``settings`` as ``alerts.divergence`` validated them; keywords (``DivergenceRule(window=50)``) are
        validated the same way."""
        s = settings_from(DivergenceSettings, settings, values)
        super().__init__(rank, s.actions)
        self.metric, self.min_rise, self.min_t = s.metric, s.min_rise, s.min_t
        self.values: deque[float] = deque(maxlen=s.window)
        n = s.window
        self._xm = (n - 1) / 2
        self._sxx = sum((i - self._xm) ** 2 for i in range(n))

    def check(self, rec: Record) -> list[Alert]:
        v = value_of(rec, self.metric)
        if v is None or not math.isfinite(v):
            return []
        ys = self.values
        ys.append(v)
        n = ys.maxlen or 0
        if len(ys) < n:
            return []
        ym = sum(ys) / n
        xm, sxx = self._xm, self._sxx
        slope = sum((i - xm) * (y - ym) for i, y in enumerate(ys)) / sxx
        if slope <= 0:
            return []
        rise = slope * (n - 1)
        level = abs(sorted(ys)[n // 2]) or 1e-12
        if rise < self.min_rise * level:
            return []
        ssr = sum((y - (ym + slope * (i - xm))) ** 2 for i, y in enumerate(ys))
        se = math.sqrt(ssr / (n - 2) / sxx) if ssr > 0 else 0.0
        t = slope / se if se > 0 else math.inf
        if t < self.min_t:
            return []
        change = format_change(rise / level, "the window's median")
        over = f"over the last {n} recorded steps (t = {format_number(t, 3)})"
        msg = f"{self.metric} is diverging: up {format_number(rise)} ({change}) {over}"
        return [self._alert(rec, msg, metric=self.metric, value=v, threshold=ym - slope * xm + self.min_rise * level)]


def _build(s: DivergenceSettings, ctx: RuleContext) -> list[DivergenceRule]:
    return [DivergenceRule(s, rank=ctx.rank)]


SPEC = RuleSpec(
    "divergence",
    DivergenceSettings,
    _build,
    doc="a least-squares rise of the loss over `window` records, above `min_rise` and `min_t` standard errors",
)
