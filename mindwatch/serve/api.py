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
    GET /api/profiles?run=gpt/run_1                      # the profile action's profiles, each summarised
    GET /api/profile-trace?run=gpt/run_1&step=61&rank=0  # a rank's Chrome trace of the profile from step 61, as a file

Every bad query value is a 400 with a message that says what to send; nothing else is exposed. The queries are plain
functions named for what they return (:func:`thinned_series`, :func:`band_points`, ...); :class:`Api`'s methods are the
endpoints, named for their routes.
"""

from __future__ import annotations

import math
import re
import time
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response

from mindwatch import metrics as vocab
from mindwatch.analysis.bands import CROSS_RANK_METRICS
from mindwatch.analysis.compare import compare_tables as compared
from mindwatch.analysis.eval_table import eval_table
from mindwatch.analysis.heatmap import HEATMAP_BUCKETS, family_grid
from mindwatch.analysis.histograms import KINDS, histogram_grid
from mindwatch.analysis.lines import X_KINDS, elapsed_origin, series_window
from mindwatch.analysis.profile_summary import profile_summaries
from mindwatch.analysis.progress import run_progress
from mindwatch.analysis.state_colours import state_css
from mindwatch.analysis.summary import summarize_run
from mindwatch.analysis.tags import tag_texts
from mindwatch.checks.listing import RuleError, runs_page
from mindwatch.serve.cursor import cursor_of
from mindwatch.serve.views import BadRequest, Catalog, NotFound, RunView
from mindwatch.store.csvfile import csv_text, point_cells
from mindwatch.store.jsonl import encode_number
from mindwatch.store.profiles import read_profiles

MAX_POINTS = 20_000
MAX_COMPARE = 12

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
            # what the Evaluation card draws and each evaluation's card marks (analysis.eval_table); None: no evaluation
            "evaluation": evaluation.info() if (evaluation := eval_table(view)) else None,
            # where every chart's elapsed x counts from (analysis.lines.elapsed_origin): one definition, the server's
            "elapsed_origin": elapsed_origin(meta, view.columns.get(min(view.columns)) if view.columns else None),
            "cursor": cursor_of(view),
        }


def runs_table(
    summaries: list[dict[str, Any]], columns: list[str], filter_text: str = "", sort: str = "", now: float | None = None
) -> dict[str, Any]:
    """The runs page (:func:`mindwatch.checks.listing.runs_page`); a bad filter is a BadRequest pointing at its column."""
    try:
        return runs_page(summaries, columns, filter_text, sort, now or time.time())
    except RuleError as e:
        raise BadRequest(f"filter: {e.pointed()}") from None


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
    """One metric of one rank in the window [lo, hi] of x (:func:`mindwatch.analysis.lines.series_window`)."""
    if refresh:
        view.refresh()
    with view.lock:
        if rank is None:
            rank = min(view.columns) if view.columns else 0
        cols = view.columns.get(rank)
        if cols is None:
            raise BadRequest(f"rank {rank} has no metrics in run {view.id!r}; ranks: {sorted(view.columns)}")
        origin = elapsed_origin(view.meta, cols)
        window = series_window(cols, metric, x, lo, hi, points, origin)
        shape = {"run": view.id, "metric": metric, "rank": rank, "x": x, "elapsed_origin": origin}
        return {**shape, **window.wire(), "cursor": cursor_of(view)}


def compare_series(views: list[RunView], metric: str, x: str = "step", points: int = 2000) -> dict[str, Any]:
    """``metric`` of each run (its lowest rank), by step, wall-clock time, or ``elapsed``: seconds since each run's start."""
    out = []
    for view in views:
        view.refresh()
        if view.columns:
            s = thinned_series(view, metric, x=x, points=points, refresh=False)
        else:  # a run that has not written a step yet
            s = {"run": view.id, "metric": metric, "total": 0, "points": [], "nonfinite": []}
        s["state"] = view.status_summary()["state"]
        out.append(s)
    return {"metric": metric, "x": x, "series": out}


def compare_tables(views: list[RunView]) -> dict[str, Any]:
    """The compare page's tables (:func:`mindwatch.analysis.compare.compare_tables`)."""
    runs, evaluations = [], []
    for view in views:
        view.refresh()
        with view.lock:
            runs.append((view.id, summarize_run(view), view.metrics, view.meta.get("config") or {}))
            evaluations.append(evaluation.info() if (evaluation := eval_table(view)) else None)
    tables = compared(runs)
    for row, info in zip(tables["runs"], evaluations, strict=True):
        row["evaluation"] = info  # each evaluation chart marks each run's best, as the run page's cards do
    return tables


