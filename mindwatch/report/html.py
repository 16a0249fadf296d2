"""``mindwatch report``: one self-contained HTML file per run (charts included), optionally a PDF.

Example::

    from mindwatch.report.html import write_report
    write_report(["monitor_output/gpt/run_20261129_074500"], "report.html")
    write_report([run_a, run_b], "compare.html")        # the first run, compared with the others

The page holds its data as JSON, ECharts (from npm, :func:`mindwatch.assets.echarts_js`) and the
dashboard's chart module (``mindwatch/assets/charts.js``) inline, so it opens offline and can be
mailed or attached to a model as a delivery artefact. Long runs are thinned per series to
:data:`MAX_POINTS` keeping each bucket's min and max, so spikes stay; the heat map is binned
like the dashboard's (:func:`mindwatch.analysis.heatmap.bin_layers`). The charts are the dashboard's
too: an event metric (:attr:`mindwatch.metrics.Metric.event`, a step ``skip_steps`` skipped) is no curve
of its own but a mark at each step it happened on the charts of its group (the loss chart); an evaluation's
(``eval/<name>``) is drawn as points joined by a line, its best marked. A run with evaluations has an Evaluation
section (:mod:`mindwatch.analysis.eval_table`): the dashboard's Evaluation card (the evaluation loss beside the
training's loss, the best marked) and a table of every evaluation with its primary's distance from the best. A run
with MoE routing statistics has a Mixture of experts section: each expert's load at a step (the newest; a slider picks
another), and the imbalance, the router's entropy and the dropped share per MoE layer over the steps. A run with
profiles (the ``profile`` action) has a Profiles section: each profile as the run page's Profiles panel shows it
(:mod:`mindwatch.analysis.profile_summary`): its steps, who or which alert asked, the top op types with every rank
side by side (the rank that spent the most on each marked), the profiled steps' time against the steps before, and
each rank's folder to open in MindStudio Insight.
"""

from __future__ import annotations

import datetime as _dt
import html
import json
import math
import os
import re
import string
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from mindwatch import __version__
from mindwatch import metrics as vocab
from mindwatch.alerts.alert import SEVERITIES
from mindwatch.alerts.hang import locate, newest_dumps
from mindwatch.analysis.bands import counted_values
from mindwatch.analysis.batches import flagged_batches, ids_text
from mindwatch.analysis.eval_table import EvalTable, ResultTables, eval_table, last_tables
from mindwatch.analysis.heatmap import HEATMAP_BUCKETS, bin_layers, layer_order
from mindwatch.analysis.histograms import KINDS, histogram_grid
from mindwatch.analysis.lines import series_window
from mindwatch.analysis.profile_summary import ProfileSummary, profile_summaries
from mindwatch.analysis.progress import Progress
from mindwatch.analysis.rewinds import run_rewinds
from mindwatch.analysis.state_colours import state_css
from mindwatch.analysis.state_text import state_sentence
from mindwatch.analysis.summary import RunSummary, field_label, ordered_metrics, summarize_run
from mindwatch.analysis.tags import tag_texts
from mindwatch.assets import asset_text, echarts_js
from mindwatch.store.jsonl import record_at
from mindwatch.store.layerfiles import LAYER_STATS, is_layer_metric
from mindwatch.store.reader import Run, open_run
from mindwatch.units import format_duration, format_number

#: Points per series in a chart; min/max pairs per bucket, so spikes survive.
MAX_POINTS = 2000
#: Step buckets in the heat maps (the bucket policy of mindwatch.analysis.heatmap).
MAX_HEATMAP_STEPS = HEATMAP_BUCKETS
#: Alerts listed in the table (all of them are counted and drawn).
MAX_ALERT_ROWS = 500
#: The characters of a stack dump the report holds (a dump of many threads runs long; the file has the rest).
MAX_DUMP_CHARS = 20_000
#: Steps an event is marked at on a chart, per run: as many as a chart draws (charts.js's MAX_EVENTS).
MAX_EVENT_MARKS = 500
#: Evaluations listed in a run's table (every one is drawn).
MAX_EVAL_ROWS = 1000
#: Per-layer metrics drawn as one chart of a line per layer (mindwatch.mindspore.attention).
_PER_LAYER = tuple(m.prefix for m in vocab.ATTENTION_FAMILIES)
_ENTROPY = f"{vocab.ATTENTION_ENTROPY}/"
_STABLE_RANK = f"{vocab.STABLE_RANK}/"
#: The families drawn by their heat maps alone (per weight, per MoE layer, per expert), never a curve a member.
_HEAT_ONLY = tuple(m.prefix for m in vocab.FAMILIES if m.per in ("weight", "moe layer", "expert"))
#: The names of the per-layer norms side by side in the report's bar chart.
_NORM_BARS = {vocab.WEIGHT_NORM: "weights", vocab.GRAD_NORM: "gradients"}
_HERE = Path(__file__).resolve().parent
_DECLARATION = re.compile(r"(async )?(function|const|let|class)\b")


def write_report(runs: list[str | os.PathLike[str] | Run], out: str | os.PathLike[str], *, pdf: bool = False) -> list[Path]:
    """Write the HTML report of ``runs[0]`` (compared with the rest) to ``out``; with ``pdf`` also ``out`` as .pdf."""
    opened = [r if isinstance(r, Run) else open_run(r) for r in runs]
    if not opened:
        raise ValueError("give at least one run directory")
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_report(opened), encoding="utf-8")
    written = [path]
    if pdf:
        from mindwatch.report.pdf import html_to_pdf

        written.append(html_to_pdf(path, path.with_suffix(".pdf")))
    return written


