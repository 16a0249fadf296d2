"""The dashboard's JSON API: runs, one run, chart series (downsampled), heat maps, alerts, compare.

Example (with the app from :func:`mindwatch.serve.app.create_app`)::

    GET /api/runs?columns=config.optimizer.lr,final_loss&filter=lr%20>%201e-3&sort=-final_loss
    GET /api/run?run=gpt/run_1
    GET /api/series?run=gpt/run_1&metric=loss&rank=0&x=step&lo=1000&hi=2000&points=2000
    GET /api/csv?run=gpt/run_1&metrics=loss,lr&ranks=0       # every recorded point, not thinned: step,time,metric,rank,value
    HEAD /api/csv?run=gpt/run_1&metrics=loss&name=loss        # only its file name (Content-Disposition): the PNG's too
    GET /api/heatmap?run=gpt/run_1&prefix=attention_entropy/&buckets=100
    GET /api/vocabulary                      # mindwatch.metrics: names, families, chart groups; the states' colours
    GET /api/alerts?run=gpt/run_1
    GET /api/histograms?run=gpt/run_1&rank=0             # the layers' last weight and gradient histograms
    GET /api/compare?runs=gpt/run_1,gpt/run_2&metric=loss&x=elapsed   # one metric of every run
    GET /api/compare/runs?runs=gpt/run_1,gpt/run_2                     # their summaries and config keys

Every bad query value is a 400 with a message that says what to send; nothing else is exposed. The queries are plain
functions named for what they return (:func:`thinned_series`, :func:`band_points`, ...); :class:`Api`'s methods are the
endpoints, named for their routes.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from mindwatch import metrics as vocab
from mindwatch.analysis.bands import CROSS_RANK_METRICS, Band, band_of, band_of_rows
from mindwatch.analysis.config_diff import MISSING, config_diff
from mindwatch.analysis.downsample import keep_extremes
from mindwatch.analysis.heatmap import HEATMAP_BUCKETS, bin_layers, layer_order
from mindwatch.analysis.histograms import KINDS, histogram_grid
from mindwatch.analysis.lines import branch_points, line_points
from mindwatch.analysis.progress import run_progress
from mindwatch.analysis.state_colours import state_css
from mindwatch.analysis.state_text import error_headline
from mindwatch.analysis.summary import RunSummary, field_label, summarize_run
from mindwatch.analysis.tags import tag_texts
from mindwatch.checks.listing import COLUMN_LABELS, FILTER_EXAMPLE, SUMMARY_COLUMNS, RuleError, RunFilter, run_columns, sort_key
from mindwatch.serve.cursor import cursor_of
from mindwatch.serve.views import BadRequest, Catalog, RunView
from mindwatch.store.bandfiles import band_path, read_band_file
from mindwatch.store.jsonl import encode_number
from mindwatch.store.layout import read_json
from mindwatch.store.reader import Series
from mindwatch.units import format_duration, format_number

MAX_POINTS = 20_000
MAX_COMPARE = 12
#: The compare page's names of the RunSummary fields (:data:`mindwatch.analysis.summary.LABELS`).
SUMMARY_LABELS = {name: field_label(name) for name in (*(f.name for f in fields(RunSummary)), "duration", "rank_text")}

#: The most series one CSV download holds (a heat map's family: one per layer, for each rank shown).
MAX_CSV_SERIES = 1024
_METRIC = re.compile(r"^[\w./@:+\-\[\] ]{1,200}$")


# -- query values -------------------------------------------------------------
def int_param(req: Request, name: str, default: int | None, lo: int, hi: int) -> int | None:
    raw = req.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"{name} must be an integer between {lo} and {hi}, got {raw[:40]!r}") from None
    if not lo <= value <= hi:
        raise BadRequest(f"{name} must be between {lo} and {hi}, got {value}")
    return value


def float_param(req: Request, name: str) -> float | None:
    raw = req.query_params.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise BadRequest(f"{name} must be a number, got {raw[:40]!r}") from None
    if not math.isfinite(value):
        raise BadRequest(f"{name} must be a finite number, got {raw[:40]!r}")
    return value


def choice_param(req: Request, name: str, choices: tuple[str, ...]) -> str:
    raw = req.query_params.get(name) or choices[0]
    if raw not in choices:
        raise BadRequest(f"{name} must be one of {', '.join(choices)}, got {raw[:40]!r}")
    return raw


def metric_param(req: Request, name: str = "metric") -> str:
    return check_metric(req.query_params.get(name), name)


def check_metric(raw: str | None, name: str = "metric") -> str:
    """``raw`` if it looks like a metric name; BadRequest otherwise."""
    if not raw:
        raise BadRequest(f"{name} is required, e.g. {name}=loss")
    if not _METRIC.match(raw):
        raise BadRequest(f"{name} {raw[:40]!r} is not a metric name (letters, digits, _ . / @ : + - [ ] and spaces)")
    return raw


def runs_query(req: Request) -> tuple[list[str], str, str]:
    """The runs table's view: ``columns`` (comma-separated), ``filter`` (a rule), ``sort`` (``-`` for descending)."""
    columns = [c for c in (req.query_params.get("columns") or "").split(",") if c]
    if len(columns) > 50:
        raise BadRequest(f"at most 50 columns, got {len(columns)}")
    for c in columns:
        check_metric(c, "columns")
    sort = req.query_params.get("sort") or ""
    if sort:
        check_metric(sort.lstrip("-"), "sort")
    return columns, req.query_params.get("filter") or "", sort


