"""The cross-rank view of a run, computed from the rank files (no collective in the training step).

Example::

    import mindwatch
    from mindwatch.store.crossrank import band, per_rank

    run = mindwatch.open_run("monitor_output/gpt/run_20261129_074500")
    b = band(run, "step_time")
    b.step, b.min, b.mean, b.max       # per step, across the ranks that recorded it
    b.argmax                           # which rank was slowest at each step
    lines = per_rank(run, "loss")      # {rank: Series}: one line per rank on the chart

For live readers on rank 0 (the straggler rule), :class:`RankTails` reads the new lines of every
rank's ``metrics.rank<R>.jsonl`` and :class:`StepAligner` joins them by step, yielding a step once
every rank has recorded it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mindwatch.store.layout import RunLayout
from mindwatch.store.reader import JsonlTail, Run, Series

#: The metrics the dashboard draws as a band across ranks and the rules compare across ranks.
CROSS_RANK_METRICS: tuple[str, ...] = ("loss", "step_time", "data_time", "samples_per_second", "tokens_per_second")


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


def per_rank(run: Run, metric: str) -> dict[int, Series]:
    """``{rank: Series}`` of ``metric`` for every rank that recorded it."""
    out = {}
    for rank in run.ranks:
        s = run.series(metric, rank)
        if len(s):
            out[rank] = s
    return out


def band(run: Run, metric: str) -> Band:
    """Per-step min / mean / max (and which rank) of ``metric`` across the ranks of ``run``."""
    return band_of(metric, per_rank(run, metric))


def bands(run: Run, metrics: Iterable[str] = CROSS_RANK_METRICS) -> dict[str, Band]:
    """:func:`band` of each metric some rank recorded."""
    names = set(run.metrics)
    return {m: band(run, m) for m in metrics if m in names}


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


class RankTails:
    """New lines of every rank's metrics file, for a live reader (rank 0's worker thread).

    Example::

        tails = RankTails(run_dir, world_size=8)
        for rank, records in tails.read_new().items(): ...
    """

    def __init__(self, run_dir: Path, world_size: int) -> None:
        layout = RunLayout(Path(run_dir))
        self.tails = {r: JsonlTail(layout.metrics(r)) for r in range(world_size)}

    def read_new(self, max_bytes: int | None = 4 << 20) -> dict[int, list[dict[str, Any]]]:
        out = {}
        for rank, tail in self.tails.items():
            records = tail.read_new(max_bytes)
            if records:
                out[rank] = records
        return out


class StepAligner:
    """Joins the records of ``world_size`` ranks by step; a step comes out once every rank has it.

    Example::

        aligner = StepAligner(world_size=2)
        aligner.add(0, [{"step": 1, "data_time": 0.01}])      # -> []
        aligner.add(1, [{"step": 1, "data_time": 0.30}])      # -> [(1, {0: {...}, 1: {...}})]

    Steps that some rank never records (it died, or records on another ``step_interval``) are
    dropped once more than ``max_pending`` steps wait.
    """

    def __init__(self, world_size: int, max_pending: int = 1000) -> None:
        self.world_size = world_size
        self.max_pending = max_pending
        self.pending: dict[int, dict[int, dict[str, Any]]] = {}
        self.dropped = 0

    def add(self, rank: int, records: list[dict[str, Any]]) -> list[tuple[int, dict[int, dict[str, Any]]]]:
        done = []
        for rec in records:
            step = rec.get("step")
            if not isinstance(step, int):
                continue
            at = self.pending.setdefault(step, {})
            at[rank] = rec
            if len(at) == self.world_size:
                done.append((step, self.pending.pop(step)))
        while len(self.pending) > self.max_pending:
            self.pending.pop(min(self.pending))
            self.dropped += 1
        done.sort(key=lambda item: item[0])
        return done