def render_report(runs: list[Run]) -> str:
    """The report page as a string."""
    labels = _labels(runs)
    summaries = [summarize_run(r) for r in runs]
    evaluations = [eval_table(r) for r in runs]
    data = {
        "metrics": _metric_charts(runs, labels, evaluations),
        "evaluation": _evaluation_charts(runs, labels, evaluations),
        "histogram": _histogram(runs, labels),
        "heatmap": _heatmap(runs[0]),
        "weights": _heatmap(runs[0], _STABLE_RANK, f"{vocab.WEIGHT_FAMILIES[0].title} per weight"),
        **_moe(runs[0]),
        "layers": _layers(runs[0]),
        "alerts": _alerts_chart(runs, labels),
        "step_range": _step_range(runs),
    }
    main = runs[0]
    title = f"mindwatch report: {main.meta.get('project', main.path.parent.name)}/{main.id}"
    if summaries[0].name:  # a person's display name (notes.json); the id stays beside it
        title = f"mindwatch report: {summaries[0].name} ({main.meta.get('project', main.path.parent.name)}/{main.id})"
    body = "\n".join(
        [
            f"<h1>{_e(title)}</h1>",
            f'<p class="sub">generated {_time(_now())} by mindwatch {__version__} from {_e(str(main.path))}'
            + (f" · compared with {_e(', '.join(labels[1:]))}" if len(runs) > 1 else "")
            + "</p>",
            *(_banner(s, lab, _now()) for s, lab in zip(summaries, labels, strict=True)),
            *(f'<p class="note">note on {_e(lab)}: {_e(s.note)}</p>' for s, lab in zip(summaries, labels, strict=True) if s.note),
            "<h2>Summary</h2>",
            _summary_table(summaries, labels),
            f"<h2>{_e(vocab.EVAL_TITLE)}</h2>" if data["evaluation"] else "",
            '<div class="grid" id="evaluation"></div>' if data["evaluation"] else "",
            _evaluation_tables(runs, labels, evaluations),
            "<h2>Curves</h2>",
            '<div class="grid" id="curves"></div>' if data["metrics"] else '<p class="muted">no metrics recorded yet</p>',
            "<h2>Distributions</h2>" if data["histogram"] or data["heatmap"] else "",
            '<div class="grid" id="distributions"></div>',
            "<h2>Layers</h2>" if data["layers"] or data["weights"] else "",
            '<div class="grid" id="layers"></div>',
            "<h2>Mixture of experts</h2>" if data["experts"] or data["moe"] else "",
            '<div class="grid" id="moe"></div>',
            _profiles_section(profile_summaries(main)),
            "<h2>Alerts</h2>",
            '<div class="grid" id="alerts-chart"></div>',
            _alerts_table(runs, labels),
            _batches_table(runs, labels),
            _rewinds_table(runs, labels),
            _stacks_section(runs, labels),
            "<h2>Config and tags</h2>",
            *(_config_section(r, lab, len(runs) > 1) for r, lab in zip(runs, labels, strict=True)),
        ]
    )
    template = string.Template((_HERE / "template.html").read_text(encoding="utf-8"))
    return template.substitute(
        title=_e(title),
        version=__version__,
        state_css=state_css(),
        body=body,
        data=_script_json(data),
        echarts=_script_text(echarts_js().read_text(encoding="utf-8")),
        script=_script_text(_inline_modules(asset_text("charts.js"), (_HERE / "report.js").read_text(encoding="utf-8"))),
    )


# -- chart data -----------------------------------------------------------------------------------
def _labels(runs: list[Run]) -> list[str]:
    labels = [r.id for r in runs]
    if len(set(labels)) < len(labels):
        labels = [f"{r.meta.get('project', r.path.parent.name)}/{r.id}" for r in runs]
    seen: dict[str, int] = {}
    out = []
    for lab in labels:
        seen[lab] = seen.get(lab, 0) + 1
        out.append(lab if seen[lab] == 1 else f"{lab} ({seen[lab]})")
    return out


def _step_range(runs: list[Run]) -> list[int] | None:
    """First and last step over every run, rank and metric: every curve shares this x axis."""
    lo = [int(r.series(m, rank=k).step.min()) for r in runs for k in r.ranks for m in r.metrics if len(r.series(m, rank=k))]
    hi = [r.last_step for r in runs if r.last_step is not None]
    return [min(lo), max(hi)] if lo and hi else None


def _metric_names(runs: list[Run], evaluations: list[EvalTable | None]) -> list[str]:
    # layers: their own charts; events: marks on their group's charts; one run's evaluation curve: its Evaluation chart
    apart = {ev.curve for ev in evaluations if ev is not None} if len(runs) == 1 else set()
    names = {m for r in runs for m in r.metrics if m not in vocab.NOT_CHARTED and not is_layer_metric(m) and not _is_event(m)}
    names = {m for m in names - apart if not m.startswith(_HEAT_ONLY)}
    plain = ordered_metrics({m for m in names if not m.startswith(_PER_LAYER)})
    return plain + [p + "*" for p in _PER_LAYER if any(m.startswith(p) for m in names)]  # one chart for all layers