def runs_param(req: Request, catalog: Catalog) -> list[RunView]:
    """The runs to compare: ``runs``, comma-separated run ids (at most :data:`MAX_COMPARE`)."""
    ids = [r for r in (req.query_params.get("runs") or "").split(",") if r]
    if not ids:
        raise BadRequest("runs is required: comma-separated run ids from /api/runs")
    if len(ids) > MAX_COMPARE:
        raise BadRequest(f"compare at most {MAX_COMPARE} runs at once, got {len(ids)}")
    return [catalog.open(r) for r in ids]


def run_param(req: Request, catalog: Catalog, name: str = "run") -> RunView:
    raw = req.query_params.get(name)
    if not raw:
        raise BadRequest(f"{name} is required: a run id from /api/runs, like 'project/run_20261129_074500'")
    return catalog.open(raw)


# -- queries (plain functions: the live stream and the benchmark reuse them) ----------------------
def progress_info(view: RunView, state: str | None) -> dict[str, Any]:
    """:func:`mindwatch.analysis.progress.run_progress` as JSON (``view.lock`` held); no ETA unless running, and then
    the rate is the run's average (``rate: "average"``), not a pace it no longer has."""
    progress = run_progress(view, running=state == "running").as_dict()
    if state != "running":
        progress["eta_secs"] = None  # an ended (or stalled, or killed) run has no time left to estimate
    return progress


def run_info(view: RunView) -> dict[str, Any]:
    view.refresh()
    with view.lock:
        meta = view.meta
        status = view.status_summary()
        progress = progress_info(view, status.get("state"))
        return {
            "id": view.id,
            "project": meta.get("project"),
            "tags": meta.get("tags", []),
            "tag_texts": tag_texts(meta.get("tags")),
            "notes": {k: view.notes[k] for k in ("name", "note") if view.notes.get(k)},
            "config": meta.get("config", {}),
            "meta": {k: v for k, v in meta.items() if k not in ("config", "tags")},
            "metrics": view.metrics,
            "ranks": view.ranks,
            "status": status,
            "progress": progress,
            "alert_count": len(view.alerts),
            "attempts": view.attempts,
            "band_metrics": [m for m in CROSS_RANK_METRICS if len(view.columns) > 1],
            "cursor": cursor_of(view),
        }


