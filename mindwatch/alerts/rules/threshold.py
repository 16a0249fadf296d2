"""``warn_on_value`` limits: a metric above (or, for throughput, below) a number.

Example::

    monitor_config: {callback: {params: {warn_on_value: {loss: 50, tokens_per_second: 1000}}},
                     alerts: {thresholds: {actions: [stop]}}}
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from mindwatch import metrics as vocab
from mindwatch.alerts.alert import Alert
from mindwatch.alerts.rules.base import Record, RuleBase, RuleContext, RuleSpec, value_of
from mindwatch.schema import RuleSettings
from mindwatch.units import format_number

#: Metrics where more is better: a bare ``warn_on_value`` limit on them is a lower bound.
THROUGHPUT_METRICS = frozenset(vocab.ALIASES["throughput"])


class ThresholdRule(RuleBase):
    """``warn_on_value``: fires when ``metric`` is above ``above`` or below ``below``."""

    name = "threshold"

    def __init__(self, metric: str, *, above: float | None = None, below: float | None = None, rank: int = 0, actions=()) -> None:
        super().__init__(rank, actions)
        if (above is None) == (below is None):
            raise ValueError("ThresholdRule needs exactly one of above= or below=")
        self.metric, self.above, self.below = metric, above, below

    def check(self, rec: Record) -> list[Alert]:
        v = value_of(rec, self.metric)
        if v is None or not math.isfinite(v):
            return []  # NaN/Inf belongs to the non-finite rule
        if self.above is not None and v > self.above:
            side, limit = "above", self.above
        elif self.below is not None and v < self.below:
            side, limit = "below", self.below
        else:
            return []
        message = f"{self.metric} {format_number(v)} is {side} the limit {format_number(limit)}"
        return [self._alert(rec, message, metric=self.metric, value=v, threshold=limit)]


def threshold_rules(warn_on_value: Mapping[str, Any], *, rank: int = 0, actions: Sequence[str] = ()) -> list[ThresholdRule]:
    """Rules for ``callback.params.warn_on_value``: ``{loss: 50, tokens_per_second: 1000, x: {below: 2}}``."""
    rules = []
    for metric, limit in warn_on_value.items():
        above = getattr(limit, "above", None) if not isinstance(limit, dict) else limit.get("above")
        below = getattr(limit, "below", None) if not isinstance(limit, dict) else limit.get("below")
        if isinstance(limit, (int, float)):
            above, below = (None, float(limit)) if metric in THROUGHPUT_METRICS else (float(limit), None)
        rules.append(ThresholdRule(metric, above=above, below=below, rank=rank, actions=actions))
    return rules


def _build(s: RuleSettings, ctx: RuleContext) -> list[ThresholdRule]:
    return threshold_rules(ctx.warn_on_value, rank=ctx.rank, actions=s.actions)


SPEC = RuleSpec(
    "thresholds",
    RuleSettings,
    _build,
    doc="a metric crosses its `callback.params.warn_on_value` limit (a bare number: upper bound; lower for throughput)",
)
