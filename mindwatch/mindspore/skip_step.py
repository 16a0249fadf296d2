"""Skip the update of a bad step inside the graph, with no host sync: ``SkipDecision`` and, for a loop of your
own, ``SkipStep`` (called in place of ``optimizer(grads)``).

Example::

    import mindwatch.mindspore as mw

    run = mw.start_run({"skip_steps": {"enabled": True}}, network=net, optimizer=optimizer)
    skip_step = mw.SkipStep(optimizer, run=run)   # the run's skip_steps: sigma 6, window 128, warmup 20 by default

    @ms.jit
    def train_step(x, y):
        loss, grads = grad_fn(x, y)
        skipped = skip_step(grads)            # applies the update unless the gradient norm is a 6-sigma outlier
        return loss, grads, skipped

    loss, grads, skipped = train_step(x, y)
    run.step(loss=loss, grads=grads, skipped=skipped)

The statistics are a window: the last ``window`` values that were not skipped, in a ring buffer Parameter;
their mean and (sample) standard deviation decide. A skipped value, and a NaN/Inf one, never enters them.
Our train cells (``TrainOneStepWithGradNorm``, ``...AndLossScale``) hold a ``SkipDecision`` when the
callback switches ``skip_steps`` on at train begin (:meth:`~mindwatch.mindspore.train_step._LayerStatsStep.skip_steps`).
"""

from __future__ import annotations

import logging
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from mindwatch import metrics as vocab
from mindwatch.alerts.skip import SkipStepsSettings
from mindwatch.mindspore.layer_stats import squares

log = logging.getLogger("mindwatch")


class SkipDecision(nn.Cell):
    """``decision(value)``: True when ``value`` is more than ``sigma`` standard deviations above the mean of the
    last ``window`` values (after ``warmup`` of them); a value that is not skipped (and finite) joins them."""

    def __init__(self, sigma: float, window: int, warmup: int) -> None:
        super().__init__()
        self.window = int(window)
        zeros = ms.Tensor(np.zeros(self.window, np.float32))
        self.values = ms.Parameter(zeros, name="mindwatch_skip_values", requires_grad=False)
        self.count = ms.Parameter(ms.Tensor(0, ms.int32), name="mindwatch_skip_count", requires_grad=False)
        self.sigma = ms.Parameter(ms.Tensor(float(sigma), ms.float32), name="mindwatch_skip_sigma", requires_grad=False)
        self.warmup = ms.Parameter(ms.Tensor(int(warmup), ms.int32), name="mindwatch_skip_warmup", requires_grad=False)
        self.slots = ms.Tensor(np.arange(self.window, dtype=np.int32))

    def construct(self, value, passing=None):
        value = ops.cast(ops.reduce_mean(value), ms.float32)
        count = self.count
        n = ops.cast(ops.minimum(count, self.window), ms.float32)
        filled = ops.cast(self.slots < ops.minimum(count, self.window), ms.float32)
        mean = ops.reduce_sum(self.values * filled) / ops.maximum(n, 1.0)
        var = ops.reduce_sum(ops.square((self.values - mean) * filled)) / ops.maximum(n - 1.0, 1.0)
        finite = ops.isfinite(value)
        above = value > mean + self.sigma * ops.sqrt(var)
        skip = ops.logical_and(ops.logical_and(finite, count >= self.warmup), above)
        keep = ops.logical_and(finite, ops.logical_not(skip))
        if passing is not None:  # a batch a rewind passes over: its value is not one of the training's
            keep = ops.logical_and(keep, ops.logical_not(passing))
        put = ops.logical_and(self.slots == count % self.window, keep)
        ops.assign(self.values, ops.select(put, ops.ones_like(self.values) * value, self.values))
        ops.assign(self.count, count + ops.cast(keep, ms.int32))
        return skip


def skip_decision(settings: SkipStepsSettings) -> SkipDecision:
    """The decision cell of ``skip_steps``' settings."""
    return SkipDecision(settings.sigma, settings.window, settings.warmup)


class SkipStep(nn.Cell):
    """``optimizer(grads)`` unless the step's gradient norm (or its loss, ``metric="loss"``) is an outlier.

    Example::

        skip_step = SkipStep(optimizer, run=run)   # the settings of the run's config, skip_steps (written once)
        skipped = skip_step(grads)                 # inside your jit step; or skip_step(grads, loss) with metric="loss"

    Returns ``skipped``, 1.0 when the update was skipped, else 0.0; pass it to ``run.step(skipped=...)``. The
    settings are ``monitor_config.skip_steps``': the run's (``run=``, a :class:`~mindwatch.mindspore.Run`), else
    ``settings`` or keywords (checked the same way; ``SkipStep(optimizer)``: the defaults, on). Keywords beside
    ``run=`` must agree with the run's config (a ``ValueError`` names the key that does not). With ``skip_steps``
    off (``enabled: false``) every update is applied and ``skipped`` is 0. A gradient with a NaN/Inf norm is never
    applied.
    """

    def __init__(
        self, optimizer: nn.Optimizer, settings: SkipStepsSettings | None = None, *, run: Any = None, **values: Any
    ) -> None:
        super().__init__()
        s = skip_step_settings(settings, run, values)
        self.optimizer = optimizer
        self.by_loss = s.metric == vocab.LOSS
        #: None: ``skip_steps`` is off, every update is applied (a branch the graph compiler resolves).
        self.decision = skip_decision(s) if s.enabled else None
        if self.decision is None:
            log.warning(
                "mindwatch: skip_steps.enabled is false: SkipStep applies every update "
                "(skip_steps: {enabled: true} in the run's config switches it on)"
            )
        self.not_skipped = ms.Tensor(0.0, ms.float32)

    def construct(self, grads, loss=None):
        if self.decision is None:
            return ops.depend(self.not_skipped, self.optimizer(grads))
        norm = ops.sqrt(ops.reduce_sum(squares(grads)))
        skip = self.decision(loss if self.by_loss else norm)
        skipped = ops.cast(skip, ms.float32)
        if ops.logical_and(ops.isfinite(norm), ops.logical_not(skip)):
            skipped = ops.depend(skipped, self.optimizer(grads))
        return skipped


def skip_step_settings(settings: SkipStepsSettings | None, run: Any, values: dict[str, Any]) -> SkipStepsSettings:
    """:class:`SkipStep`'s settings: ``run``'s config (keywords must agree with it), else ``settings`` or keywords."""
    if run is None:
        if settings is not None and values:
            raise TypeError(f"SkipStep takes settings or keywords, not both (got settings and {sorted(values)})")
        return settings if settings is not None else SkipStepsSettings(**{"enabled": True, **values})
    if settings is not None:
        raise TypeError("SkipStep takes its settings from run= or from settings=, not both")
    configured: SkipStepsSettings = run.config.skip_steps
    given = SkipStepsSettings(**{**configured.model_dump(), **values})  # the keywords checked as the config is
    for key in values:
        if getattr(given, key) != getattr(configured, key):
            raise ValueError(
                f"SkipStep({key}={values[key]!r}) disagrees with the run's config, skip_steps.{key}: "
                f"{getattr(configured, key)!r}. Write it once, in the config's skip_steps, and build "
                "SkipStep(optimizer, run=run)"
            )
    return configured
