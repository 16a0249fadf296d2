"""Find the runs under a log directory and summarise each without reading its metrics.

Example::

    from mindwatch.store.catalog import find_runs, listing
    for path in find_runs("monitor_output"):
        s = listing(path)
        print(s.project, s.run_id, s.state, s.last_step)

Used by ``mindwatch runs``, the dashboard's runs page and reports.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mindwatch.store.jsonl import decode_line
from mindwatch.store.layout import RunLayout, is_run_dir, read_json
from mindwatch.store.states import lost_message, rank_states, run_state


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


@dataclass
class RunListing:
    """What a list of runs shows about one run."""

    path: str
    run_id: str
    project: str
    state: str
    tags: Any = field(default_factory=list)
    world_size: int = 1
    ranks: list[int] = field(default_factory=list)
    last_step: int | None = None
    last_time: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    alert_count: int = 0
    error: str | None = None
    #: The step the training ends at (meta.json ``total_steps``); None when unknown.
    total_steps: int | None = None
    #: The loss of the lowest rank's last record, and the lowest finite loss of the lowest rank that has one (its
    #: status file's ``best_loss``): the definitions :func:`mindwatch.analysis.summary.summarize_run` uses.
    final_loss: float | None = None
    best_loss: float | None = None
    #: meta.json's config snapshot (secrets masked).
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def duration(self) -> float | None:
        if self.started_at is None:
            return None
        end = self.ended_at or self.last_time or time.time()
        return max(0.0, end - self.started_at)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "duration": self.duration}


def listing(path: str | os.PathLike[str], now: float | None = None) -> RunListing:
    """Summary of one run from ``meta.json``, the status files and the alert count (cheap: no metrics read)."""
    layout = RunLayout(Path(path))
    meta = read_json(layout.meta) or {}
    ranks = layout.ranks()
    statuses = {r: s for r in ranks if (s := read_json(layout.status(r))) is not None}
    state = run_state(rank_states(statuses, now).values())
    # the heartbeat lags the metrics by up to flush_secs (and forever after a kill -9): take the newer of the two
    last_by_rank = {r: rec for r in ranks if (rec := last_record(layout.metrics(r))) is not None}
    lasts = list(last_by_rank.values())
    last_steps = [s["last_step"] for s in statuses.values() if isinstance(s.get("last_step"), int)]
    last_steps += [rec["step"] for rec in lasts if isinstance(rec.get("step"), int)]
    last_times = [s["last_step_time"] for s in statuses.values() if isinstance(s.get("last_step_time"), (int, float))]
    last_times += [rec["t"] for rec in lasts if isinstance(rec.get("t"), (int, float))]
    errors = [s["error"] for s in statuses.values() if s.get("error")]
    final = next((rec.get("loss") for _, rec in sorted(last_by_rank.items()) if "loss" in rec), None)
    bests = [b for _, s in sorted(statuses.items()) if isinstance(b := s.get("best_loss"), (int, float))]
    started = meta.get("started_at") or min((s.get("started_at") or 0 for s in statuses.values()), default=None)
    return RunListing(
        path=str(layout.root),
        run_id=str(meta.get("run_id", layout.root.name)),
        project=str(meta.get("project", layout.root.parent.name)),
        state=state,
        tags=meta.get("tags", []),
        world_size=int(meta.get("world_size", max(len(statuses), 1))),
        ranks=sorted(statuses),
        last_step=max(last_steps) if last_steps else None,
        last_time=max(last_times) if last_times else None,
        started_at=started or None,
        ended_at=meta.get("ended_at"),
        alert_count=_count_lines(layout.alerts),
        error=lost_message(statuses) or (errors[0] if errors else None),
        final_loss=_number(final),
        best_loss=bests[0] if bests else None,
        config=config if isinstance(config := meta.get("config"), dict) else {},
        total_steps=total if isinstance(total := meta.get("total_steps"), int) and not isinstance(total, bool) else None,
    )


def _number(v: Any) -> float | None:
    """A JSON value as a float: NaN and Inf arrive as the strings "nan", "inf", "-inf"."""
    if isinstance(v, bool) or v is None:
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 16), b""))
    except OSError:
        return 0


def last_record(path: Path, tail_bytes: int = 1 << 14) -> dict[str, Any] | None:
    """The last complete record of a JSONL file, reading only its end."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - tail_bytes))
            data = f.read(tail_bytes)
    except OSError:
        return None
    for line in reversed(data.split(b"\n")):
        rec = decode_line(line) if line.strip() else None
        if rec is not None:
            return rec
    return None
