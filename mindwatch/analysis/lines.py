"""A series as every line chart receives it: ``[[x, y], ...]`` thinned to a budget, its non-finite points apart.

This module owns the series' wire shape, ``{"points": [[x, y | null], ...], "nonfinite": [[x, "nan"], ...]}``
(:meth:`LinePoints.wire`): ``/api/series``, ``/api/compare`` and the report send it as it is, and
``assets/charts.js`` draws it. The live stream sends the new rows of a metrics file instead
(``[step, time, value]``: both x's, as the file holds them); ``static/series.js`` (``SeriesStore.append``) appends
them to that shape, with the same non-finite rule.

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
from mindwatch.store.columns import RankColumns
from mindwatch.store.jsonl import encode_number

#: What a series' x may be: the step, the wall-clock time (epoch seconds), or the seconds since the run began.
X_KINDS = ("step", "time", "elapsed")


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


@dataclass
class SeriesWindow:
    """One metric of one rank, in a window of x, as a chart draws it: its line, how many points it has in all and in
    the window, and the branches a rewind abandoned there (faint, behind the line; ``[]`` without a rewind)."""

    line: LinePoints
    total: int
    in_window: int
    abandoned: list[list[Any]]

    def wire(self, nonfinite_cap: int | None = None) -> dict[str, Any]:
        """The series' wire shape and the rest: ``{total, in_window, points, nonfinite, abandoned}``."""
        return {"total": self.total, "in_window": self.in_window, **self.line.wire(nonfinite_cap), "abandoned": self.abandoned}


def series_window(
    cols: RankColumns,
    metric: str,
    x: str = "step",
    lo: float | None = None,
    hi: float | None = None,
    points: int = 2000,
    origin: float = 0.0,
) -> SeriesWindow:
    """``metric`` of one rank's columns in ``[lo, hi]`` of ``x`` (:data:`X_KINDS`; ``elapsed`` counts from ``origin``,
    the run's start), thinned to ``points`` keeping each bucket's extremes, with its abandoned branches. The dashboard's
    ``/api/series`` and the report both draw a series from it."""
    line, value = cols.column(metric)
    xs = _x_of(cols, line, x, origin)
    total = len(xs)
    if lo is not None or hi is not None:
        inside = _inside(xs, lo, hi)
        xs, value = xs[inside], value[inside]
    abandoned = abandoned_points(cols, metric, line, x, lo, hi, points, origin) if cols.rewound else []
    return SeriesWindow(line_points(xs, value, points), total, int(len(xs)), abandoned)


def abandoned_points(
    cols: RankColumns,
    metric: str,
    kept: np.ndarray,
    x: str = "step",
    lo: float | None = None,
    hi: float | None = None,
    points: int = 2000,
    origin: float = 0.0,
) -> list[list[Any]]:
    """The values of ``metric`` that later steps replaced (a rewind's abandoned branches; ``kept``: the lines of the
    values kept, :meth:`~mindwatch.store.columns.RankColumns.column`'s), as gapped points (:func:`branch_points`)."""
    raw_line, raw_value = cols.raw_column(metric)
    gone = np.flatnonzero(~np.isin(raw_line, kept))
    if not len(gone):
        return []
    xs = _x_of(cols, raw_line[gone], x, origin)
    inside = _inside(xs, lo, hi)
    gone, xs, value = gone[inside], xs[inside], raw_value[gone][inside]
    if not len(xs):
        return []
    # a branch ends where the next abandoned value is not the next one written, or its step goes back
    starts = np.flatnonzero(np.r_[True, (np.diff(gone) != 1) | (np.diff(cols.steps[raw_line[gone]]) <= 0)])
    return branch_points(xs, value, starts, points)


def _x_of(cols: RankColumns, line: np.ndarray, x: str, origin: float) -> np.ndarray:
    if x == "step":
        return cols.steps[line]
    times = cols.time_of_lines(line)
    return times - origin if x == "elapsed" else times


def _inside(xs: np.ndarray, lo: float | None, hi: float | None) -> np.ndarray:
    keep = np.ones(len(xs), dtype=bool)
    if lo is not None:
        keep &= xs >= lo
    if hi is not None:
        keep &= xs <= hi
    return keep


def elapsed_origin(meta: dict[str, Any] | None, cols: RankColumns | None) -> float:
    """Where a run's elapsed time counts from, for every chart of it: its start (``meta.json``'s ``started_at``), else
    the time of its first record; 0 when it has neither."""
    started = (meta or {}).get("started_at")
    if isinstance(started, (int, float)):
        return float(started)
    if cols is not None and cols.lines:
        first = float(cols.time_of_lines(np.zeros(1, np.int64))[0])
        return first if math.isfinite(first) else 0.0
    return 0.0
