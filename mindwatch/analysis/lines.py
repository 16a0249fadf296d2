"""A series as every line chart receives it: ``[[x, y], ...]`` thinned to a budget, its non-finite points apart.

This module owns the series' wire shape, ``{"points": [[x, y | null], ...], "nonfinite": [[x, "nan"], ...]}``
(:meth:`LinePoints.wire`): ``/api/series``, ``/api/compare`` and the report send it as it is, and
``assets/charts.js`` draws it. The live stream sends the new rows of a metrics file instead
(``[step, time, value]``: both x's, as the file holds them); ``static/merge.js`` appends them to that shape.

Example::

    from mindwatch.analysis.lines import line_points
    s = run.series("loss", rank=0)
    line = line_points(s.step, s.value, budget=2000)
    line.points        # [[1, 2.3], [2, None], ...]: None where the value is NaN/Inf (a gap in the line)
    line.nonfinite     # [(2, nan)]: where those are, with their values, for the chart's markers

The dashboard's API (``/api/series``) and the report build their curves with it, so a curve has
the same points in both; ``assets/charts.js`` draws ``points`` as they come.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mindwatch.analysis.downsample import keep_extremes
from mindwatch.store.jsonl import encode_number


@dataclass
class LinePoints:
    """What a chart draws of one series (see the module docstring)."""

    points: list[list[Any]]
    #: ``(x, value)`` of each non-finite point kept (every one, up to :data:`~mindwatch.analysis.downsample.MAX_NON_FINITE`).
    nonfinite: list[tuple[Any, float]] = field(default_factory=list)
    #: Points before thinning, and whether thinning left some out.
    total: int = 0
    thinned: bool = False

    def wire(self, nonfinite_cap: int | None = None) -> dict[str, Any]:
        """The series' wire shape (see the module docstring); at most ``nonfinite_cap`` non-finite marks."""
        marks = self.nonfinite if nonfinite_cap is None else self.nonfinite[:nonfinite_cap]
        return {"points": self.points, "nonfinite": [[at, encode_number(v)] for at, v in marks]}


def branch_points(x: np.ndarray, y: np.ndarray, starts: np.ndarray, budget: int) -> list[list[Any]]:
    """The points of abandoned branches (the steps a rewind went back over), each thinned like a line, one after the
    other with ``[x, None]`` between (a gap). ``starts``: the index in ``x`` where each branch begins."""
    out: list[list[Any]] = []
    bounds = [*starts.tolist(), len(x)]
    share = max(2, budget // max(1, len(bounds) - 1))
    for a, b in zip(bounds, bounds[1:], strict=False):
        if out:
            out.append([out[-1][0], None])
        out.extend(line_points(x[a:b], y[a:b], share).points)
    return out


def line_points(x: np.ndarray, y: np.ndarray, budget: int) -> LinePoints:
    """``x``/``y`` thinned to ``budget`` points keeping each bucket's min and max and every non-finite value."""
    idx = keep_extremes(x, y, budget)
    xs, ys = x[idx].tolist(), y[idx].tolist()
    points = [[a, b if math.isfinite(b) else None] for a, b in zip(xs, ys, strict=True)]
    nonfinite = [(a, b) for a, b in zip(xs, ys, strict=True) if not math.isfinite(b)]
    return LinePoints(points, nonfinite, total=len(y), thinned=len(idx) < len(y))
