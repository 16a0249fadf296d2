"""Over-fitting: the primary evaluation metric stopped improving while the train loss kept falling.

Example::

    evaluation: {primary: eval/loss, mode: min}
    alerts: {overfitting: {patience: 3, min_delta: 0.0}}     # on by default, no action

An evaluation *improves* when its primary metric beats the best so far by more than ``min_delta`` (``base.Progress``,
the count the early-stopping rule keeps too). The rule fires when ``patience`` evaluations in a row did not improve
and, over the same span, the train loss fell: the mean train loss recorded since the best evaluation is below the
mean recorded between the evaluation before the best and the best. It is raised once per best, on rank 0 (in a
multi-rank run rank 0 judges its own evaluation), and names the best evaluation, the current one and the train loss's
change.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import Field

from mindwatch import metrics as vocab
from mindwatch.alerts.alert import Alert
from mindwatch.alerts.rules.base import (
    Evaluation,
    Progress,
    Record,
    RuleBase,
    RuleContext,
    RuleSpec,
    evaluation_of,
    not_improved,
    value_of,
)
from mindwatch.schema import RuleSettings
from mindwatch.units import format_number


class OverfittingSettings(RuleSettings):
    #: Evaluations in a row that did not improve on the best.
    patience: int = Field(default=3, ge=1)
    #: An evaluation improves when it beats the best by more than this.
    min_delta: float = Field(default=0.0, ge=0)


class OverfittingRule(RuleBase):
    """The primary evaluation metric stopped improving while the train loss kept falling (see the module docstring)."""

    name = "overfitting"

    def __init__(self, settings: OverfittingSettings, evaluation: Any = None, *, rank: int = 0) -> None:
        super().__init__(rank, settings.actions)
        self.settings = settings
        self.evaluation = evaluation
        self.primary: str | None = None
        self.progress: Progress | None = None
        # the train loss: since the last evaluation, between the evaluation before the best and the best, since the best
        self._interval = [0.0, 0]
        self._before_best: float | None = None
        self._since_best = [0.0, 0]
        self._raised_for: Evaluation | None = None

    def check(self, rec: Record) -> list[Alert]:
        loss = value_of(rec, vocab.LOSS)
        if loss is not None and math.isfinite(loss):
            self._interval[0] += loss
            self._interval[1] += 1
        if self.primary is None:
            self.primary = vocab.eval_primary(rec, self.evaluation.primary)
            if self.primary is None:
                return []
            self.progress = Progress(vocab.eval_mode(self.primary, self.evaluation.mode), self.settings.min_delta)
        ev = evaluation_of(rec, self.primary)
        if ev is None:
            return []
        progress = self.progress
        assert progress is not None
        total, n = self._interval
        self._interval = [0.0, 0]
        if progress.add(ev):
            self._before_best = total / n if n else None
            self._since_best = [0.0, 0]
            return []
        self._since_best[0] += total
        self._since_best[1] += n
        if progress.waited < self.settings.patience or self._raised_for is progress.best or self._before_best is None:
            return []
        since = self._since_best[0] / self._since_best[1] if self._since_best[1] else None
        if since is None or not since < self._before_best:
            return []
        self._raised_for = progress.best
        best = progress.best
        assert best is not None
        message = (
            f"over-fitting: {not_improved(self.primary, progress)}; now {format_number(ev.value)} at {ev.where()}, while "
            f"the train loss fell from a mean of {format_number(self._before_best)} to {format_number(since)}"
        )
        return [
            self._alert(
                rec,
                message,
                metric=self.primary,
                value=ev.value,
                threshold=best.value,
                best_step=best.step,
                best_epoch=best.epoch,
                train_loss_before=self._before_best,
                train_loss_since=since,
            )
        ]


def _build(s: OverfittingSettings, ctx: RuleContext) -> list[OverfittingRule]:
    # in a multi-rank run rank 0 judges (docs/evaluation.md); a rank alone is rank 0
    return [OverfittingRule(s, ctx.evaluation, rank=ctx.rank)] if ctx.rank == 0 else []


SPEC = RuleSpec(
    "overfitting",
    OverfittingSettings,
    _build,
    doc="the primary evaluation metric has not improved for `patience` evaluations while the train loss fell",
)
