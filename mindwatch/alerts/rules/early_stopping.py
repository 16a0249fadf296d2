"""Early stopping: stop (``actions``, default ``[stop]``) after ``patience`` evaluations in a row that did not improve
on the best, as MindSpore's ``EarlyStopping`` and Keras count (``base.Progress``).

Example::

    alerts: {early_stopping: {patience: 5, min_delta: 0.0, restore_best: true}}    # off unless given

The training thread judges it (``mindwatch/mindspore/evaluation.py``), at the end of the evaluation that decides it,
on every rank alike from the value the ranks agreed on; its actions are carried out at that boundary, so no further
training step or evaluation runs. ``restore_best`` puts the best evaluation's weights back before the run ends.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from mindwatch.alerts.rules.base import RuleSpec
from mindwatch.schema import Action, RuleSettings


class EarlyStoppingSettings(RuleSettings):
    """Off unless given (``early_stopping: {}`` switches it on); ``actions`` default to ``[stop]``."""

    enabled: bool = False
    actions: list[Action] = Field(default_factory=lambda: list[Action](["stop"]))
    patience: int = Field(default=5, ge=1)
    min_delta: float = Field(default=0.0, ge=0)
    #: Put the best evaluation's weights back before the run ends (a host-memory copy taken at each new best).
    restore_best: bool = False


def early_stopping_given(alerts: Any) -> Any:
    """``alerts`` as given, with ``early_stopping`` switched on where it is given without ``enabled``
    (``early_stopping: {patience: 3}`` means on; its default is off)."""
    given = alerts.get("early_stopping") if isinstance(alerts, dict) else None
    if given is None:
        return alerts
    if isinstance(given, dict) and "enabled" not in given:
        return {**alerts, "early_stopping": {**given, "enabled": True}}
    return alerts


SPEC = RuleSpec(
    "early_stopping",
    EarlyStoppingSettings,
    None,  # the training thread judges it, at the evaluation's end (mindwatch/mindspore/evaluation.py)
    doc="stop (`actions`) after `patience` evaluations that did not improve on the best; `restore_best` puts its weights back",
)
