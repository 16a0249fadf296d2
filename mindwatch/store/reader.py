"""Read a run directory back: meta, status, alerts and columnar series per metric and rank.

Example::

    import mindwatch
    run = mindwatch.open_run("monitor_output/gpt/run_20261129_074500")
    run.state                      # 'running' | 'finished' | 'failed' | 'stopped' | 'stalled' | 'stale' | 'lost'
    s = run.series("loss", rank=0)
    s.step, s.value                # numpy arrays
    run.refresh()                  # pick up lines written since (for live readers)

Readers tolerate a torn last line (it is read again once complete) and unknown keys.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mindwatch.store.catalog import last_step
from mindwatch.store.columns import RankColumns
from mindwatch.store.jsonl import COORDINATES, JsonlTail
from mindwatch.store.layerfiles import LayerHistograms
from mindwatch.store.layout import JsonFile, RunLayout
from mindwatch.store.profiles import Profile, read_profiles
from mindwatch.store.states import FINAL_STATES, lost_ranks, rank_state, rank_states, run_state

if TYPE_CHECKING:
    from mindwatch.store.cache import ColumnCache

__all__ = ["COORDINATES", "JsonlTail", "Run", "Series", "open_run", "rank_state"]


@dataclass
class Series:
    """One metric of one rank: parallel numpy arrays, one entry per step in step order (a rewritten step: its newest value)."""

    step: np.ndarray
    value: np.ndarray
    t: np.ndarray

    def __len__(self) -> int:
        return len(self.step)


class Run:
    """A run directory opened for reading. Use :func:`open_run`."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        also: Sequence[str | os.PathLike[str]] = (),
        cache: ColumnCache | None = None,
        read: bool = True,
    ) -> None:
        """``also``: more folders of the same run (its ranks spread over several ``save_dir``, one a node);
        ``cache``: keep parsed columns across processes (the dashboard's); ``read=False``: read at the first refresh."""
        self.path = Path(path)
        for folder in (self.path, *map(Path, also)):
            if not folder.is_dir():
                raise FileNotFoundError(f"no run directory at {folder}")
        self.layout = RunLayout(self.path, tuple(Path(p) for p in also))
        self.cache = cache
        self.meta: dict[str, Any] = {}
        self.statuses: dict[int, dict[str, Any]] = {}
        self.alerts: list[dict[str, Any]] = []
        self.columns: dict[int, RankColumns] = {}  # each rank's metrics file, read incrementally
        self.last_record: dict[int, dict[str, Any]] = {}  # each rank's last record with a step
        self._alert_tails = [JsonlTail(f) for f in self.layout.alert_files]
        self._meta = JsonFile(self.layout.meta)
        self.notes: dict[str, Any] = {}  # a person's name and note (mindwatch.store.notes)
        self._notes = JsonFile(self.layout.notes)
        self._status: dict[int, JsonFile] = {}  # read again only when a rank rewrites its status
        self._series: dict[tuple[int, str], tuple[int, int, Series]] = {}
        self._alerts_marked_for = 0  # attempts the alerts' marks were computed for
        if read:
            self.refresh()

    @property
    def id(self) -> str:
        return str(self.meta.get("run_id", self.path.name))

    @property
    def ranks(self) -> list[int]:
        return sorted(set(self.columns) | set(self.statuses))

    @property
    def metrics(self) -> list[str]:
        names: set[str] = set()
        for cols in self.columns.values():
            names |= cols.keys
        return sorted(names)

    def readable(self, path: Path) -> bool:
        """Whether a file of the run may be read; every file here (a dashboard allows only those inside LOGDIR)."""
        return True

    def refresh(self) -> dict[int, int]:
        """Re-read meta and status, read appended lines and alerts; returns how many lines each rank added."""
        if self.readable(self.layout.meta):
            self.meta = self._meta.read() or self.meta
        if self.readable(self.layout.notes):
            self.notes = self._notes.read() or {}
        new: dict[int, int] = {}
        for rank in self.layout.ranks():
            status, metrics = self.layout.status(rank), self.layout.metrics(rank)
            if self.readable(status) and (st := self._status.setdefault(rank, JsonFile(status)).read()) is not None:
                self.statuses[rank] = st
            if not metrics.exists() or not self.readable(metrics):
                continue
            cols = self.columns.get(rank)
            if cols is None:  # every line is new here, also those it took from column files or a cache
                cols = self.columns[rank] = RankColumns(metrics, cache=self.cache)
                cols.refresh()
                added = cols.lines
            else:
                added = cols.refresh()
            if added:
                new[rank] = added
                self.last_record[rank] = cols.last_record() or self.last_record.get(rank, {})
        fresh = [a for tail in self._alert_tails if self.readable(tail.path) for a in tail.read_new()]
        if len(self._alert_tails) > 1 and fresh:  # several nodes' files: in time order
            fresh.sort(key=_alert_time)
        self.alerts.extend(fresh)
        if fresh or len(self.attempts) != self._alerts_marked_for:
            self._mark_alerts()
        return new

    @property
    def alert_count(self) -> int:
        """Alerts read so far."""
        return len(self.alerts)

    @property
    def attempts(self) -> list[dict[str, Any]]:
        """The trainings into this run, oldest first (``meta.json``'s ``attempts``; see :mod:`mindwatch.store.attempts`)."""
        return [a for a in self.meta.get("attempts") or [] if isinstance(a, dict)]

    @property
    def profiles(self) -> list[Profile]:
        """The ``profile`` action's profiles, by first step: steps, ranks, reason, each rank's folder and top op types
        (:mod:`mindwatch.store.profiles`)."""
        return read_profiles(self.layout)

    def _mark_alerts(self) -> None:
        """Give each alert its ``attempt`` (by time) and ``rewound: true`` when a later attempt wrote its step again."""
        attempts = self.attempts
        self._alerts_marked_for = len(attempts)
        if len(attempts) < 2:
            return
        starts = [float(a.get("started_at") or 0.0) for a in attempts]
        firsts = [a.get("first_step") for a in attempts]
        for alert in self.alerts:
            t, step = alert.get("t"), alert.get("step")
            k = max(1, bisect.bisect_right(starts, t)) if isinstance(t, (int, float)) else len(attempts)
            alert["attempt"] = k
            later = [f for f in firsts[k:] if isinstance(f, int)]
            alert["rewound"] = isinstance(step, int) and any(f <= step for f in later)

    def series(self, metric: str, rank: int | None = None) -> Series:
        """Columnar series of ``metric`` for ``rank`` (default: the lowest rank). Empty when absent."""
        if rank is None:
            rank = self.ranks[0] if self.ranks else 0
        cols = self.columns.get(rank)
        if cols is None:
            return Series(np.empty(0, np.int64), np.empty(0, np.float64), np.empty(0, np.float64))
        cached = self._series.get((rank, metric))
        if cached is not None and cached[:2] == (cols.generation, cols.lines):
            return cached[2]
        line, value = cols.column(metric)
        s = Series(cols.steps[line], value, cols.time_of_lines(line))
        self._series[(rank, metric)] = (cols.generation, cols.lines, s)
        return s

    def layer_histograms(self, rank: int | None = None) -> tuple[np.ndarray, LayerHistograms | None]:
        """Histograms of each layer's weights and gradients (``layers.histogram_every``): ``(steps, histograms)``
        with ``histograms.histogram(kind, j)`` one row's ``(edges, counts)`` when indexed by row; None when absent.

        Example::

            steps, h = run.layer_histograms()
            edges, counts = LayerHistograms(h.layers, h.data[-1]).histogram(0, 3)   # the last weights of layer 3
        """
        if rank is None:
            rank = self.ranks[0] if self.ranks else 0
        cols = self.columns.get(rank)
        return cols.layer_histograms() if cols is not None else (np.empty(0, np.int64), None)

    def states(self, now: float | None = None) -> dict[int, str]:
        """Each rank's state (see :func:`rank_state`); ``lost`` for a rank rank 0 saw die."""
        return rank_states(self.statuses, now)

    @property
    def lost(self) -> dict[int, dict[str, Any]]:
        """Ranks that died before writing a final state: ``{1: {"pid", "host", "last_step", "how", "t"}}``."""
        return lost_ranks(self.statuses)

    @property
    def state(self) -> str:
        """The run's state across ranks; ``stale`` when the heartbeat stopped without a final state."""
        return run_state(self.states().values())

    @property
    def ended(self) -> bool:
        """Every rank reached a final state (finished, failed or stopped)."""
        return bool(self.statuses) and all(s.get("state") in FINAL_STATES for s in self.statuses.values())

    @property
    def finished(self) -> bool:
        """Every rank finished normally."""
        return self.state == "finished"

    @property
    def last_step(self) -> int | None:
        """The newest step any rank recorded (see :func:`mindwatch.store.catalog.last_step`)."""
        return last_step(self.statuses, self.last_record)

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r}, state={self.state!r}, ranks={self.ranks}, metrics={self.metrics})"


def open_run(path: str | os.PathLike[str], *also: str | os.PathLike[str]) -> Run:
    """Open a run directory for reading; ``also``: more folders of the same run (one a node, without a shared file
    system), read as one run. See :class:`Run`.

    Example::

        run = open_run("node0/dist/run_20261201_120000", "node1/dist/run_20261201_120000")
        run.ranks        # [0, 1]
    """
    return Run(path, also=also)


def _alert_time(alert: dict[str, Any]) -> float:
    t = alert.get("t")
    return float(t) if isinstance(t, (int, float)) else 0.0
