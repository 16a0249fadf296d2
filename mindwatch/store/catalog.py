"""Find the runs under a log directory and read what a listing of them needs, without reading their metrics.

Example::

    from mindwatch.store.catalog import RunHead, find_runs, last_step
    for path in find_runs("monitor_output"):
        head = RunHead(path).refresh()
        print(head.meta.get("run_id"), last_step(head.statuses, head.last_record), head.alert_count)

A :class:`RunHead` is what :func:`mindwatch.analysis.summary.list_run` (``mindwatch runs``, the
dashboard's runs page) makes a listing from; an opened :class:`~mindwatch.store.reader.Run` holds
the same facts (``meta``, ``statuses``, ``last_record``, ``alert_count``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mindwatch.store.jsonl import read_last_record
from mindwatch.store.layout import JsonFile, RunLayout, is_run_dir


def find_runs(logdir: str | os.PathLike[str], max_depth: int = 3) -> list[Path]:
    """Run directories under ``logdir`` (``logdir`` itself, ``<project>/<run>``, or deeper), sorted by path.

    Symlinked directories are not followed, so nothing outside ``logdir`` is reached.
    """
    root = Path(logdir)
    if not root.is_dir():
        raise FileNotFoundError(f"log directory not found: {root}")
    found: list[Path] = []

    def walk(d: Path, depth: int) -> None:
        if is_run_dir(d):
            found.append(d)
            return
        if depth >= max_depth:
            return
        try:
            children = sorted(p for p in d.iterdir() if p.is_dir() and not p.is_symlink() and not p.name.startswith("."))
        except OSError:
            return
        for child in children:
            walk(child, depth + 1)

    walk(root, 0)
    return found


def last_step(statuses: dict[int, dict[str, Any]], last_records: dict[int, dict[str, Any]]) -> int | None:
    """The run's last step: the newest of the status files' ``last_step`` and the metrics files' last records.

    The heartbeat lags the metrics by up to ``flush_secs`` (and forever after a kill -9): the newer of the two counts.
    """
    steps = [s["last_step"] for s in statuses.values() if type(s.get("last_step")) is int]
    steps += [r["step"] for r in last_records.values() if type(r.get("step")) is int]
    return max(steps) if steps else None


def last_time(statuses: dict[int, dict[str, Any]], last_records: dict[int, dict[str, Any]]) -> float | None:
    """When the run's last step ended, by the same rule as :func:`last_step`."""
    times = [float(s["last_step_time"]) for s in statuses.values() if _is_number(s.get("last_step_time"))]
    times += [float(r["t"]) for r in last_records.values() if _is_number(r.get("t"))]
    return max(times) if times else None


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class RunHead:
    """meta.json, the status files, each metrics file's last record and the alert count of one run directory.

    ``refresh()`` reads a file again only when it changed (inode, size or mtime), and counts only the
    alert lines appended since: a live page may call it every poll.
    """

    def __init__(self, path: str | os.PathLike[str], also: tuple[Path, ...] = ()) -> None:
        self.path = Path(path)
        self.layout = RunLayout(self.path, also)
        self.meta: dict[str, Any] = {}
        self.statuses: dict[int, dict[str, Any]] = {}
        self.last_record: dict[int, dict[str, Any]] = {}
        self.alert_count = 0
        self._meta = JsonFile(self.layout.meta)
        self.notes: dict[str, Any] = {}
        self._notes = JsonFile(self.layout.notes)
        self._status: dict[int, JsonFile] = {}
        self._metrics: dict[int, tuple[int, int, int]] = {}  # rank -> the metrics file's signature at its last read
        self._alerts_read: dict[Path, int] = {}  # bytes of each alerts.jsonl counted
        self._alerts_in: dict[Path, int] = {}  # alerts counted in each

    def refresh(self) -> RunHead:
        """Read what changed since the last call; returns ``self``."""
        self.meta = self._meta.read() or self.meta
        self.notes = self._notes.read() or {}
        for rank in self.layout.ranks():
            status = self._status.setdefault(rank, JsonFile(self.layout.status(rank))).read()
            if status is not None:
                self.statuses[rank] = status
            path = self.layout.metrics(rank)
            try:
                st = os.stat(path)
            except OSError:
                continue
            signature = (st.st_ino, st.st_size, st.st_mtime_ns)
            if self._metrics.get(rank) != signature:
                self._metrics[rank] = signature
                if (rec := read_last_record(path)) is not None:
                    self.last_record[rank] = rec
        self._count_alerts()
        return self

    def _count_alerts(self) -> None:
        for path in self.layout.alert_files:
            try:
                size = os.stat(path).st_size
                done = self._alerts_read.get(path, 0)
                if size == done:
                    continue
                with open(path, "rb") as f:
                    if size < done:  # replaced: count again
                        done = self._alerts_in[path] = 0
                    f.seek(done)
                    for chunk in iter(lambda: f.read(1 << 16), b""):
                        self._alerts_in[path] = self._alerts_in.get(path, 0) + chunk.count(b"\n")
                        done += len(chunk)
                self._alerts_read[path] = done
            except OSError:
                continue
        self.alert_count = sum(self._alerts_in.values())