def runs_table(
    summaries: list[dict[str, Any]], columns: list[str], filter_text: str = "", sort: str = "", now: float | None = None
) -> dict[str, Any]:
    """The runs page: every run's listing with the chosen ``columns``' values, filtered and sorted on the server.

    ``filter_text``: a rule of :mod:`mindwatch.checks.listing` (a bad one is a BadRequest pointing at
    its column); ``sort``: a column, ``-column`` for descending; missing values sort last either way.
    """
    try:
        keep = RunFilter(filter_text) if filter_text.strip() else None
    except RuleError as e:
        raise BadRequest(f"filter: {e.pointed()}") from None
    available: set[str] = set()
    rows = []
    for s in summaries:
        values = run_columns(s)
        available.update(values)
        try:
            if keep is not None and not keep(values):
                continue
        except RuleError as e:
            raise BadRequest(f"filter: {e.pointed()}") from None
        rows.append((s, values))
    key = sort.lstrip("-")
    if key:
        present = [r for r in rows if sort_key(r[1].get(key))[0] < 2]
        present.sort(key=lambda r: sort_key(r[1].get(key)), reverse=sort.startswith("-"))
        rows = present + [r for r in rows if sort_key(r[1].get(key))[0] == 2]
    else:
        rows.sort(key=lambda r: -(r[0].get("started_at") or 0))
    out = []
    for s, values in rows:
        row = {k: v for k, v in s.items() if k != "config"}
        row["final_loss"] = _json_value(row.get("final_loss"))
        row["error_headline"] = error_headline(row.get("error"))  # what went wrong; the whole error stays in "error"
        row["tag_texts"] = tag_texts(row.get("tags"))
        row["values"] = {c: _json_value(values.get(c)) for c in columns}
        out.append(row)
    extra = sorted(available.difference(SUMMARY_COLUMNS))
    return {
        "runs": out,
        "total": len(summaries),
        "columns": [*SUMMARY_COLUMNS, *extra],
        "labels": {**COLUMN_LABELS, "tags": field_label("tags")},
        "filter_example": f"filter, e.g. {FILTER_EXAMPLE}",
        "now": now or time.time(),
    }


def _json_value(v: Any) -> Any:
    return encode_number(v) if isinstance(v, float) else v


def thinned_series(
    view: RunView,
    metric: str,
    rank: int | None = None,
    x: str = "step",
    lo: float | None = None,
    hi: float | None = None,
    points: int = 2000,
    refresh: bool = True,
) -> dict[str, Any]:
    """One metric of one rank in the window [lo, hi] of x, thinned to ``points`` keeping min/max per bucket."""
    if refresh:
        view.refresh()
    with view.lock:
        if rank is None:
            rank = min(view.columns) if view.columns else 0
        cols = view.columns.get(rank)
        if cols is None:
            raise BadRequest(f"rank {rank} has no metrics in run {view.id!r}; ranks: {sorted(view.columns)}")
        line, value = cols.column(metric)
        step = cols.steps[line]
        xs = step if x == "step" else cols.time_of_lines(line)
        total = len(xs)
        if lo is not None or hi is not None:
            keep = np.ones(total, dtype=bool)
            if lo is not None:
                keep &= xs >= lo
            if hi is not None:
                keep &= xs <= hi
            xs, value = xs[keep], value[keep]
        drawn = line_points(xs, value, points)
        return {
            "run": view.id,
            "metric": metric,
            "rank": rank,
            "x": x,
            "total": total,
            "in_window": int(len(xs)),
            **drawn.wire(),
            "abandoned": _abandoned(cols, metric, line, x, lo, hi, points) if cols.rewound else [],
            "cursor": cursor_of(view),
        }


def _abandoned(cols: Any, metric: str, kept: np.ndarray, x: str, lo: float | None, hi: float | None, points: int) -> list:
    """The values of ``metric`` that later steps replaced (a rewind's abandoned branch), as gapped points."""
    raw_line, raw_value = cols.raw_column(metric)
    gone = np.flatnonzero(~np.isin(raw_line, kept))
    if not len(gone):
        return []
    line = raw_line[gone]
    xs = cols.steps[line] if x == "step" else cols.time_of_lines(line)
    inside = np.ones(len(xs), dtype=bool)
    if lo is not None:
        inside &= xs >= lo
    if hi is not None:
        inside &= xs <= hi
    gone, xs, value = gone[inside], xs[inside], raw_value[gone][inside]
    if not len(xs):
        return []
    # a branch ends where the next abandoned value is not the next one written, or its step goes back
    starts = np.flatnonzero(np.r_[True, (np.diff(gone) != 1) | (np.diff(cols.steps[raw_line[gone]]) <= 0)])
    return branch_points(xs, value, starts, points)