def _metric_charts(runs: list[Run], labels: list[str], evaluations: list[EvalTable | None]) -> list[dict[str, Any]]:
    charts = []
    for name in _metric_names(runs, evaluations):
        series: list[dict[str, Any]] = []
        thinned = False
        first_curve: dict[int, int] = {}  # a run's first series on the chart: its events take that colour
        for i, (run, label) in enumerate(zip(runs, labels, strict=True)):
            metrics = sorted(m for m in run.metrics if m.startswith(name[:-1])) if name.endswith("*") else [name]
            for metric in metrics:
                for rank in run.ranks:
                    cols = run.columns.get(rank)
                    if cols is None or not len(cols.column(metric)[0]):
                        continue
                    first_curve.setdefault(i, len(series))
                    window = series_window(cols, metric, points=MAX_POINTS)  # as the dashboard's /api/series
                    line = window.line
                    thinned |= line.thinned
                    parts = [label] if len(runs) > 1 else []
                    if name.endswith("*"):
                        parts.append(metric[len(name) - 1 :])
                    if len(run.ranks) > 1:
                        parts.append(f"rank {rank}")
                    s = {"label": " ".join(parts) or metric, **window.wire(nonfinite_cap=100)}
                    ev = evaluations[i]
                    if ev is not None and ev.rank == rank and metric in ev.bests:  # marked, as on the dashboard's card
                        s["best"] = ev.bests[metric].to_dict()
                    series.append(s)
        if not series:
            continue
        values = np.array([p[1] for s in series for p in s["points"] if p[1] is not None], dtype=np.float64)
        log = bool(len(values) and values.min() > 0 and values.max() / values.min() > 1e3 and name == vocab.GRAD_NORM)
        note = f"thinned to {MAX_POINTS} points per series (min and max per bucket)" if thinned else ""
        if log:
            note = (note + "; " if note else "") + "log scale"
        events, cut = _event_marks(runs, _events_of(name), first_curve)
        note = "; ".join(n for n in (note, *cut) if n)
        known = vocab.get(name)  # its unit names the y axis and sets its range (memory from 0), as on the dashboard
        charts.append(
            {
                "name": name,
                "unit": known.unit if known else "",
                "series": series,
                "events": events,
                "log": log,
                "points_note": note,
                "marker": vocab.is_eval(name),  # an evaluation's: each point drawn, joined by a line
            }
        )
    return charts


def _evaluation_charts(runs: list[Run], labels: list[str], evaluations: list[EvalTable | None]) -> list[dict[str, Any]]:
    """Each run's Evaluation chart, the dashboard's card: its evaluation curve (an evaluation loss, else the primary)
    as points with its best marked, beside the training's loss on one axis; the epochs for the tooltip."""
    charts = []
    for run, label, ev in zip(runs, labels, evaluations, strict=True):
        if ev is None or ev.curve is None:
            continue
        cols = run.columns[ev.rank]
        series = []
        for metric in (ev.beside, ev.curve):
            if metric is None or not len(cols.column(metric)[0]):
                continue
            s = {"label": metric, **series_window(cols, metric, points=MAX_POINTS).wire(nonfinite_cap=100)}
            if metric == ev.curve:
                s.update(marker=True, best=ev.bests[metric].to_dict() if metric in ev.bests else None)
            series.append(s)
        epochs = series_window(cols, vocab.EPOCH, points=MAX_POINTS).line.points
        title = vocab.EVAL_TITLE + (f": {label}" if len(runs) > 1 else "")
        note = f"rank {ev.rank}" if len(run.ranks) > 1 else ""
        charts.append({"title": title, "note": note, "series": series, "epochs": epochs})
    return charts


def _is_event(name: str) -> bool:
    known = vocab.get(name)
    return known is not None and known.event


def _events_of(name: str) -> tuple[str, ...]:
    """The events the chart of ``name`` marks: its chart group's (``loss`` marks ``skipped``), as on the dashboard."""
    known = vocab.get(name)
    return next((g.events for g in vocab.CHART_GROUPS if known is not None and g.id == known.group), ())


def _event_marks(runs: list[Run], events: tuple[str, ...], first_curve: dict[int, int]) -> tuple[list[dict[str, Any]], list[str]]:
    """``line()``'s ``events``: each run's steps at which each event is 1 on any rank, each step once, as the dashboard
    marks them (``{name, xs}``; comparing runs, ``series``: the run's first curve, whose colour the marks take); and
    a note for each event with more steps than :data:`MAX_EVENT_MARKS`."""
    marks, cut = [], []
    for event in events:
        for i, run in enumerate(runs):
            parts = [run.series(event, rank=rank) for rank in run.ranks]
            steps = np.unique(np.concatenate([s.step[s.value > 0] for s in parts])) if parts else np.empty(0, np.int64)
            if not len(steps):
                continue
            mark: dict[str, Any] = {"name": event, "xs": steps[:MAX_EVENT_MARKS].tolist()}
            if len(runs) > 1 and i in first_curve:
                mark["series"] = first_curve[i]
            marks.append(mark)
            if len(steps) > MAX_EVENT_MARKS:
                cut.append(f"the first {MAX_EVENT_MARKS} of {len(steps):,} {event} steps marked")
    return marks, cut