def series_csv(view: RunView, metrics: list[str], ranks: list[int] | None = None) -> str:
    """Every recorded point of ``metrics`` on ``ranks`` (default: the lowest rank), not thinned, as CSV
    (:mod:`mindwatch.store.csvfile`): one row a point in file order, ``step,time,metric,rank,value`` (time in epoch
    seconds, empty where a line has none; NaN/Inf as ``nan``/``inf``/``-inf``). The charts' per-chart CSV download."""
    view.refresh()
    with view.lock:
        shown = ranks or ([min(view.columns)] if view.columns else [])
        columns: list[list[str]] = [[], [], [], [], []]
        for rank in shown:
            cols = view.columns.get(rank)
            if cols is None:
                raise BadRequest(f"rank {rank} has no metrics in run {view.id!r}; ranks: {sorted(view.columns)}")
            for metric in metrics:
                line, value = cols.column(metric)
                times = cols.time_of_lines(line)
                for out, cells in zip(columns, point_cells(cols.steps[line], times, metric, rank, value), strict=True):
                    out.extend(cells)
        return csv_text(["step", "time", "metric", "rank", "value"], columns)


def csv_file_name(run_id: str, metrics: list[str], chart: str | None = None) -> str:
    """``gpt_run_1_loss.csv``: the run and the chart's name (else the first metric), in characters every file system
    takes. The page names a chart's PNG after it (``HEAD /api/csv``), so both downloads of a chart share a name."""
    stem = f"{run_id}_{chart}" if chart else f"{run_id}_{metrics[0]}" + ("_etc" if len(metrics) > 1 else "")
    return re.sub(r"[^\w.-]+", "_", stem)[:120] + ".csv"


def band_points(view: RunView, metric: str, points: int = 2000, refresh: bool = True) -> dict[str, Any]:
    """Per-step min / mean / max of ``metric`` across ranks (:meth:`~mindwatch.analysis.bands.Band.thinned`)."""
    b = view.band(metric, refresh)
    return {"run": view.id, "metric": metric, "ranks": b.ranks, "points": b.thinned(points)}


def outlier_ranks(view: RunView, metric: str, k: int = 5) -> dict[str, Any]:
    """The ``k`` ranks most often at the edge of the band (:meth:`~mindwatch.analysis.bands.Band.edge_ranks`)."""
    b = view.band(metric)
    ranks, times = b.edge_ranks(k)
    return {"run": view.id, "metric": metric, "ranks": ranks, "times": times, "steps": len(b)}


def layer_heatmap(view: RunView, prefix: str, rank: int | None, buckets: int) -> dict[str, Any]:
    """Mean of each ``<prefix><layer>`` metric per step bucket (:func:`mindwatch.analysis.heatmap.family_grid`)."""
    view.refresh()
    with view.lock:
        if rank is None:
            rank = min(view.columns) if view.columns else 0
        names, grid = family_grid(view.columns.get(rank), prefix, view.metrics, buckets)
        if grid is None:
            return {"run": view.id, "prefix": prefix, "layers": [], "steps": [], "values": []}
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


def run_profiles(view: RunView) -> dict[str, Any]:
    """The run's profiles (:mod:`mindwatch.analysis.profile_summary`), by first step: ``{run, profiles: [...]}``."""
    view.refresh()
    with view.lock:
        return {"run": view.id, "profiles": [p.wire() for p in profile_summaries(view)]}


def profile_trace(view: RunView, step: int, rank: int) -> Path:
    """Rank ``rank``'s Chrome trace (``trace_view.json``) of the profile from ``step``, where
    :mod:`mindwatch.store.profiles` finds it; NotFound when there is none (yet), or its real path is outside LOGDIR."""
    for profile in read_profiles(view.layout):
        part = profile.ranks.get(rank) if profile.first_step == step else None
        if part is not None and part.trace is not None and view.readable(part.trace):
            return part.trace
    raise NotFound(
        f"run {view.id!r} has no trace of rank {rank} for a profile from step {step} "
        "(GET /api/profiles lists its profiles; a trace comes once MindSpore has analysed the profile)"
    )


def trace_file_name(run_id: str, step: int, rank: int) -> str:
    """``gpt_run_1_step61_rank0_trace_view.json``: in characters every file system takes."""
    return re.sub(r"[^\w.-]+", "_", f"{run_id}_step{step}_rank{rank}")[:120] + "_trace_view.json"


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
                x=choice_param(req, "x", X_KINDS),
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
        x = choice_param(req, "x", X_KINDS)
        points = int_param(req, "points", 2000, 10, MAX_POINTS) or 2000
        return JSONResponse(compare_series(views, metric, x, points))

    def compare_runs(self, req: Request) -> JSONResponse:
        return JSONResponse(compare_tables(runs_param(req, self.catalog)))

    def profiles(self, req: Request) -> JSONResponse:
        return JSONResponse(run_profiles(run_param(req, self.catalog)))

    def profile_trace(self, req: Request) -> Response:
        view = run_param(req, self.catalog)
        step, rank = int_param(req, "step", None, 0, 1 << 40), int_param(req, "rank", None, 0, 1 << 20)
        if step is None or rank is None:
            raise BadRequest("step and rank are required: a profile's first step and one of its ranks, from /api/profiles")
        path = profile_trace(view, step, rank)
        return FileResponse(path, media_type="application/json", filename=trace_file_name(view.id, step, rank))


def _plain_alert(alert: dict[str, Any]) -> dict[str, Any]:
    return {k: (encode_number(v) if isinstance(v, float) else v) for k, v in alert.items()}