def compare_series(views: list[RunView], metric: str, x: str = "step", points: int = 2000) -> dict[str, Any]:
    """``metric`` of each run (its lowest rank), by step, wall-clock time, or ``elapsed``: seconds since each run's start."""
    out = []
    for view in views:
        view.refresh()
        if view.columns:
            s = thinned_series(view, metric, x="step" if x == "step" else "time", points=points, refresh=False)
        else:  # a run that has not written a step yet
            s = {"run": view.id, "metric": metric, "total": 0, "points": [], "nonfinite": []}
        if x == "elapsed" and s["points"]:
            t0 = view.meta.get("started_at") or s["points"][0][0]
            s["points"] = [[p[0] - t0, p[1]] for p in s["points"]]
            s["nonfinite"] = [[p[0] - t0, p[1]] for p in s["nonfinite"]]
        s["state"] = view.status_summary()["state"]
        out.append(s)
    return {"metric": metric, "x": x, "series": out}


def compare_tables(views: list[RunView]) -> dict[str, Any]:
    """The compare page's tables: each run's :class:`~mindwatch.analysis.summary.RunSummary` (the full form) and
    metrics, and every config key with each run's value (``present`` false where a run has none)."""
    runs = []
    for view in views:
        view.refresh()
        with view.lock:
            summary = summarize_run(view)
        row = {k: _json_value(v) for k, v in summary.to_dict().items() if k not in ("config", "path")}
        # its numbers as the report and `mindwatch runs` print them (units.format_number: 4 significant digits)
        text = {k: format_number(v) for k, v in summary.to_dict().items() if isinstance(v, float)}
        text["duration"] = format_duration(summary.duration)  # as the report's summary and `mindwatch runs` say it
        if summary.error:
            text["error"] = error_headline(summary.error) or summary.error
        runs.append({"id": view.id, "rank_text": summary.rank_text, "summary": row, "text": text, "metrics": view.metrics})
    configs = [view.meta.get("config") or {} for view in views]
    keys = [
        {
            "key": k.key,
            "differs": k.differs,
            "values": [None if v is MISSING else _json_value(v) for v in k.values],
            "present": [v is not MISSING for v in k.values],
        }
        for k in config_diff(configs)
    ]
    return {"runs": runs, "config": keys, "labels": SUMMARY_LABELS}


def _csv_number(v: float) -> str:
    return repr(v) if math.isfinite(v) else ("nan" if math.isnan(v) else ("inf" if v > 0 else "-inf"))


def series_csv(view: RunView, metrics: list[str], ranks: list[int] | None = None) -> str:
    """Every recorded point of ``metrics`` on ``ranks`` (default: the lowest rank), not thinned, as CSV: one row a point
    in file order, ``step,time,metric,rank,value`` (time in epoch seconds, empty where a line has none; NaN/Inf as
    ``nan``/``inf``/``-inf``). The charts' per-chart CSV download."""
    view.refresh()
    with view.lock:
        shown = ranks or ([min(view.columns)] if view.columns else [])
        out = ["step,time,metric,rank,value"]
        for rank in shown:
            cols = view.columns.get(rank)
            if cols is None:
                raise BadRequest(f"rank {rank} has no metrics in run {view.id!r}; ranks: {sorted(view.columns)}")
            for metric in metrics:
                line, value = cols.column(metric)
                steps, times = cols.steps[line].tolist(), cols.time_of_lines(line).tolist()
                name = metric.replace('"', '""')
                name = f'"{name}"' if any(c in name for c in ',"\n') else name
                out.extend(
                    f"{s},{'' if t != t else repr(t)},{name},{rank},{_csv_number(v)}"
                    for s, t, v in zip(steps, times, value.tolist(), strict=True)
                )
        return "\n".join(out) + "\n"


def csv_file_name(run_id: str, metrics: list[str], chart: str | None = None) -> str:
    """``gpt_run_1_loss.csv``: the run and the chart's name (else the first metric), in characters every file system
    takes. The page names a chart's PNG after it (``HEAD /api/csv``), so both downloads of a chart share a name."""
    stem = f"{run_id}_{chart}" if chart else f"{run_id}_{metrics[0]}" + ("_etc" if len(metrics) > 1 else "")
    return re.sub(r"[^\w.-]+", "_", stem)[:120] + ".csv"


