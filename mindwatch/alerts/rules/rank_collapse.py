"""A weight matrix whose stable rank collapses: below its own rolling median / ``factor``.

Example::

    alerts: {rank_collapse: {factor: 2.0, window: 10, warmup: 5, count: 2}}

The stable rank (``stable_rank/<parameter>``, ||W||_F^2 / sigma_max^2, every ``layers.stable_rank_every`` steps:
docs/layers.md) counts how many directions carry a weight's norm. Training usually moves it slowly; a weight whose
stable rank falls to a fraction of its recent values has let one direction take over (a rank collapse: the layer
stopped using its width, often before the loss shows it). Each weight is judged against its own measurements, so a
small matrix and a wide one need no common threshold. One alert per streak.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from mindwatch import metrics as vocab
from mindwatch.alerts.alert import Alert
from mindwatch.alerts.rules.base import Record, RuleBase, RuleContext, RuleSpec, Streak, settings_from, value_of
from mindwatch.schema import RuleSettings
from mindwatch.units import format_change, format_number

_PREFIX = f"{vocab.STABLE_RANK}/"


class RankCollapseSettings(RuleSettings):
    #: Fires when a weight's stable rank is below its rolling median / ``factor``.
    factor: float = Field(default=2.0, gt=1)
    #: Measurements in the rolling median.
    window: int = Field(default=10, ge=1)
    #: Measurements of a weight before it is judged: a freshly initialised matrix's stable rank falls fast in the
    #: first steps (from a random matrix's, half its smaller side, to what training makes of it), which is no collapse.
    warmup: int = Field(default=5, ge=1)
    #: Collapsed measurements in a row before it fires (a collapsed weight stays collapsed; one low value is noise).
    count: int = Field(default=2, ge=1)


class RankCollapseRule(RuleBase):
    """``stable_rank/<parameter>`` below its own rolling median / ``factor`` for ``count`` measurements in a row."""

    name = "rank_collapse"

    def __init__(self, settings: RankCollapseSettings | None = None, *, rank: int = 0, **values: Any) -> None:
        s = settings_from(RankCollapseSettings, settings, values)
        super().__init__(rank, s.actions)
        self.settings = s
        self._streaks: dict[str, Streak] = {}

    def check(self, rec: Record) -> list[Alert]:
        s = self.settings
        collapsed = lambda v, median: v < median / s.factor  # noqa: E731
        out = []
        for key in rec:
            if not key.startswith(_PREFIX):
                continue
            v = value_of(rec, key)
            if v is None:
                continue
            streak = self._streaks.get(key)
            if streak is None:
                streak = self._streaks[key] = Streak(s.window, s.warmup, s.count)
            median = streak.feed(v, collapsed)
            if median is None:
                continue
            weight = key[len(_PREFIX) :]
            msg = (
                f"the stable rank of {weight} fell to {format_number(v)} ({format_change(v / median - 1, 'its rolling median')} "
                f"{format_number(median)}, below 1/{format_number(s.factor)} of it): a few directions now carry this "
                "weight's norm"
            )
            out.append(self._alert(rec, msg, metric=key, value=v, threshold=median / s.factor, weight=weight))
        return out


def _build(s: RankCollapseSettings, ctx: RuleContext) -> list[RankCollapseRule]:
    return [RankCollapseRule(s, rank=ctx.rank)]


SPEC = RuleSpec(
    "rank_collapse",
    RankCollapseSettings,
    _build,
    doc="a weight's stable rank (`stable_rank/<parameter>`) below its own rolling median / `factor`",
)