def _histogram(runs: list[Run], labels: list[str], bins: int = 30, ticks: int = 6) -> dict[str, Any] | None:
    """The gradient-norm distribution: log bins when every norm is positive (one outlier then takes one bar at the
    right, not the whole range), a short rounded label at about ``ticks`` bins, each bin's range in its tooltip."""
    counted = [counted_values(run, vocab.GRAD_NORM) for run in runs]
    per_run = [values for values, _ in counted]
    finite = [v[np.isfinite(v)] for v in per_run]
    pooled = np.concatenate(finite) if finite else np.empty(0)
    if not len(pooled):
        return None
    lo, hi = float(pooled.min()), float(pooled.max())
    log = lo > 0 and hi > lo
    if hi == lo:
        edges = np.array([lo - 0.5, hi + 0.5]) if lo == 0 else np.array([lo * 0.95, hi * 1.05])
    elif log:
        edges = np.geomspace(lo, hi, bins + 1)
        edges[[0, -1]] = lo, hi  # exactly: a rounded last edge would leave the largest norm out
    else:
        edges = np.linspace(lo, hi, bins + 1)
    series = [
        {"label": lab, "counts": np.histogram(f, bins=edges)[0].tolist()}
        for lab, f in zip(labels, finite, strict=True)
        if len(f) or len(labels) == 1
    ]
    nonfinite = sum(int((~np.isfinite(v)).sum()) for v in per_run)
    once = any(len(from_ranks) < len(run.ranks) for run, (_, from_ranks) in zip(runs, counted, strict=True))
    whose = "one rank's: the same on every rank" if once else "every rank"
    note = f"{sum(len(f) for f in finite)} values, {whose}" + (f"; {nonfinite} non-finite not shown" if nonfinite else "")
    centres = np.sqrt(edges[:-1] * edges[1:]) if log else (edges[:-1] + edges[1:]) / 2
    every = max(1, math.ceil(len(centres) / ticks))
    shown = centres[::every].tolist()
    digits = next((d for d in range(2, 7) if len({format_number(c, d) for c in shown}) == len(shown)), 6)
    ticks_out = [format_number(float(c), digits) if i % every == 0 else "" for i, c in enumerate(centres.tolist())]
    ranges = [f"{format_number(a)} – {format_number(b)}" for a, b in zip(edges[:-1].tolist(), edges[1:].tolist(), strict=True)]
    return {"metric": vocab.GRAD_NORM, "labels": ticks_out, "ranges": ranges, "series": series, "log": bool(log), "note": note}


def _heatmap(run: Run, prefix: str = _ENTROPY, title: str | None = None) -> dict[str, Any] | None:
    """The heat map (members x step buckets, binned like the dashboard's) of a family recorded in the metrics file,
    ``<prefix><member>``: the attention entropy per layer, the stable rank per weight, the MoE routing per MoE layer
    (and per expert); of the first rank that has it."""
    layers = sorted((m for m in run.metrics if m.startswith(prefix)), key=layer_order)
    rank = next((r for r in run.ranks if any(len(run.series(m, rank=r)) for m in layers)), None)
    if not layers or rank is None:
        return None
    columns = [(s.step, s.value) for s in (run.series(m, rank=rank) for m in layers)]
    grid = bin_layers(columns, MAX_HEATMAP_STEPS)
    if not grid.values:
        return None
    samples = len(np.unique(np.concatenate([steps for steps, _ in columns])))
    note = f"rank {rank}, {samples} samples"
    if len(grid.steps) < samples:
        note += f", mean of each of {len(grid.steps)} step buckets"
    layer_names = [m[len(prefix) :] for m in layers]
    title = title or f"{vocab.ATTENTION_FAMILIES[0].title} per layer"
    return {"steps": grid.steps, "layers": layer_names, "values": grid.values, "note": note, "title": title}


def _moe(run: Run) -> dict[str, Any]:
    """The routing of the MoE layers: ``experts``, the expert load's grid (rows ``<layer>/<expert>`` x measured steps,
    binned as the dashboard's: report.js draws one step of it, experts x MoE layers, with charts.js's ``expertLoad``),
    and ``moe``, a heat map (MoE layers x steps) of each per-MoE-layer family the run has (imbalance, router entropy,
    dropped share), with the id of its chart."""
    experts, maps = None, []
    for family in vocab.MOE_FAMILIES:
        if family.per == "expert":
            experts = _heatmap(run, family.prefix, family.title)
        elif (found := _heatmap(run, family.prefix, f"{family.title} per MoE layer")) is not None:
            maps.append(found | {"id": f"chart-{family.name.replace('_', '-')}"})
    return {"experts": experts, "moe": maps}


def _layers(run: Run) -> dict[str, Any] | None:
    """Per-layer health of the first rank that has it: the last measured norms side by side, and heat maps
    of the gradient norm and the update ratio over steps (binned like the dashboard's)."""
    rank = next((r for r, cols in sorted(run.columns.items()) if cols.layer_metrics), None)
    if rank is None:
        return None
    metrics = run.columns[rank].layer_metrics
    layers = [m.partition("/")[2] for m in metrics if m.startswith(f"{LAYER_STATS[0]}/")]
    last: dict[str, list[float | None]] = {}
    maps: dict[str, dict[str, Any]] = {}
    step = None
    for stat in LAYER_STATS:
        series = [run.series(f"{stat}/{layer}", rank=rank) for layer in layers]
        if not any(len(s) for s in series):
            continue
        last[stat] = [_finite(float(s.value[-1])) if len(s) else None for s in series]
        step = max((int(s.step[-1]) for s in series if len(s)), default=step)
        grid = bin_layers([(s.step, s.value) for s in series], MAX_HEATMAP_STEPS)
        maps[stat] = {"steps": grid.steps, "layers": layers, "values": grid.values}
    if not last:
        return None
    out: dict[str, Any] = {
        "layers": layers,
        "last": last,
        "step": step,
        "heatmaps": maps,
        "note": f"rank {rank}, last measured at step {step}",
    }
    out["bars"] = [[stat, name] for stat, name in _NORM_BARS.items() if stat in last]
    out["maps"] = [[m.name, f"{m.title} per layer (log colour)"] for m in vocab.LAYER_FAMILIES if m.heat and m.name in maps]
    steps, hist = run.layer_histograms(rank)
    for kind in KINDS:  # the last histograms: a row per layer, bins as fractions of the layer's max |x|
        counts = histogram_grid(steps, hist, kind)
        if counts is not None:
            out[f"histogram_{kind}"] = {
                "steps": counts.bins,
                "layers": counts.layers,
                "values": counts.values,
                "step": counts.step,
            }
    return out