def band_points(view: RunView, metric: str, points: int = 2000, refresh: bool = True) -> dict[str, Any]:
    """Per-step min / mean / max of ``metric`` across ranks (:mod:`mindwatch.analysis.bands`), thinned keeping extremes."""
    b = band_across_ranks(view, metric, refresh)
    half = max(points // 2, 10)
    idx = np.union1d(keep_extremes(b.step, b.max, half), keep_extremes(b.step, -b.min, half))
    rows = np.stack([b.min[idx], b.mean[idx], b.max[idx]], axis=1)
    clean = np.where(np.isfinite(rows), rows, np.nan).tolist()
    return {
        "run": view.id,
        "metric": metric,
        "ranks": b.ranks,
        "points": [[s, *(None if v != v else v for v in r)] for s, r in zip(b.step[idx].tolist(), clean, strict=True)],
    }


def band_across_ranks(view: RunView, metric: str, refresh: bool = True) -> Band:
    """The band from rank 0's band file when the run has one, else from every rank's columns."""
    b = band_from_file(view, metric)
    if b is not None:
        return b
    if refresh:
        view.refresh()
    with view.lock:
        per_rank = {}
        for rank, cols in view.columns.items():
            line, value = cols.column(metric)
            if len(line):
                per_rank[rank] = Series(cols.steps[line], value, np.empty(0))
        return band_of(metric, per_rank)


def outlier_ranks(view: RunView, metric: str, k: int = 5) -> dict[str, Any]:
    """The ``k`` ranks most often at the edge of the band (the max or the min of ``metric`` across ranks), most first:
    the ranks the per-rank overlay draws by default when a run has too many to draw them all."""
    b = band_across_ranks(view, metric)
    edges = np.concatenate([b.argmax[b.count > 2], b.argmin[b.count > 2]])  # with 2 ranks every rank is an edge
    edges = edges[edges >= 0]
    ranks, times = np.unique(edges, return_counts=True)
    order = np.lexsort((ranks, -times))[:k]
    return {"run": view.id, "metric": metric, "ranks": ranks[order].tolist(), "times": times[order].tolist(), "steps": len(b)}


def band_from_file(view: RunView, metric: str) -> Band | None:
    """The band rank 0 wrote while the run went (``bands/``): one small file, not every rank's columns."""
    path = Path(band_path(view.layout, metric))
    if not view.readable(path):
        return None
    rows = read_band_file(view.layout, metric)
    if rows is None or not len(rows):
        return None
    world = (view.meta or read_json(view.layout.meta) or {}).get("world_size")
    ranks = list(range(int(world))) if isinstance(world, int) else list(range(int(rows["count"].max())))
    return band_of_rows(metric, rows, ranks)


def layer_heatmap(view: RunView, prefix: str, rank: int | None, buckets: int) -> dict[str, Any]:
    """Mean of each ``<prefix><layer>`` metric per step bucket (:func:`mindwatch.analysis.heatmap.bin_layers`)."""
    view.refresh()
    with view.lock:
        if rank is None:
            rank = min(view.columns) if view.columns else 0
        cols = view.columns.get(rank)
        in_model_order = [m for m in cols.layer_metrics if m.startswith(prefix)] if cols is not None else []
        names = in_model_order or sorted((m for m in view.metrics if m.startswith(prefix)), key=layer_order)
        if cols is None or not names:
            return {"run": view.id, "prefix": prefix, "layers": [], "steps": [], "values": []}
        data = []
        for name in names:
            line, value = cols.column(name)
            data.append((cols.steps[line], value))
        grid = bin_layers(data, buckets)
        return {"run": view.id, "prefix": prefix, "layers": names, "steps": grid.steps, "values": grid.values}


def histogram_grids(view: RunView, rank: int | None) -> dict[str, Any]:
    """The last recorded histograms of each layer's weights and gradients (:mod:`mindwatch.analysis.histograms`)."""
    view.refresh()
    with view.lock:
        if rank is None:
            rank = min(view.columns) if view.columns else 0
        steps, hist = view.layer_histograms(rank)
        grids = {kind: histogram_grid(steps, hist, kind) for kind in KINDS}
        return {"run": view.id, "rank": rank, **{kind: g.as_dict() if g else None for kind, g in grids.items()}}


def page_vocabulary() -> dict[str, Any]:
    """What the pages read once (``GET /api/vocabulary``): the metric vocabulary (:func:`mindwatch.metrics.vocabulary`)
    and ``state_css``, the states' colours (:func:`mindwatch.analysis.state_colours.state_css`)."""
    return {**vocab.vocabulary(), "state_css": state_css()}


# -- endpoints -----------------------------------------------------------------------------
class Api:
    """Starlette endpoints bound to one catalog."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog

    def vocabulary(self, req: Request) -> JSONResponse:
        return JSONResponse(page_vocabulary())

    def runs(self, req: Request) -> JSONResponse:
        columns, filter_text, sort = runs_query(req)
        return JSONResponse(runs_table(self.catalog.summaries(), columns, filter_text, sort))

    def run(self, req: Request) -> JSONResponse:
        return JSONResponse(run_info(run_param(req, self.catalog)))

    def series(self, req: Request) -> JSONResponse:
        view = run_param(req, self.catalog)
        return JSONResponse(
            thinned_series(
                view,
                metric_param(req),
                rank=int_param(req, "rank", None, 0, 1 << 20),
                x=choice_param(req, "x", ("step", "time")),
                lo=float_param(req, "lo"),
                hi=float_param(req, "hi"),
                points=int_param(req, "points", 2000, 10, MAX_POINTS) or 2000,
            )
        )

    def csv(self, req: Request) -> Response:
        view = run_param(req, self.catalog)
        metrics = [check_metric(m, "metrics") for m in (req.query_params.get("metrics") or "").split(",") if m]
        if not metrics:
            raise BadRequest("metrics is required: comma-separated metric names, e.g. metrics=loss,lr")
        raw_ranks = [r for r in (req.query_params.get("ranks") or "").split(",") if r]
        if not all(r.isdigit() for r in raw_ranks):
            raise BadRequest(f"ranks must be comma-separated rank numbers, e.g. ranks=0,1; got {','.join(raw_ranks)[:40]!r}")
        ranks = [int(r) for r in raw_ranks]
        if len(metrics) * max(len(ranks), 1) > MAX_CSV_SERIES:
            raise BadRequest(f"at most {MAX_CSV_SERIES} series (metrics x ranks) in one CSV, got {len(metrics) * len(ranks)}")
        name = csv_file_name(view.id, metrics, req.query_params.get("name"))
        headers = {"Content-Disposition": f'attachment; filename="{name}"'}
        if req.method == "HEAD":  # the file's name only (the chart's PNG takes it): no points read
            return Response(media_type="text/csv", headers=headers)
        return Response(series_csv(view, metrics, ranks), media_type="text/csv", headers=headers)

    def band(self, req: Request) -> JSONResponse:
        view = run_param(req, self.catalog)
        return JSONResponse(band_points(view, metric_param(req), points=int_param(req, "points", 2000, 10, MAX_POINTS) or 2000))

    def outliers(self, req: Request) -> JSONResponse:
        view = run_param(req, self.catalog)
        return JSONResponse(outlier_ranks(view, metric_param(req), k=int_param(req, "k", 5, 1, 100) or 5))

    def heatmap(self, req: Request) -> JSONResponse:
        view = run_param(req, self.catalog)
        prefix = req.query_params.get("prefix") or f"{vocab.ATTENTION_ENTROPY}/"
        if not _METRIC.match(prefix):
            raise BadRequest(f"prefix {prefix[:40]!r} is not a metric name prefix")
        buckets = int_param(req, "buckets", HEATMAP_BUCKETS, 1, 2000) or HEATMAP_BUCKETS
        return JSONResponse(layer_heatmap(view, prefix, int_param(req, "rank", None, 0, 1 << 20), buckets))

    def histograms(self, req: Request) -> JSONResponse:
        view = run_param(req, self.catalog)
        return JSONResponse(histogram_grids(view, int_param(req, "rank", None, 0, 1 << 20)))

    def alerts(self, req: Request) -> JSONResponse:
        view = run_param(req, self.catalog)
        view.refresh()
        with view.lock:
            return JSONResponse({"run": view.id, "alerts": [_plain_alert(a) for a in view.alerts]})

    def compare(self, req: Request) -> JSONResponse:
        views = runs_param(req, self.catalog)
        metric = metric_param(req)
        x = choice_param(req, "x", ("step", "time", "elapsed"))
        points = int_param(req, "points", 2000, 10, MAX_POINTS) or 2000
        return JSONResponse(compare_series(views, metric, x, points))

    def compare_runs(self, req: Request) -> JSONResponse:
        return JSONResponse(compare_tables(runs_param(req, self.catalog)))


def _plain_alert(alert: dict[str, Any]) -> dict[str, Any]:
    return {k: (encode_number(v) if isinstance(v, float) else v) for k, v in alert.items()}
