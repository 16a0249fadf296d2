"""The cross-rank view of a run, computed from the rank files (no collective in the training step).

Example::

    import mindwatch
    from mindwatch.analysis.bands import band, per_rank

    run = mindwatch.open_run("monitor_output/gpt/run_20261129_074500")
    b = band(run, "step_time")
    b.step, b.min, b.mean, b.max       # per step, across the ranks that recorded it
    b.argmax                           # which rank was slowest at each step
    lines = per_rank(run, "loss")      # {rank: Series}: one line per rank on the chart
    values, ranks = counted_values(run, "grad_norm")  # rank 0's alone: the same on every rank, counted once
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from mindwatch import metrics as vocab
from mindwatch.analysis.downsample import keep_extremes
from mindwatch.store.columns import RankColumns
from mindwatch.store.reader import Run, Series

#: The metrics the dashboard draws as a band across ranks and the rules compare across ranks.
CROSS_RANK_METRICS: tuple[str, ...] = vocab.banded()


@dataclass
class Band:
    """One metric across ranks, one entry per step that any rank recorded.

    ``min``/``mean``/``max`` are over the finite values of that step; ``argmin``/``argmax`` are
    rank numbers (-1 where no rank had a finite value); ``count`` is how many ranks had one.
    """

    metric: str
    ranks: list[int]
    step: np.ndarray
    min: np.ndarray
    mean: np.ndarray
    max: np.ndarray
    argmin: np.ndarray
    argmax: np.ndarray
    count: np.ndarray

    def __len__(self) -> int:
        return len(self.step)

    def complete(self) -> Band:
        """Only the steps every rank recorded (a live run's newest steps may miss the slower ranks)."""
        keep = self.count == len(self.ranks)
        return Band(self.metric, self.ranks, *(a[keep] for a in self._arrays()))

    def _arrays(self) -> tuple[np.ndarray, ...]:
        return self.step, self.min, self.mean, self.max, self.argmin, self.argmax, self.count

    def to_dict(self) -> dict[str, Any]:
        """Plain lists for JSON (non-finite values as None)."""

        def clean(a: np.ndarray) -> list[Any]:
            return [None if not np.isfinite(v) else float(v) for v in a]

        return {
            "metric": self.metric,
            "ranks": self.ranks,
            "step": self.step.tolist(),
            "min": clean(self.min),
            "mean": clean(self.mean),
            "max": clean(self.max),
            "argmin": self.argmin.tolist(),
            "argmax": self.argmax.tolist(),
            "count": self.count.tolist(),
        }

    def thinned(self, points: int = 2000) -> list[list[Any]]:
        """``[[step, min, mean, max], ...]`` thinned to about ``points`` steps, keeping each bucket's highest max and
        lowest min (a spike on one rank survives); None where no rank had a finite value. The band's wire shape."""
        half = max(points // 2, 10)
        idx = np.union1d(keep_extremes(self.step, self.max, half), keep_extremes(self.step, -self.min, half))
        rows = np.stack([self.min[idx], self.mean[idx], self.max[idx]], axis=1)
        clean = np.where(np.isfinite(rows), rows, np.nan).tolist()
        return [[s, *(None if v != v else v for v in r)] for s, r in zip(self.step[idx].tolist(), clean, strict=True)]

    def edge_ranks(self, k: int = 5) -> tuple[list[int], list[int]]:
        """The ``k`` ranks most often at the band's edge (its max or its min), most first, and how often: the ranks a
        per-rank overlay draws when a run has too many to draw them all. With 2 ranks every rank is an edge."""
        edges = np.concatenate([self.argmax[self.count > 2], self.argmin[self.count > 2]])
        edges = edges[edges >= 0]
        ranks, times = np.unique(edges, return_counts=True)
        order = np.lexsort((ranks, -times))[:k]
        return ranks[order].tolist(), times[order].tolist()


def per_rank(run: Run, metric: str) -> dict[int, Series]:
    """``{rank: Series}`` of ``metric`` for every rank that recorded it."""
    out = {}
    for rank in run.ranks:
        s = run.series(metric, rank)
        if len(s):
            out[rank] = s
    return out


def counted_values(run: Run, metric: str) -> tuple[np.ndarray, list[int]]:
    """The values of ``metric`` a distribution counts, and the ranks they come from: every rank's, but for a metric that
    is the same on every rank (``same`` in :mod:`mindwatch.metrics`: ``grad_norm``, ``lr``) the lowest rank's that
    recorded it, so that a shared value counts once, not once per rank."""
    series = per_rank(run, metric)
    known = vocab.get(metric)
    if known is not None and known.same_on_every_rank and series:
        lowest = min(series)
        series = {lowest: series[lowest]}
    values = np.concatenate([s.value for s in series.values()]) if series else np.empty(0, np.float64)
    return values, sorted(series)


def band(run: Run, metric: str) -> Band:
    """Per-step min / mean / max (and which rank) of ``metric`` across the ranks of ``run``."""
    return band_of(metric, per_rank(run, metric))


def bands(run: Run, metrics: Iterable[str] = CROSS_RANK_METRICS) -> dict[str, Band]:
    """:func:`band` of each metric some rank recorded."""
    names = set(run.metrics)
    return {m: band(run, m) for m in metrics if m in names}


def band_of_columns(metric: str, columns: Mapping[int, RankColumns]) -> Band:
    """:func:`band` from every rank's columns (the dashboard's views hold them)."""
    per_rank = {}
    for rank, cols in columns.items():
        line, value = cols.column(metric)
        if len(line):
            per_rank[rank] = Series(cols.steps[line], value, np.empty(0))
    return band_of(metric, per_rank)


def band_of(metric: str, series: dict[int, Series]) -> Band:
    """:func:`band` from ``{rank: Series}`` (for callers that hold the series already)."""
    ranks = sorted(series)
    if not ranks:
        empty_f, empty_i = np.empty(0, np.float64), np.empty(0, np.int64)
        return Band(metric, [], empty_i, empty_f, empty_f, empty_f, empty_i, empty_i, empty_i)
    steps, columns = _aligned(series, ranks)
    n = len(steps)
    count = np.zeros(n, np.int64)
    total = np.zeros(n)
    lo, hi = np.full(n, np.inf), np.full(n, -np.inf)
    argmin, argmax = np.full(n, -1, np.int64), np.full(n, -1, np.int64)
    # one vectorised pass per rank: a handful of ranks, many steps
    for rank, col in zip(ranks, columns, strict=True):
        finite = np.isfinite(col)
        count += finite
        total += np.where(finite, col, 0.0)
        lower = finite & (col < lo)  # strict: on a tie the lower rank stays, as numpy's argmin would
        lo, argmin = np.where(lower, col, lo), np.where(lower, rank, argmin)
        higher = finite & (col > hi)
        hi, argmax = np.where(higher, col, hi), np.where(higher, rank, argmax)
    none = count == 0
    lo[none] = hi[none] = np.nan
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = total / count
    mean[none] = np.nan
    return Band(metric, ranks, steps, lo, mean, hi, argmin, argmax, count)


def band_of_rows(metric: str, rows: np.ndarray, ranks: list[int]) -> Band:
    """A :class:`Band` from a band file's rows (:mod:`mindwatch.store.bandfiles`, written by rank 0)."""
    as_int = lambda name: rows[name].astype(np.int64)  # noqa: E731
    f64 = lambda name: rows[name].astype(np.float64)  # noqa: E731
    return Band(
        metric, ranks, as_int("step"), f64("min"), f64("mean"), f64("max"), as_int("argmin"), as_int("argmax"), as_int("count")
    )


def _aligned(series: dict[int, Series], ranks: list[int]) -> tuple[np.ndarray, list[np.ndarray]]:
    """The union of the ranks' steps and each rank's values on it (NaN where a rank has no record)."""
    first = series[ranks[0]].step
    increasing = len(first) < 2 or bool((np.diff(first) > 0).all())
    if increasing and all(np.array_equal(series[r].step, first) for r in ranks[1:]):
        return first.astype(np.int64), [series[r].value.astype(np.float64) for r in ranks]  # the common case: lock-step ranks
    steps = np.unique(np.concatenate([series[r].step for r in ranks])).astype(np.int64)
    columns = []
    for r in ranks:
        col = np.full(len(steps), np.nan)
        # a step recorded twice (a resumed run) keeps its last value: later writes win in fancy assignment
        col[np.searchsorted(steps, series[r].step)] = series[r].value
        columns.append(col)
    return steps, columns
