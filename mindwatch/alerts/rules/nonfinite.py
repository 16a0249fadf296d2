"""NaN or Inf in the loss or the gradient norm.

Example::

    alerts: {nonfinite: {actions: [stop]}}      # with actions, the callback checks on the training thread

    checked_in_step(config.alerts)              # ("loss", "grad_norm"): what the training thread checks then
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from pydantic import Field

from mindwatch import metrics as vocab
from mindwatch.alerts.alert import Alert
from mindwatch.alerts.rules.base import Record, RuleBase, RuleContext, RuleSpec, settings_from, value_of
from mindwatch.schema import RuleSettings


class NonFiniteSettings(RuleSettings):
    #: NaN/Inf in these metrics; checked on the training thread, so ``stop`` acts on the same step.
    metrics: list[str] = Field(default_factory=lambda: list(vocab.TRAINING_SIGNALS))


class NonFiniteRule(RuleBase):
    """NaN or Inf in ``metrics``. On a loss-scale overflow step (a scale above 1) an infinite grad_norm is expected and
    ignored; an overflow at a scale of 1 or none is no scaling's: a loss that went NaN/Inf, maybe another rank's,
    whose gradients every rank shares after the all-reduce."""

    name = "nonfinite"
    severity = "error"

    def __init__(
        self, metrics: Iterable[str] | None = None, settings: NonFiniteSettings | None = None, *, rank: int = 0, **values: Any
    ) -> None:
        """``metrics``: those of ``settings`` this rule watches (default: all of them); ``settings`` as ``alerts.nonfinite``
        validated them, or keywords (``NonFiniteRule(actions=["stop"])``) validated the same way."""
        s = settings_from(NonFiniteSettings, settings, values)
        super().__init__(rank, s.actions)
        self.metrics = tuple(s.metrics if metrics is None else metrics)

    def check(self, rec: Record) -> list[Alert]:
        for metric in self.metrics:
            v = value_of(rec, metric)
            if v is None or math.isfinite(v):
                continue
            if metric != "loss" and scaling_overflow(rec):
                continue  # the loss-scale cell skipped this update on purpose
            layer = rec.get("nonfinite_layer")  # the first layer whose gradient went NaN/Inf (per-layer statistics)
            if isinstance(layer, str):
                msg = f"{metric} is {v} at step {rec.get('step')}; the first layer with a NaN/Inf gradient is {layer}"
                return [self._alert(rec, msg, metric=metric, value=v, layer=layer)]
            return [self._alert(rec, f"{metric} is {v} at step {rec.get('step')}", metric=metric, value=v)]
        return []


def scaling_overflow(rec: Record) -> bool:
    """Whether ``rec``'s step overflowed because of its loss scale: an overflow at a scale above 1, which the scale's
    next decrease cures. MindFormers' wrappers report ``overflow`` with a scale of 1 when the gradients are NaN/Inf
    (bf16 training, no scaling): that is the training's own non-finite value, on every rank at once."""
    scale = value_of(rec, vocab.LOSS_SCALE)
    return bool(rec.get("overflow")) and (scale is None or scale > 1)


def checked_in_step(alerts: Any) -> tuple[str, ...]:
    """The metrics a front door that checks on the training thread (the MindSpore adapter) checks for NaN/Inf, from
    ``alerts`` (``monitor_config.alerts``): loss and grad_norm when this rule is on and asks for actions (so ``stop``
    acts on the very step), else none (the worker checks)."""
    return _in_step(alerts.nonfinite) if alerts.enabled and alerts.nonfinite.enabled else ()


def _in_step(s: NonFiniteSettings) -> tuple[str, ...]:
    return tuple(m for m in vocab.TRAINING_SIGNALS if m in s.metrics) if s.actions else ()


def _build(s: NonFiniteSettings, ctx: RuleContext) -> list[NonFiniteRule]:
    checked = _in_step(s) if ctx.checks_in_step else ()
    left = [m for m in s.metrics if m not in checked]
    return [NonFiniteRule(left, s, rank=ctx.rank)] if left else []


SPEC = RuleSpec(
    "nonfinite",
    NonFiniteSettings,
    _build,
    doc="NaN or Inf in `metrics` (an infinite grad_norm on a loss-scale overflow step, at a scale above 1, is expected "
    "and ignored)",
)
