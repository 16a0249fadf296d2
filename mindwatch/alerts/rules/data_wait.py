"""The input pipeline as the bottleneck: the step waits for data more than a share of its time.

Example::

    alerts: {data_wait: {limit: 0.5, count: 5}}
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from mindwatch.alerts.alert import Alert
from mindwatch.alerts.rules.base import Record, RuleBase, RuleContext, RuleSpec, data_share, settings_from
from mindwatch.schema import RuleSettings


class DataWaitSettings(RuleSettings):
    #: Fires when ``data_time / step_time`` is above ``limit``.
    limit: float = Field(default=0.5, gt=0, le=1)
    warmup: int = Field(default=5, ge=0)
    count: int = Field(default=5, ge=1)


class DataWaitRule(RuleBase):
    """``data_time / step_time`` above ``limit`` for ``count`` records in a row: the input pipeline is the bottleneck."""

    name = "data_wait"

    def __init__(self, settings: DataWaitSettings | None = None, *, rank: int = 0, **values: Any) -> None:
        """``settings`` as ``alerts.data_wait`` validated them; keywords (``DataWaitRule(limit=0.4)``) are
        validated the same way."""
        s = settings_from(DataWaitSettings, settings, values)
        super().__init__(rank, s.actions)
        self.limit, self.warmup, self.count = s.limit, s.warmup, s.count
        self.seen = 0
        self.run = 0

    def check(self, rec: Record) -> list[Alert]:
        share = data_share(rec)
        if share is None:
            return []
        self.seen += 1
        if self.seen <= self.warmup:
            return []
        if share <= self.limit:
            self.run = 0
            return []
        self.run += 1
        if self.run != self.count:
            return []
        msg = (
            f"the step waits for data {100 * share:.0f} % of its time (limit {100 * self.limit:.0f} %): "
            "the input pipeline, not the model, is the bottleneck (more workers, prefetch, faster storage)"
        )
        return [self._alert(rec, msg, metric="data_time", value=share, threshold=self.limit)]


def _build(s: DataWaitSettings, ctx: RuleContext) -> list[DataWaitRule]:
    return [DataWaitRule(s, rank=ctx.rank)]


SPEC = RuleSpec("data_wait", DataWaitSettings, _build, doc="`data_time / step_time` above `limit` for `count` records in a row")
