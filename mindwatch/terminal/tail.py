"""``mindwatch tail``: a live terminal view of a run, for people who only have SSH.

Example::

    mindwatch tail monitor_output/gpt/run_20261129_074500
    mindwatch tail monitor_output            # the most recently started run under a log directory
    mindwatch tail node0/gpt/run_1 --also node1/gpt/run_1    # a run's folders on two nodes, read as one run

Shows the run's state, its progress (steps out of planned, ETA), the latest value, min, max and a
sparkline of every metric, and the alerts as they arrive. Reads the run directory incrementally
(:meth:`mindwatch.store.reader.Run.refresh`) and exits when every rank reached a final state, when
the heartbeat stopped without one (``stale``: the process was killed or lost), or on Ctrl-C.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from mindwatch.analysis.progress import run_progress
from mindwatch.analysis.state_colours import severity_style, terminal_style
from mindwatch.analysis.state_text import ended_line
from mindwatch.analysis.summary import list_run, ordered_metrics
from mindwatch.store.catalog import find_runs
from mindwatch.store.layerfiles import is_layer_metric
from mindwatch.store.layout import is_run_dir
from mindwatch.store.reader import Run, open_run
from mindwatch.units import format_duration, format_number

_BLOCKS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float], width: int = 40) -> Text:
    """The last ``width`` values as block characters; a non-finite value is a red ``!``."""
    vals = values[-width:]
    finite = [v for v in vals if math.isfinite(v)]
    out = Text()
    if not finite:
        return Text("!" * len(vals), style="bold red")
    lo, hi = min(finite), max(finite)
    span = hi - lo
    for v in vals:
        if not math.isfinite(v):
            out.append("!", style="bold red")
        else:
            i = 0 if span == 0 else int((v - lo) / span * (len(_BLOCKS) - 1) + 0.5)
            out.append(_BLOCKS[i], style="green")
    return out


def resolve_run(path: str | os.PathLike[str]) -> Path:
    """``path`` when it is a run directory, else the most recently started run found under it."""
    p = Path(path)
    if is_run_dir(p):
        return p
    if not p.is_dir():
        raise FileNotFoundError(f"no run directory or log directory at {p}")
    runs = find_runs(p)
    if not runs:
        raise FileNotFoundError(f"no runs under {p}: give a run directory (<save_dir>/<project>/<run_id>)")
    return max(runs, key=lambda r: (list_run(r).started_at or 0.0, str(r)))


def render(run: Run, rank: int | None = None, width: int = 40, max_alerts: int = 8) -> Group:
    """One frame: state line, metrics table, recent alerts."""
    ranks = run.ranks
    r = rank if rank is not None else (ranks[0] if ranks else 0)
    state = run.state
    last = run.last_record.get(r, {})
    head = Text()
    head.append(f"{run.meta.get('project', run.path.parent.name)}/{run.id}  ", style="bold")
    head.append(state, style=terminal_style(state))
    head.append("  " + run_progress(run).text(running=not run.ended and state != "stale"))
    if len(ranks) > 1:
        head.append(f"  ranks {', '.join(map(str, ranks))} (showing {r})")
    if isinstance(last.get("t"), (int, float)):
        head.append(f"  last record {format_duration(max(0.0, time.time() - last['t']))} ago", style="dim")
    errors = [s.get("error") for s in run.statuses.values() if s.get("error")]
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col, justify in (("metric", "left"), ("last", "right"), ("min", "right"), ("max", "right"), ("trend", "left")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for metric in ordered_metrics([m for m in run.metrics if not is_layer_metric(m)]):  # layers: the dashboard's view
        if metric == "epoch":
            continue
        s = run.series(metric, rank=r)
        if not len(s):
            continue
        values = s.value[-width:].tolist()
        finite = s.value[np.isfinite(s.value)]
        table.add_row(
            metric,
            format_number(values[-1]),
            format_number(float(finite.min())) if len(finite) else "-",
            format_number(float(finite.max())) if len(finite) else "-",
            sparkline(values, width),
        )
    parts: list[Any] = [head]
    if errors:
        parts.append(Text(f"error: {errors[0]}", style="red"))
    parts.append(table if table.row_count else Text("no records yet", style="dim"))
    if run.alerts:
        parts.append(Text(f"alerts ({len(run.alerts)})", style="bold"))
        for a in run.alerts[-max_alerts:]:
            sev = str(a.get("severity", "warning"))
            line = Text(f"  step {a.get('step', '-')}  ")
            line.append(sev, style=severity_style(sev))
            line.append(f"  {a.get('rule', '')}: {a.get('message', '')}")
            parts.append(line)
    return Group(*parts)


def tail(
    path: str | os.PathLike[str],
    *,
    also: Sequence[str | os.PathLike[str]] = (),
    interval: float = 0.5,
    rank: int | None = None,
    once: bool = False,
    console: Console | None = None,
) -> int:
    """Follow a run until it ends or goes stale (exit 0) or Ctrl-C (exit 0); ``once`` prints one frame and returns.
    ``also``: the run's folders on other nodes (each node's ranks), read with it as one run."""
    console = console or Console(highlight=False)
    run = open_run(resolve_run(path), *also)
    if once:
        console.print(render(run, rank))
        return 0
    if not console.is_terminal:  # a pipe or a log file: a line a new step, as it comes (a live view would print at the end)
        return _follow_lines(run, rank, console, interval)
    try:
        with Live(render(run, rank), console=console, refresh_per_second=4, auto_refresh=False) as live:
            while True:
                run.refresh()
                live.update(render(run, rank), refresh=True)
                if run.ended or run.state == "stale":  # stale: the heartbeat stopped, the process is gone
                    break
                time.sleep(interval)
    except KeyboardInterrupt:
        console.print("stopped following (the run goes on)")
        return 0
    console.print(ended_line(run.state, run.last_step))
    return 0


def step_line(run: Run, rank: int | None = None) -> str:
    """One line of the newest step: ``step 120 running | loss 2.31 | lr 0.001 | ...`` (the first six metrics)."""
    r = rank if rank is not None else (run.ranks[0] if run.ranks else 0)
    rec = run.last_record.get(r, {})
    names = [m for m in ordered_metrics(list(rec)) if isinstance(rec.get(m), (int, float)) and not is_layer_metric(m)]
    shown = " | ".join(f"{m} {format_number(float(rec[m]))}" for m in names[:6])
    return f"step {rec.get('step', run.last_step)} {run.state}" + (f" | {shown}" if shown else "")


def _follow_lines(run: Run, rank: int | None, console: Console, interval: float) -> int:
    seen_step, seen_alerts = object(), 0
    try:
        while True:
            run.refresh()
            if run.last_step != seen_step:
                seen_step = run.last_step
                console.print(step_line(run, rank), soft_wrap=True, markup=False)
            for a in run.alerts[seen_alerts:]:
                console.print(
                    f"ALERT [{a.get('rule')}] rank {a.get('rank')} step {a.get('step')}: {a.get('message')}",
                    soft_wrap=True,
                    markup=False,
                )
            seen_alerts = len(run.alerts)
            console.file.flush()
            if run.ended or run.state == "stale":
                break
            time.sleep(interval)
    except KeyboardInterrupt:
        return 0
    console.print(ended_line(run.state, run.last_step))
    return 0