def _alerts_chart(runs: list[Run], labels: list[str]) -> dict[str, Any]:
    symbols = ("circle", "triangle", "diamond", "rect", "pin")
    series: list[dict[str, Any]] = []
    steps: list[int] = []
    for i, (run, label) in enumerate(zip(runs, labels, strict=True)):
        points = []
        for a in run.alerts:
            step = a.get("step")
            if not isinstance(step, int):
                continue
            sev = str(a.get("severity", "warning"))
            steps.append(step)
            tip = f"{_e(label)}<br>step {step} · {_e(sev)} · {_e(str(a.get('rule', '')))}<br>{_e(str(a.get('message', '')))}"
            points.append({"step": step, "severity": sev, "tip": tip})
        if points:
            series.append({"label": label, "symbol": symbols[i % len(symbols)], "points": points})
    last = max((r.last_step or 0 for r in runs), default=0)
    severities = list(SEVERITIES) + sorted({p["severity"] for s in series for p in s["points"]} - set(SEVERITIES))
    return {
        "series": series,
        "severities": severities,
        "min_step": 0,
        "max_step": max([last, *steps]) or 1,
        "note": f"{len(steps)} alerts",
    }


# -- HTML pieces ----------------------------------------------------------------------------------
def _banner(s: RunSummary, label: str, now: float) -> str:
    if s.state == "finished":
        return ""
    text = state_sentence(s.state, last_step=s.last_step, now=now, error=s.error, reason=s.reason, last_time=s.last_time)
    return f'<div class="banner banner-{_e(s.state)}">{_e(label)}: {_e(text)}</div>'


def _steps(s: RunSummary) -> str:
    """Steps done out of planned: ``12/20 (60 %)``; the last step alone for a run with no plan recorded."""
    if s.last_step is None:
        return "-"
    return Progress(s.last_step, s.total_steps).steps_text() if s.total_steps is not None else format_number(s.last_step)


def _summary_table(summaries: list[RunSummary], labels: list[str]) -> str:
    rows: list[tuple[str, list[str]]] = [
        ("state", [f'<span class="state state-{_e(s.state)}">{_e(s.state)}</span>' for s in summaries]),
        ("last_step", [_e(_steps(s)) for s in summaries]),
        ("records", [_e(str(s.records)) for s in summaries]),
        ("rank_text", [_e(s.rank_text) for s in summaries]),
        ("started_at", [_e(_time(s.started_at)) for s in summaries]),
        ("duration", [_e(format_duration(s.duration)) for s in summaries]),
        ("attempts", [_e(_attempts(s.attempts, s.time_lost)) for s in summaries]),
        ("final_loss", [_e(format_number(s.final_loss)) for s in summaries]),
        (
            "best_loss",
            [
                _e(format_number(s.best_loss) + (f" (step {s.best_loss_step})" if s.best_loss_step is not None else ""))
                for s in summaries
            ],
        ),
        ("best_eval", [_e(_best_eval(s)) for s in summaries]),
        ("first_nonfinite_loss_step", [_e(format_number(s.first_nonfinite_loss_step)) for s in summaries]),
        (
            "max_grad_norm",
            [
                _e(
                    format_number(s.max_grad_norm)
                    + (f" (step {s.max_grad_norm_step})" if s.max_grad_norm_step is not None else "")
                )
                for s in summaries
            ],
        ),
        (
            _pair("samples_per_second_p50", "samples_per_second_p5"),
            [_e(f"{format_number(s.samples_per_second_p50)} / {format_number(s.samples_per_second_p5)}") for s in summaries],
        ),
        (
            _pair("tokens_per_second_p50", "tokens_per_second_p5"),
            [_e(f"{format_number(s.tokens_per_second_p50)} / {format_number(s.tokens_per_second_p5)}") for s in summaries],
        ),
        ("tflops_p50", [_e(format_number(s.tflops_p50)) for s in summaries]),
        ("mfu_p50", [_e("-" if s.mfu_p50 is None else f"{format_number(s.mfu_p50)} %") for s in summaries]),
        ("data_wait_share", [_e(_percent(s.data_wait_share)) for s in summaries]),
        (
            "alerts",
            [
                " · ".join(f'<span class="sev-{_e(k)}">{_e(k)} {n}</span>' if n else f"{_e(k)} 0" for k, n in s.alerts.items())
                for s in summaries
            ],
        ),
        ("tags", [_tags(s.tags) for s in summaries]),
    ]
    head = "".join(f"<th>{_e(lab)}</th>" for lab in labels) if len(labels) > 1 else "<th>value</th>"
    body = "".join(
        f'<tr data-key="{_e(field_label(key))}"><th>{_e(field_label(key))}</th>'
        + "".join(f'<td class="num">{v}</td>' for v in vals)
        + "</tr>"
        for key, vals in rows
    )
    return f'<table id="summary"><thead><tr><th></th>{head}</tr></thead><tbody>{body}</tbody></table>'


