"""The layers' histograms of weights and gradients as a chart draws them: layers x bins of one recorded step.

Example::

    import mindwatch
    from mindwatch.analysis.histograms import histogram_grid
    run = mindwatch.open_run("monitor_output/gpt/run_20261129_074500")
    steps, hist = run.layer_histograms()
    grid = histogram_grid(steps, hist, "weights")       # the last recorded step
    grid.step, grid.bins[:2], grid.values[:1]           # 300, ['-0.97', '-0.91'], [[0, 2, 14.0]]

The store keeps, per layer and step, the counts of equal bins over ``[-max|x|, max|x|]`` and ``max|x|``
(:class:`~mindwatch.store.layerfiles.LayerHistograms`); a bin's label is its centre as a fraction of
the layer's ``max|x|``. The report and the dashboard's ``/api/histograms`` both draw this grid.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

from mindwatch.store.layerfiles import LayerHistograms

#: What a histogram counts: each layer's weights, or its gradients.
Kind = Literal["weights", "grads"]
KINDS: tuple[Kind, ...] = ("weights", "grads")


@dataclass(frozen=True)
class HistogramGrid:
    """One step's histograms of one kind: ``values`` holds ``[bin, layer, count]`` for every count above 0."""

    step: int
    kind: Kind
    #: Each bin's centre as a fraction of its layer's max|value| (``-0.97`` ... ``+0.97``).
    bins: list[str]
    layers: list[str]
    values: list[list[float]]
    #: Each layer's max|value|: what a bin's fraction is of.
    tops: list[float]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def histogram_grid(steps: np.ndarray, hist: LayerHistograms | None, kind: Kind, row: int = -1) -> HistogramGrid | None:
    """The histograms of ``kind`` at row ``row`` (default: the last recorded step) of ``run.layer_histograms()``."""
    if hist is None or not len(steps):
        return None
    k = KINDS.index(kind)
    counts = hist.data[row, k, :, :-1]
    edges = np.linspace(-1, 1, hist.bins + 1)
    return HistogramGrid(
        step=int(steps[row]),
        kind=kind,
        bins=[f"{c:+.2f}" for c in (edges[:-1] + edges[1:]) / 2],
        layers=list(hist.layers),
        values=[[b, j, float(counts[j, b])] for j in range(counts.shape[0]) for b in range(counts.shape[1]) if counts[j, b] > 0],
        tops=[float(t) for t in hist.data[row, k, :, -1]],
    )
