"""Read a run directory back: meta, status, alerts and columnar series per metric and rank.

Example::

    import mindwatch
    run = mindwatch.open_run("monitor_output/gpt/run_20261129_074500")
    run.state                      # 'running' | 'finished' | 'failed' | 'stopped' | 'stalled' | 'stale'
    s = run.series("loss", rank=0)
    s.step, s.value                # numpy arrays
    run.refresh()                  # pick up lines written since (for live readers)

Readers tolerate a torn last line (it is read again once complete) and unknown keys.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mindwatch.store.jsonl import COORDINATES, decode_line, metric_values
from mindwatch.store.layout import RunLayout, read_json
from mindwatch.store.writer import FINAL_STATES

__all__ = ["COORDINATES", "JsonlTail", "Run", "Series", "open_run", "rank_state"]


class JsonlTail:
    """Incremental reader of an append-only JSONL file: each call returns only new complete lines."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.offset = 0
        self.bad_lines = 0

    def read_new(self, max_bytes: int | None = None) -> list[dict[str, Any]]:
        out = []
        for line in self.read_new_bytes(max_bytes).splitlines():
            if not line.strip():
                continue
            rec = decode_line(line)
            if rec is None:
                self.bad_lines += 1
            else:
                out.append(rec)
        return out

    def read_new_bytes(self, max_bytes: int | None = None) -> bytes:
        """The new complete lines as raw bytes (for readers that parse in bulk); advances the offset."""
        try:
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                if not stat.S_ISREG(st.st_mode):
                    return b""  # only regular files: a device or pipe would never end
                if st.st_size < self.offset:  # truncated or replaced: start over
                    self.offset = 0
                f.seek(self.offset)
                n = st.st_size - self.offset  # what exists now; later growth is the next call's
                data = f.read(min(n, max_bytes) if max_bytes else n)
        except FileNotFoundError:
            return b""
        end = data.rfind(b"\n")
        if end < 0:
            return b""  # nothing complete yet: a torn line stays for the next call
        self.offset += end + 1
        return data[: end + 1]


@dataclass
class Series:
    """One metric of one rank: parallel numpy arrays ordered as written."""

    step: np.ndarray
    value: np.ndarray
    t: np.ndarray

    def __len__(self) -> int:
        return len(self.step)


@dataclass
class _Columns:
    step: list[int] = field(default_factory=list)
    value: list[float] = field(default_factory=list)
    t: list[float] = field(default_factory=list)
    frozen: Series | None = None

    def series(self) -> Series:
        if self.frozen is None or len(self.frozen) != len(self.step):
            self.frozen = Series(
                np.asarray(self.step, dtype=np.int64),
                np.asarray(self.value, dtype=np.float64),
                np.asarray(self.t, dtype=np.float64),
            )
        return self.frozen


class Run:
    """A run directory opened for reading. Use :func:`open_run`."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if not self.path.is_dir():
            raise FileNotFoundError(f"no run directory at {self.path}")
        self.layout = RunLayout(self.path)
        self.meta: dict[str, Any] = {}
        self.statuses: dict[int, dict[str, Any]] = {}
        self.alerts: list[dict[str, Any]] = []
        self._tails: dict[int, JsonlTail] = {}
        self._alert_tail = JsonlTail(self.layout.alerts)
        self._columns: dict[int, dict[str, _Columns]] = {}
        self.last_record: dict[int, dict[str, Any]] = {}
        self.refresh()

    @property
    def id(self) -> str:
        return str(self.meta.get("run_id", self.path.name))

    @property
    def ranks(self) -> list[int]:
        return sorted(set(self._columns) | set(self.statuses))

    @property
    def metrics(self) -> list[str]:
        names: set[str] = set()
        for cols in self._columns.values():
            names.update(cols)
        return sorted(names)

    def refresh(self) -> dict[int, list[dict[str, Any]]]:
        """Re-read meta and status, and append new lines; returns the new records per rank."""
        self.meta = read_json(self.layout.meta) or self.meta
        for rank in self.layout.ranks():
            st = read_json(self.layout.status(rank))
            if st is not None:
                self.statuses[rank] = st
        new: dict[int, list[dict[str, Any]]] = {}
        for rank in self.layout.ranks():
            tail = self._tails.setdefault(rank, JsonlTail(self.layout.metrics(rank)))
            records = tail.read_new()
            if records:
                self._ingest(rank, records)
                new[rank] = records
        self.alerts.extend(self._alert_tail.read_new())
        return new

    def _ingest(self, rank: int, records: list[dict[str, Any]]) -> None:
        cols = self._columns.setdefault(rank, {})
        for rec in records:
            step = rec.get("step")
            if not isinstance(step, int):
                continue
            t = rec.get("t")
            t = float(t) if isinstance(t, (int, float)) else np.nan
            for key, v in metric_values(rec):
                c = cols.get(key)
                if c is None:
                    c = cols[key] = _Columns()
                c.step.append(step)
                c.value.append(v)
                c.t.append(t)
            self.last_record[rank] = rec

    def series(self, metric: str, rank: int | None = None) -> Series:
        """Columnar series of ``metric`` for ``rank`` (default: the lowest rank). Empty when absent."""
        if rank is None:
            rank = self.ranks[0] if self.ranks else 0
        c = self._columns.get(rank, {}).get(metric)
        if c is None:
            return Series(np.empty(0, np.int64), np.empty(0, np.float64), np.empty(0, np.float64))
        return c.series()

    @property
    def state(self) -> str:
        """The run's state across ranks; ``stale`` when the heartbeat stopped without a final state."""
        if not self.statuses:
            return "unknown"
        states = [rank_state(s) for s in self.statuses.values()]
        for s in ("failed", "stalled", "stale", "stopped", "running"):
            if s in states:
                return s
        return "finished"

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
        steps: list[int] = [s["last_step"] for s in self.statuses.values() if isinstance(s.get("last_step"), int)]
        steps += [r["step"] for r in self.last_record.values() if isinstance(r.get("step"), int)]
        return max(steps) if steps else None

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r}, state={self.state!r}, ranks={self.ranks}, metrics={self.metrics})"


def rank_state(status: dict[str, Any], now: float | None = None) -> str:
    """One rank's state; a live state whose heartbeat is older than a few beats is ``stale``."""
    state = str(status.get("state", "unknown"))
    if state in FINAL_STATES:
        return state
    beat = float(status.get("heartbeat_secs") or 2.0)
    updated = status.get("updated_at")
    if isinstance(updated, (int, float)) and (now or time.time()) - updated > max(10.0, 5 * beat):
        return "stale"
    return state


def open_run(path: str | os.PathLike[str]) -> Run:
    """Open a run directory for reading. See :class:`Run`."""
    return Run(path)