def _best_eval(s: RunSummary) -> str:
    """``0.55 (eval/loss, step 120, epoch 3)``; ``-`` without an evaluation."""
    if s.best_eval is None:
        return "-"
    epoch = f", epoch {s.best_eval_epoch}" if s.best_eval_epoch is not None else ""
    return f"{format_number(s.best_eval)} ({s.best_eval_metric}, step {s.best_eval_step}{epoch})"


def _evaluation_tables(runs: list[Run], labels: list[str], evaluations: list[EvalTable | None]) -> str:
    """Each run's evaluations: step, epoch, every result, and how far the primary is from its best (the best's row
    marked)."""
    out = []
    multi = sum(ev is not None for ev in evaluations) > 1 or len(runs) > 1
    for i, (label, ev) in enumerate(zip(labels, evaluations, strict=True)):
        if ev is None:
            continue
        best = ev.best
        names = [ev.primary] + [m for m in ev.metrics if m != ev.primary] if ev.primary in ev.metrics else ev.metrics
        behind = f"from best ({ev.primary})"
        head = "".join(f"<th>{_e(c)}</th>" for c in ("step", "epoch", *names, behind))
        rows = []
        table = ev.table()
        for row in table[:MAX_EVAL_ROWS]:
            at_best = best is not None and row.step == best.step and row.values.get(best.metric) == best.value
            cells = [format_number(row.step), format_number(row.epoch), *(format_number(row.values.get(m)) for m in names)]
            cells.append(format_number(row.behind))
            tds = "".join(f'<td class="num">{_e(c)}</td>' for c in cells)
            mark = ' class="best"' if at_best else ""
            rows.append(f'<tr{mark} data-step="{row.step}">{tds}</tr>')
        if best is not None:
            better = "lower" if best.mode == "min" else "higher"
            where = f"step {best.step}" + (f", epoch {best.epoch}" if best.epoch is not None else "")
            caption = f"best {best.metric} {format_number(best.value)} at {where} ({better} is better)"
        else:
            caption = f"{ev.primary}: no finite value"
        more = f" · the first {MAX_EVAL_ROWS} of {len(table)} evaluations listed" if len(table) > MAX_EVAL_ROWS else ""
        table_id = "evaluations" if i == 0 else f"evaluations-{i}"
        out.append(
            (f"<h3>{_e(label)}</h3>" if multi else "")
            + f'<p class="muted">{_e(caption + more)}</p>'
            + f'<table id="{table_id}" data-run="{_e(label)}"><thead><tr>{head}</tr></thead>'
            + f"<tbody>{''.join(rows)}</tbody></table>"
            + _result_tables(last_tables(runs[i], ev.rank), table_id)
        )
    return "".join(out)


def _result_tables(found: ResultTables | None, table_id: str) -> str:
    """The newest evaluation's results that are not scalars (a confusion matrix), each a table of its rows."""
    if found is None:
        return ""
    where = f"step {found.step}" + (f", epoch {found.epoch}" if found.epoch is not None else "")
    out = []
    for name, rows in found.tables.items():
        matrix = rows if isinstance(rows, list) and all(isinstance(r, list) for r in rows) else [rows]
        width = max((len(r) for r in matrix), default=0)
        head = "<th></th>" + "".join(f"<th>{j}</th>" for j in range(width))
        body = "".join(
            f"<tr><th>{i}</th>" + "".join(f'<td class="num">{_e(format_number(v))}</td>' for v in r) + "</tr>"
            for i, r in enumerate(matrix)
        )
        out.append(
            f'<p class="muted">{_e(name)} at the evaluation after {_e(where)}</p>'
            f'<table class="result-table" id="{table_id}-{_e(name)}" data-result="{_e(name)}">'
            f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        )
    return "".join(out)


def _alerts_table(runs: list[Run], labels: list[str]) -> str:
    rows = [(lab, a) for run, lab in zip(runs, labels, strict=True) for a in run.alerts]
    if not rows:
        return '<p class="muted" id="no-alerts">no alerts</p>'
    multi = len(runs) > 1
    cols = ["time", "step", "rank", "severity", "rule", "metric", "value", "threshold", "message", "actions"]
    head = ("<th>run</th>" if multi else "") + "".join(f"<th>{c}</th>" for c in cols)
    out = []
    for lab, a in rows[:MAX_ALERT_ROWS]:
        sev = str(a.get("severity", ""))
        cells = [
            _time(a.get("t")),
            format_number(a.get("step")),
            format_number(a.get("rank")),
            f'<span class="sev-{_e(sev)}">{_e(sev)}</span>',
            a.get("rule"),
            a.get("metric"),
            format_number(a.get("value")),
            format_number(a.get("threshold")),
            a.get("message"),
            ", ".join(map(str, a.get("actions") or [])),
        ]
        tds = "".join(f"<td>{c if i == 3 else _e('' if c is None else str(c))}</td>" for i, c in enumerate(cells))
        out.append("<tr>" + (f"<td>{_e(lab)}</td>" if multi else "") + tds + "</tr>")
    more = f'<p class="muted">{len(rows) - MAX_ALERT_ROWS} more alerts not listed</p>' if len(rows) > MAX_ALERT_ROWS else ""
    return f'<table id="alerts"><thead><tr>{head}</tr></thead><tbody>{"".join(out)}</tbody></table>{more}'


