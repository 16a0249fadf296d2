"""A step whose update ``skip_steps`` skipped, and too many of them in a row.

Example::

    skip_steps: {enabled: true, sigma: 6, max_consecutive: 5, actions: [checkpoint, stop]}

The decision is made inside the train step's graph (``mindwatch.mindspore.skip_step``); this rule reads its
outcome, the record's ``skipped``, on the training thread (so the actions of ``max_consecutive`` skips in a
row act on that very step). Its settings are ``monitor_config.skip_steps``, not a section of ``alerts``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from mindwatch import metrics as vocab
from mindwatch.alerts.alert import Alert
from mindwatch.alerts.rules.base import Record, RuleBase, settings_from, value_of
from mindwatch.schema import RuleSettings

if TYPE_CHECKING:
    _SkipMetric = str
else:  # the names as a Literal: the error lists them
    _SkipMetric = Literal[vocab.SKIP_METRICS]


class SkipStepsSettings(RuleSettings):
    """``monitor_config.skip_steps``: skip the update of a step whose metric is far above its rolling mean."""

    enabled: bool = False
    #: A step is skipped when its metric is more than ``sigma`` standard deviations above the rolling mean ...
    sigma: float = Field(default=6.0, gt=0)
    #: ... of the last ``window`` values that were not skipped ...
    window: int = Field(default=128, ge=2)
    #: ... once ``warmup`` values entered the statistics.
    warmup: int = Field(default=20, ge=2)
    metric: _SkipMetric = vocab.GRAD_NORM
    #: Skips in a row that fire ``actions`` (with a ``skip`` alert of severity error).
    max_consecutive: int = Field(default=5, ge=1)


class SkipRule(RuleBase):
    """A ``skip`` alert for each skipped step; ``max_consecutive`` in a row: one more, with the actions."""

    name = "skip"

    def __init__(self, settings: SkipStepsSettings | None = None, *, rank: int = 0, **values: Any) -> None:
        s = settings_from(SkipStepsSettings, settings, values)
        super().__init__(rank, s.actions)
        self.metric, self.sigma, self.max_consecutive = s.metric, s.sigma, s.max_consecutive
        self.in_a_row = 0
        self._last_skipped: Any = None

    def check(self, rec: Record) -> list[Alert]:
        if not value_of(rec, vocab.SKIPPED):
            return []
        step = rec.get("step")
        # a record is made of every skipped step, not of every step: in a row means consecutive step numbers
        consecutive = isinstance(step, int) and self._last_skipped == step - 1
        self.in_a_row = self.in_a_row + 1 if consecutive else 1
        self._last_skipped = step
        v = value_of(rec, self.metric)
        shown = f" ({self.metric} {v:.4g})" if v is not None else ""
        above = f"more than {self.sigma:g} standard deviations above its rolling mean{shown}"
        msg = f"step {step} was skipped: its {self.metric} was {above}"
        alerts = [self._alert(rec, msg, metric=self.metric, value=v, actions=[], in_a_row=self.in_a_row)]
        if self.in_a_row == self.max_consecutive:
            alerts.append(
                self._alert(
                    rec,
                    f"{self.in_a_row} steps in a row were skipped (up to step {step})",
                    metric=self.metric,
                    value=v,
                    severity="error",
                    in_a_row=self.in_a_row,
                )
            )
        return alerts
