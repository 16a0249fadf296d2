"""Which steps measure the layers, and their statistics into the step's record (training thread).

Example::

    watch = LayerWatch(LayerGrouping(names), every=10, histogram_every=100, bins=32)
    measure, histograms = watch.plan(step, first=False)   # before the step: what it measures
    watch.add(rec, squares, hist)                           # after it: layer_stats (+ layer_histograms)

Both front doors share it: ``MonitorCallback`` gets the squared sums from the train cell's outputs
(:mod:`mindwatch.mindspore.layer_stats`), ``Run.step`` computes them from the gradients and the weights
(:mod:`mindwatch.mindspore.reduction`). The first step is measured too, so a graph that measures
compiles with the first step and not ``every`` steps into the run.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mindwatch.metrics import LOCAL_GRAD_NORM
from mindwatch.mindspore.layer_stats import LayerGrouping
from mindwatch.store.layerfiles import HISTOGRAM_KEY, LAYER_KEY, LayerHistograms, LayerRow


class LayerWatch:
    """The per-layer schedule (``layers.every``, ``layers.histogram_every``) and the recording of a measured step."""

    def __init__(
        self,
        grouping: LayerGrouping,
        *,
        every: int,
        histogram_every: int | None,
        bins: int,
        stats: tuple[str, ...] = (),
        local: bool = False,
        grads_every_step: bool = True,
        moments_settle: int = 0,
    ) -> None:
        """``stats``: what a row holds (default: the measured three); ``local``: its gradient norms are this rank's own
        (:class:`~mindwatch.store.layerfiles.LayerRow`)."""
        self.grouping = grouping
        self.stats, self.local = stats, local
        #: Every step's output holds its gradients' squared sums (our train cells), not only a measured step's.
        self.grads_every_step = grads_every_step
        #: The step from which the optimizer's moments are a baseline (:func:`~.layer_stats.moments_settle_steps`).
        self.moments_settle = moments_settle
        self.every = every
        #: Histograms every N steps; None: none (or the cell cannot take them).
        self.histogram_every = histogram_every if bins else None
        self.bins = bins
        #: What the step being run measures: the weights and updates, the histograms.
        self.measuring = False
        self.histograms = False

    @property
    def layers(self) -> tuple[str, ...]:
        return self.grouping.layers

    def plan(self, step: int, *, first: bool) -> tuple[bool, bool]:
        """What global step ``step`` measures (``(weights and updates, histograms)``); remembered for :meth:`add`."""
        hist = self.histogram_every is not None and step % self.histogram_every == 0
        self.measuring = first or hist or step % self.every == 0
        self.histograms = hist
        return self.measuring, hist

    def live_settings(self) -> dict[str, Any]:
        """``layers.every`` and ``layers.histogram_every`` for ``mindwatch set``: each takes effect from the next step."""

        def every(n: Any) -> None:
            self.every = int(n)

        def histogram_every(n: Any) -> None:
            if not self.bins:
                raise ValueError("layers.histogram_every can change only when histograms were on at train begin")
            self.histogram_every = int(n)

        return {"layers.every": every, "layers.histogram_every": histogram_every}

    def histograms_off(self) -> None:
        """Go on without histograms (a train cell compiled without them)."""
        self.histogram_every, self.histograms = None, False

    def add(self, rec: dict[str, Any], squares: np.ndarray | None, hist: np.ndarray | None = None) -> None:
        """The step's statistics from ``(3, parameters)`` squared sums (gradients, weights, updates; ``(1, parameters)``:
        the gradients' alone); on a NaN/Inf gradient norm the first layer that had it (``nonfinite_layer``), measured
        step or not."""
        if squares is None:
            return
        if self.measuring:
            stats = self.grouping.stats(squares, local=LOCAL_GRAD_NORM in self.stats)
            settled = rec.get("step", 0) >= self.moments_settle
            rec[LAYER_KEY] = LayerRow(self.grouping.layers, stats, self.stats, self.local, moments_settled=settled)
        if self.histograms and hist is not None:
            rec[HISTOGRAM_KEY] = LayerHistograms(self.grouping.layers, hist)
        if not math.isfinite(rec.get("grad_norm", 0.0)) and (layer := self.grouping.first_nonfinite(squares[0])) is not None:
            rec["nonfinite_layer"] = layer

    def wanted(self, rec: dict[str, Any]) -> bool:
        """Whether this step's squared sums are worth reading: a measured step, or a NaN/Inf gradient norm to trace
        (where every step has its gradients' squared sums, ``grads_every_step``)."""
        if self.measuring or self.histograms:
            return True
        return self.grads_every_step and not math.isfinite(rec.get("grad_norm", 0.0))