def _record_of(run: Run, rank: int, step: int) -> dict[str, Any] | None:
    return record_at(run.layout.metrics(rank), step)


def _profiles_section(profiles: list[ProfileSummary]) -> str:
    """The main run's profiles, each as the run page's Profiles panel shows it; nothing without one."""
    if not profiles:
        return ""
    out = ["<h2>Profiles</h2>"]
    for p in profiles:
        out.append(
            f'<h3 id="profile-{p.first_step}">steps {p.first_step}–{p.last_step}</h3>'
            f'<p class="muted">{_e(p.ranks_text())} · {_e(p.state_text())} · asked by {_e(p.asked)}</p>'
        )
        out.append(_profile_table(p))
        folders = "".join(
            f'<li data-rank="{r.rank}">rank {r.rank}: open <code>{_e(r.folder)}</code> in MindStudio Insight'
            + (" (its Chrome trace: <code>ASCEND_PROFILER_OUTPUT/trace_view.json</code> in it)" if r.trace else "")
            + (f' · <span class="sev-error">{_e(r.error)}</span>' if r.error else "")
            + "</li>"
            for r in p.rank_parts
            if r.folder
        )
        out.append(f'<ul class="profile-files">{folders}</ul>' if folders else "")
    return "".join(out)


def _profile_table(p: ProfileSummary) -> str:
    """The top op types (a row each) with every rank side by side (time, share; the rank that spent the most marked),
    then each rank's mean step time over the profiled steps and the steps before."""
    head = '<tr><th rowspan="2">op type</th>' + "".join(f'<th colspan="2">rank {r}</th>' for r in p.ranks) + "</tr>"
    head += "<tr>" + "<th>time</th><th>share</th>" * len(p.ranks) + "</tr>"
    rows = []
    for op in p.ops:
        cells = []
        for i, rank in enumerate(p.ranks):
            ms, share = op.ms[i], op.share[i]
            most = ' class="num most"' if i == op.most else ' class="num"'
            cells.append(
                f'<td{most} data-rank="{rank}" data-ms="{"" if ms is None else ms!r}">{_e(_ms(ms))}</td>'
                f'<td class="num">{_e(_percent(share))}</td>'
            )
        rows.append(f'<tr data-op="{_e(op.op_type)}"><th>{_e(op.op_type)}</th>{"".join(cells)}</tr>')
    # each rank's: the profiled steps' mean step time (s), the steps before's, and how many times as long
    times = [
        ("during", f"step time, steps {p.first_step}–{p.last_step}", [t.profiled for t in p.step_times]),
        ("before", f"step time, the {p.steps_before} steps before", [t.before for t in p.step_times]),
        ("ratio", "times as long", [t.ratio for t in p.step_times]),
    ]
    foot = "".join(
        f'<tr data-times="{key}"><th>{_e(label)}</th>'
        + "".join(
            f'<td class="num" colspan="2" data-value="{"" if v is None else v!r}">'
            + _e(("-" if v is None else f"×{v:.2f}") if key == "ratio" else _ms(None if v is None else 1000 * v))
            + "</td>"
            for v in values
        )
        + "</tr>"
        for key, label, values in times
    )
    empty = "" if p.ops else '<caption class="muted">no op statistics: MindSpore writes them when the profile stops</caption>'
    return (
        f'<table class="profile-ops" data-first-step="{p.first_step}">{empty}<thead>{head}</thead>'
        f'<tbody>{"".join(rows)}</tbody><tfoot class="profile-times">{foot}</tfoot></table>'
    )


def _ms(ms: float | None) -> str:
    return "-" if ms is None else f"{format_number(ms)} ms"


def _rewinds_table(runs: list[Run], labels: list[str]) -> str:
    """The rewinds: where each acted, the snapshot it went back to, the batches it passed over, what asked for it."""
    rows = [(lab, r) for run, lab in zip(runs, labels, strict=True) for r in run_rewinds(run.alerts)]
    if not rows:
        return ""
    multi = len(runs) > 1
    cols = ["at step", "to step", "batches passed over", "asked by", "ranks"]
    head = ("<th>run</th>" if multi else "") + "".join(f"<th>{c}</th>" for c in cols)
    out = []
    for lab, r in rows:
        cause = (r.cause or "") + (f" at step {r.cause_step}" if r.cause_step is not None else "")
        cells = [
            format_number(r.step),
            format_number(r.to_step),
            f"{r.skipped_batches}" + (f" ({r.span})" if r.span else ""),
            cause,
            ", ".join(map(str, r.ranks)),
        ]
        tds = "".join(f"<td>{_e(c)}</td>" for c in cells)
        out.append("<tr>" + (f"<td>{_e(lab)}</td>" if multi else "") + tds + "</tr>")
    return f'<h3>Rewinds</h3><table id="rewinds"><thead><tr>{head}</tr></thead><tbody>{"".join(out)}</tbody></table>'


