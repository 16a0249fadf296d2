"""``mindwatch runs``: the runs under a log directory, one line each.

Example::

    mindwatch runs monitor_output
    mindwatch runs monitor_output --json     # for scripts
    mindwatch runs node0/out node1/out       # each node's save_dir: a run in several is one run, every rank

The steps column reads ``185/1,500 (12 %)`` when the run recorded its plan, and a running run
shows an ETA at its mean rate since it started. Reads only ``meta.json``, the status files and the alert count of each run
(:func:`mindwatch.analysis.summary.list_run`), so it is fast on many long runs.
"""

from __future__ import annotations

import datetime as _dt
import io
import json
import os
from pathlib import Path
from typing import Any

from mindwatch.analysis.progress import Progress, steps_per_second
from mindwatch.analysis.state_colours import terminal_style
from mindwatch.analysis.summary import RunSummary, field_label, listed
from mindwatch.analysis.tags import tag_texts
from mindwatch.serve.views import Catalog
from mindwatch.store.catalog import RunHead
from mindwatch.units import format_duration


def list_runs(*logdirs: str | os.PathLike[str]) -> list[RunSummary]:
    """Summaries of every run under ``logdirs``, newest first, as the dashboard lists them: a run found under
    several (each node's save_dir) at the same ``project/run`` is one run, read from every folder of it."""
    catalog = Catalog([Path(d) for d in logdirs])
    summaries = []
    for run_id in catalog.run_ids():
        view = catalog.open(run_id)  # not read: where the run's folders are (rank 0's first)
        summaries.append(listed(RunHead(view.path, view.layout.also).refresh()))
    return sorted(summaries, key=lambda s: (s.started_at or 0.0, s.path), reverse=True)


def listed_progress(s: RunSummary) -> Progress:
    """A listed run's progress; the rate is the mean since it started (the listing reads no metrics)."""
    rate = None
    if s.last_step is not None and s.started_at is not None and s.last_time is not None:
        rate = steps_per_second([0, s.last_step], [s.started_at, s.last_time])
    return Progress(s.last_step, s.total_steps, rate)


def print_runs(*logdirs: str | os.PathLike[str], as_json: bool = False, console: Any = None) -> int:
    """Print the runs table (or JSON) of the runs under ``logdirs``; 0, or 2 when one does not exist."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    logdir = ", ".join(map(str, logdirs))
    try:
        summaries = list_runs(*logdirs)
    except FileNotFoundError as e:
        console.print(f"mindwatch runs: {e}", style="red")
        return 2
    if as_json:
        print(json.dumps([s.to_dict() for s in summaries], indent=1, default=str))
        return 0
    if not summaries:
        console.print(f"no runs under {logdir}")
        return 0
    table = Table(title=f"runs under {logdir}", title_justify="left")
    for col in ("project", "run_id", "state", "last_step", "eta", "duration", "started_at", "alert_count", "tags"):
        # whole cells (a run id copied from here must be one piece); a narrow terminal scrolls, it does not fold
        right = col in ("last_step", "eta", "alert_count", "duration")
        table.add_column("ETA" if col == "eta" else field_label(col), justify="right" if right else "left", no_wrap=True)
    for s in summaries:
        progress = listed_progress(s)
        eta = progress.eta_secs if s.state == "running" else None
        started = _dt.datetime.fromtimestamp(s.started_at).strftime("%Y-%m-%d %H:%M") if s.started_at else "-"
        table.add_row(
            s.project,
            run_cell(s),
            f"[{terminal_style(s.state)}]{s.state}[/]",
            "-" if s.last_step is None else progress.steps_text() if s.total_steps is not None else str(s.last_step),
            "-" if eta is None else format_duration(eta),
            format_duration(s.duration),
            started,
            str(s.alert_count),
            ", ".join(tag_texts(s.tags)),
        )
    width = console.width
    console.width = max(width, table_width(table))  # a narrow terminal wraps whole lines; no cell is broken
    try:
        console.print(table, crop=False)
    finally:
        console.width = width
    return 0


#: A note is cut to this many characters in the table (``--json`` has all of it).
NOTE_CHARS = 60


def run_cell(s: RunSummary) -> str:
    """The run id, its display name after it, its note (cut) under it; markup in a person's text is escaped."""
    from rich.markup import escape

    cell = escape(s.run_id) + (f" [bold]{escape(s.name)}[/]" if s.name else "")
    if s.note:
        note = s.note.splitlines()[0]
        cut = note if len(note) <= NOTE_CHARS and note == s.note else note[: NOTE_CHARS - 1] + "…"
        cell += f"\n[dim]{escape(cut)}[/]"
    return cell


def table_width(table: Any) -> int:
    """The width ``table`` needs with no cell broken."""
    from rich.console import Console

    wide = Console(width=10_000, file=io.StringIO())
    with wide.capture() as captured:
        wide.print(table)
    return max((len(line.rstrip()) for line in captured.get().splitlines()), default=0)
