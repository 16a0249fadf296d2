"""``mindwatch tail``: a live terminal view of a run, for people who only have SSH.

Example::

    mindwatch tail monitor_output/gpt/run_20261129_074500
    mindwatch tail monitor_output            # the most recently started run under a log directory
    mindwatch tail node0/gpt/run_1 --also node1/gpt/run_1    # a run's folders on two nodes, read as one run

Shows the run's state, its progress (steps out of planned, ETA), the latest value, min, max and a
sparkline of every metric, the newest evaluation, and the alerts as they arrive. Without a terminal (a pipe, a log
file) it prints a line a new step, a line an evaluation and a line an alert::

    step 120 running | loss 2.31 | lr 0.001 | grad_norm 0.93 | ...
    step 120 (epoch 3) eval | loss 0.5512 | accuracy 0.8123 | 0.4 s, 512 samples
    ALERT [spike] rank 0 step 121: loss spiked to ...

It reads the run directory incrementally (:meth:`mindwatch.store.reader.Run.refresh`) and exits when every rank
reached a final state, when the heartbeat stopped without one (``stale``: the process was killed or lost), or on
Ctrl-C.
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

from mindwatch import metrics as vocab
from mindwatch.analysis.progress import run_progress
from mindwatch.analysis.state_colours import severity_style, terminal_style
from mindwatch.analysis.state_text import ended_line
from mindwatch.analysis.summary import list_run, ordered_metrics
from mindwatch.sinks.console import format_evaluation
from mindwatch.store.best_eval import evaluation_lines
from mindwatch.store.catalog import find_runs
from mindwatch.store.layerfiles import is_layer_metric
from mindwatch.store.layout import is_run_dir
from mindwatch.store.reader import Run, open_run
from mindwatch.units import format_duration, format_number

_BLOCKS = "▁▂▃▄▅▆▇█"
#: Recorded beside an evaluation's results, shown in its line (:func:`format_evaluation`).
_EVAL_EXTRAS = (vocab.EPOCH, vocab.EVAL_TIME, vocab.EVAL_SAMPLES)


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
        if metric in vocab.NOT_CHARTED:  # where a step is (epoch, batch), an evaluation's cost: no curve
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
    newest = evaluations(run, r)[-1:]
    if newest:
        parts.append(Text("last evaluation: ", style="bold") + Text(format_evaluation(newest[0][1])))
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
    """One line of the newest step: ``step 120 running | loss 2.31 | lr 0.001 | ...`` (the first six metrics); its
    training values, also when the newest record is the evaluation after it (that one is :func:`format_evaluation`'s)."""
    r = rank if rank is not None else (run.ranks[0] if run.ranks else 0)
    rec = run.last_record.get(r, {})
    if vocab.is_evaluation(rec):
        rec = _step_values(run, r, rec.get("step"))
    names = [m for m in ordered_metrics(list(rec)) if isinstance(rec.get(m), (int, float)) and _step_metric(m)]
    shown = " | ".join(f"{m} {format_number(float(rec[m]))}" for m in names[:6])
    return f"step {rec.get('step', run.last_step)} {run.state}" + (f" | {shown}" if shown else "")


#: A record's keys that say where it is, not what the step measured: not in a step's line.
_WHERE = frozenset({"step", "t", "rank", *vocab.NOT_CHARTED})


def _step_metric(name: str) -> bool:
    """A training step's value, for its line: not a layer's (the dashboard's view), not an evaluation's, not where the
    record is (its step, time, rank, epoch)."""
    return not is_layer_metric(name) and not vocab.is_eval(name) and name not in _WHERE


def _step_values(run: Run, rank: int, step: Any) -> dict[str, Any]:
    """The values ``rank`` recorded at ``step``, each metric's newest there, but for the evaluation's."""
    rec: dict[str, Any] = {"step": step}
    for m in run.metrics:
        if _step_metric(m) and len(s := run.series(m, rank=rank)) and s.step[-1] == step:
            rec[m] = float(s.value[-1])
    return rec


def evaluations(run: Run, rank: int, after: int = -1) -> list[tuple[int, dict[str, Any]]]:
    """The evaluations ``rank`` recorded after line ``after`` of its metrics file, oldest first: ``(line, record)``,
    the record with its ``step``, ``eval/<name>`` results and, where recorded, ``epoch``, ``eval_time`` and
    ``eval_samples`` (what :func:`format_evaluation` prints)."""
    cols = run.columns.get(rank)
    if cols is None:
        return []
    return [(ln, {"step": int(cols.steps[ln]), **values}) for ln, values in evaluation_lines(cols, after, beside=_EVAL_EXTRAS)]


def _follow_lines(run: Run, rank: int | None, console: Console, interval: float) -> int:
    seen_step, seen_alerts, seen_eval = object(), 0, -1
    first = True
    try:
        while True:
            run.refresh()
            r = rank if rank is not None else (run.ranks[0] if run.ranks else 0)
            new = evaluations(run, r, seen_eval)
            if first:  # the newest evaluation, for context; not the run's history
                new, first = new[-1:], False
            if new:
                seen_eval = new[-1][0]
            newest_step = run.last_step
            before = [rec for _, rec in new if isinstance(newest_step, int) and rec["step"] < newest_step]
            for rec in before:  # an evaluation that steps have passed since: in step order, before the newest step
                console.print(format_evaluation(rec), soft_wrap=True, markup=False)
            if newest_step != seen_step:
                seen_step = newest_step
                console.print(step_line(run, rank), soft_wrap=True, markup=False)
            for _, rec in new[len(before) :]:
                console.print(format_evaluation(rec), soft_wrap=True, markup=False)
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