def _batches_table(runs: list[Run], labels: list[str]) -> str:
    """The flagged batches (``mindwatch batches``): the steps an anomaly alert named, with where their batch came from."""
    rows = [
        (lab, b) for run, lab in zip(runs, labels, strict=True) for b in flagged_batches(run.alerts, partial(_record_of, run))
    ]
    if not rows:
        return ""
    multi = len(runs) > 1
    cols = ["step", "rank", "epoch", "batch", "alerts", "sample ids"]
    head = ("<th>run</th>" if multi else "") + "".join(f"<th>{c}</th>" for c in cols)
    out = []
    for lab, b in rows[:MAX_ALERT_ROWS]:
        cells = [
            format_number(b.step),
            format_number(b.rank),
            format_number(b.epoch),
            format_number(b.batch),
            ", ".join(b.rules),
            ids_text(b.sample_ids) or (b.note or ""),
        ]
        tds = "".join(f"<td>{_e(c)}</td>" for c in cells)
        out.append("<tr>" + (f"<td>{_e(lab)}</td>" if multi else "") + tds + "</tr>")
    return f'<h3>Flagged batches</h3><table id="batches"><thead><tr>{head}</tr></thead><tbody>{"".join(out)}</tbody></table>'


def _stacks_section(runs: list[Run], labels: list[str]) -> str:
    """Each rank's newest stall stack dump (every node's ``stacks/``; a rank on another host sends its dump to rank 0):
    where the rank was, and the dump itself, folded."""
    rows = []
    for run, lab in zip(runs, labels, strict=True):
        for rank, path in sorted(newest_dumps(run.layout).items()):
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            place = locate(rank, text, path.name)
            more = f"\n... ({len(text) - MAX_DUMP_CHARS} more characters in {path})" if len(text) > MAX_DUMP_CHARS else ""
            rows.append(
                f"<tr>{f'<td>{_e(lab)}</td>' if len(runs) > 1 else ''}<td>{rank}</td><td>{_e(place.description)}</td>"
                f"<td>{_e(place.detail)}</td><td><details><summary>{_e(path.name)}</summary>"
                f"<pre>{_e(text[:MAX_DUMP_CHARS])}{_e(more)}</pre></details></td></tr>"
            )
    if not rows:
        return ""
    head = ("<th>run</th>" if len(runs) > 1 else "") + "<th>rank</th><th>where</th><th>detail</th><th>stack dump</th>"
    return f'<h3>Stack dumps</h3><table id="stacks"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def _config_section(run: Run, label: str, multi: bool) -> str:
    meta = run.meta
    facts = [
        ("run", run.id),
        ("project", meta.get("project")),
        ("directory", str(run.path)),
        ("world size", meta.get("world_size")),
        ("hosts", ", ".join(map(str, meta.get("hosts") or []))),
        ("command", " ".join(map(str, meta.get("command") or []))),
        ("versions", ", ".join(f"{k} {v}" for k, v in (meta.get("versions") or {}).items())),
    ]
    table = "".join(f"<tr><th>{_e(k)}</th><td>{_e('' if v is None else str(v))}</td></tr>" for k, v in facts)
    config = json.dumps(meta.get("config", {}), indent=2, sort_keys=True, default=str)
    head = f"<h3>{_e(label)}</h3>" if multi else ""
    return (
        f"{head}<p>{_tags(meta.get('tags', []))}</p><table>{table}</table>"
        f'<details open><summary>config snapshot (meta.json)</summary><pre class="config">{_e(config)}</pre></details>'
    )


def _pair(first: str, second: str) -> str:
    """One row of two fields that differ in their last word: ``samples/s p50 / p5``."""
    return f"{field_label(first)} / {field_label(second).rpartition(' ')[2]}"


def _tags(tags: Any) -> str:
    return "".join(f'<span class="tag">{_e(t)}</span>' for t in tag_texts(tags)) or '<span class="muted">none</span>'


# -- formatting -----------------------------------------------------------------------------------
def _e(text: str) -> str:
    return html.escape(text, quote=True)


def _finite(v: float) -> float | None:
    return v if math.isfinite(v) else None


def _percent(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f} %"


def _attempts(attempts: int, lost: float | None) -> str:
    if attempts <= 1:
        return str(attempts or 1)
    return f"{attempts} ({format_duration(lost)} lost between them)"


def _now() -> float:
    return _dt.datetime.now().timestamp()


def _time(t: Any) -> str:
    if not isinstance(t, (int, float)) or not math.isfinite(t):
        return "-"
    return _dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


def _script_json(data: dict[str, Any]) -> str:
    # inside <script>: '<' escaped so no '</script>' or '<!--' in the data can end the element
    return json.dumps(data, allow_nan=False, separators=(",", ":")).replace("<", "\\u003c")


def _inline_modules(*modules: str) -> str:
    """ES modules as one inline module: their ``import`` lines dropped, each ``export`` keyword removed.

    An inline module cannot import another file, and the report must stay one file that works
    offline; so the modules are concatenated in order (each one's imports come before it).
    """
    out = []
    for text in modules:
        for line in text.splitlines():
            if line.startswith("import "):
                if not line.rstrip().endswith(";"):
                    raise ValueError(f"write each import on one line, ending in ';', to inline it: {line[:80]!r}")
                continue
            if line.startswith("export "):
                line = line[len("export ") :]
                if not _DECLARATION.match(line):
                    raise ValueError(f"only 'export function/const/let/class' can be inlined, got {line[:80]!r}")
            out.append(line)
    return "\n".join(out)


def _script_text(js: str) -> str:
    return js.replace("</script", "<\\/script").replace("</SCRIPT", "<\\/SCRIPT")
