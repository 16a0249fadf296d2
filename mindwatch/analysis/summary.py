"""A run in numbers, one class for every view: the runs page, ``mindwatch runs``, ``check``, the report.

Example::

    import mindwatch
    from mindwatch.analysis.summary import list_run, summarize_run

    list_run("monitor_output/gpt/run_20261129_074500").best_loss      # the listing: no metrics read
    s = summarize_run(mindwatch.open_run("monitor_output/gpt/run_20261129_074500"))   # the full form
    s.final_loss, s.best_loss, s.max_grad_norm, s.samples_per_second_p50, s.data_wait_share

A :class:`RunSummary` comes in two forms. The **listing** (:func:`list_run` from the files,
:func:`listed` from what an opened run or a :class:`~mindwatch.store.catalog.RunHead` holds) reads
meta.json, the status files, each metrics file's last record and the alert count; the **full**
form (:func:`summarize_run`) adds what needs the series. Definitions (docs/reports.md repeats them):

- ``last_step``/``last_time``: the newest of the status files and the last records
  (:func:`mindwatch.store.catalog.last_step`);
- ``final_loss``: the lowest rank's last ``loss`` (in a listing its last record's, else, when that record holds no loss, an
  evaluation's after the last step, its status file's ``final_loss``); ``best_loss``: the smallest finite ``loss`` of the
  lowest rank that has one, on the line the training kept (a rewind's abandoned steps do not count:
  :mod:`mindwatch.store.best_loss`; the status file's running ``best_loss`` in a listing, the series in full);
- ``best_eval`` (with ``best_eval_metric``, ``_step``, ``_epoch``, ``_mode``): the best value of the run's primary
  evaluation metric, of the lowest rank that has one (:mod:`mindwatch.store.best_eval`: the status file's running
  ``best_eval`` in a listing, the columns in full, :func:`mindwatch.analysis.eval_table.eval_table`);
- ``ranks``: the ranks that wrote a file, ``world_size`` meta.json's (:func:`rank_count` says both);
- ``state``: :func:`mindwatch.store.states.run_state`; ``error`` a lost rank's message, else the first error;
  ``reason`` why it stopped (the lowest rank's: the rule's alert, or who asked and why), from the status files;
- ``max_grad_norm``: largest finite ``grad_norm`` over every rank (NaN/Inf are the non-finite rule's);
- throughput percentiles (``tflops_p50`` and ``mfu_p50`` too) and the data-wait share skip each rank's first
  record, which holds the graph compilation; ``data_wait_share = sum(data_time) / sum(step_time)``;
- ``duration``: from ``started_at`` to ``ended_at``, else to ``last_time``, else to now.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from mindwatch import metrics as vocab
from mindwatch.alerts.alert import SEVERITIES
from mindwatch.analysis.eval_table import eval_table
from mindwatch.analysis.progress import total_steps_of
from mindwatch.analysis.state_text import lost_sentence
from mindwatch.store.attempts import time_lost
from mindwatch.store.best_eval import BestEval
from mindwatch.store.best_loss import kept_best
from mindwatch.store.catalog import RunHead, last_step, last_time
from mindwatch.store.reader import Run
from mindwatch.store.states import rank_states, run_state

#: What a field of :class:`RunSummary` is called wherever a person reads it: the report's summary, the compare page's,
#: the runs page's and ``mindwatch runs``' headers (the pages get them from the API); a field not here reads as its name.
LABELS = {
    "run_id": "run",
    "rank_text": "ranks",
    "last_step": "steps",
    "total_steps": "planned steps",
    "last_time": "last point",
    "started_at": "started",
    "alert_count": "alerts",
    "final_loss": "final loss",
    "best_loss": "best loss",
    "best_eval": "best eval",
    "first_nonfinite_loss_step": "loss non-finite from",
    "max_grad_norm": "max grad norm",
    "samples_per_second_p50": "samples/s p50",
    "samples_per_second_p5": "samples/s p5",
    "tokens_per_second_p50": "tokens/s p50",
    "tokens_per_second_p5": "tokens/s p5",
    "tflops_p50": "TFLOPS per device p50",
    "mfu_p50": "MFU p50",
    "data_wait_share": "data-wait share",
}


def field_label(field_name: str) -> str:
    """What ``field_name`` (a :class:`RunSummary` field, ``duration`` or ``rank_text``) is called: :data:`LABELS`."""
    return LABELS.get(field_name, field_name)


def ordered_metrics(names: list[str] | set[str]) -> list[str]:
    """``names`` in the vocabulary's order (:data:`mindwatch.metrics.STEP_METRICS`), then alphabetically."""
    return sorted(names, key=vocab.order_key)


def _full(default: Any = None) -> Any:
    """A field only the full form fills (a listing leaves it out of ``to_dict()``)."""
    if callable(default):
        return field(default_factory=default, metadata={"full": True})
    return field(default=default, metadata={"full": True})


@dataclass
class RunSummary:
    """One run in numbers; ``None`` where the run did not record what a number needs (or the listing does not read)."""

    path: str
    run_id: str
    project: str
    state: str
    error: str | None = None
    #: Why the run stopped or stalled: the alert that stopped it, or the person's request (``stopped by ...``).
    reason: str | None = None
    #: A person's display name and note (``notes.json``, :mod:`mindwatch.store.notes`); the run id stays.
    name: str | None = None
    note: str | None = None
    tags: Any = field(default_factory=list)
    world_size: int = 1
    ranks: list[int] = field(default_factory=list)
    last_step: int | None = None
    last_time: float | None = None
    #: The step the training was planned to end at (meta.json ``total_steps``); None when unknown.
    total_steps: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    alert_count: int = 0
    final_loss: float | None = None
    best_loss: float | None = None
    #: The best value of the primary evaluation metric (``best_eval_metric``), the step and epoch of that evaluation,
    #: and whether smaller or larger is better (``best_eval_mode``: ``min``, ``max``); None without an evaluation.
    best_eval: float | None = None
    best_eval_metric: str | None = None
    best_eval_step: int | None = None
    best_eval_epoch: int | None = None
    best_eval_mode: str | None = None
    #: meta.json's config snapshot (secrets masked).
    config: dict[str, Any] = field(default_factory=dict)
    #: True for :func:`summarize_run`'s form, False for a listing.
    full: bool = False
    metrics: list[str] = _full(list)
    records: int = _full(0)
    #: Trainings into this run (a resumed run has more than one) and the seconds between them.
    attempts: int = _full(1)
    time_lost: float | None = _full()
    best_loss_step: int | None = _full()
    first_nonfinite_loss_step: int | None = _full()
    max_grad_norm: float | None = _full()
    max_grad_norm_step: int | None = _full()
    samples_per_second_p50: float | None = _full()
    samples_per_second_p5: float | None = _full()
    tokens_per_second_p50: float | None = _full()
    tokens_per_second_p5: float | None = _full()
    #: The median TFLOPS per device and MFU (in percent) over every rank's steps; None where not recorded.
    tflops_p50: float | None = _full()
    mfu_p50: float | None = _full()
    data_wait_share: float | None = _full()
    #: Alerts per severity, most severe first.
    alerts: dict[str, int] = _full(dict)

    def with_best_eval(self, best: BestEval | None) -> RunSummary:
        """``self`` with the ``best_eval`` fields of ``best`` (None: no evaluation)."""
        self.best_eval = best.value if best else None
        self.best_eval_metric = best.metric if best else None
        self.best_eval_step = best.step if best else None
        self.best_eval_epoch = best.epoch if best else None
        self.best_eval_mode = best.mode if best else None
        return self

    @property
    def duration(self) -> float | None:
        if self.started_at is None:
            return None
        end = self.ended_at or self.last_time or time.time()
        return max(0.0, end - self.started_at)

    @property
    def rank_text(self) -> str:
        """How many ranks, as every view says it (:func:`rank_count`)."""
        return rank_count(self.world_size, self.ranks)

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain values plus ``duration``; a listing leaves out the full form's fields."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if self.full or not f.metadata.get("full")}
        out.pop("full")
        out["duration"] = self.duration
        return {k: (dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v) for k, v in out.items()}


class RunFacts(Protocol):
    """What a listing is made from: an opened :class:`~mindwatch.store.reader.Run` or a
    :class:`~mindwatch.store.catalog.RunHead`."""

    path: Path
    meta: dict[str, Any]
    notes: dict[str, Any]
    statuses: dict[int, dict[str, Any]]
    last_record: dict[int, dict[str, Any]]

    @property
    def alert_count(self) -> int: ...


def listed(run: RunFacts, now: float | None = None) -> RunSummary:
    """The listing of a run from what ``run`` already holds: no file is read."""
    meta, statuses = run.meta, run.statuses
    errors = [s["error"] for s in statuses.values() if s.get("error")]
    reasons = [s["reason"] for _, s in sorted(statuses.items()) if s.get("reason")]
    bests = [b for _, s in sorted(statuses.items()) if _number(b := s.get("best_loss")) is not None]
    best_eval = next((b for _, s in sorted(statuses.items()) if (b := BestEval.from_dict(s.get("best_eval")))), None)
    starts = [s["started_at"] for s in statuses.values() if isinstance(s.get("started_at"), (int, float))]
    started = meta.get("started_at") if isinstance(meta.get("started_at"), (int, float)) else min(starts, default=None)
    ended = meta.get("ended_at")
    ranks = sorted(set(statuses) | set(run.last_record))
    return RunSummary(
        path=str(run.path),
        run_id=str(meta.get("run_id", run.path.name)),
        project=str(meta.get("project", run.path.parent.name)),
        state=run_state(rank_states(statuses, now).values()),
        error=lost_sentence(statuses) or (errors[0] if errors else None),
        reason=str(reasons[0]) if reasons else None,
        name=str(run.notes["name"]) if run.notes.get("name") else None,
        note=str(run.notes["note"]) if run.notes.get("note") else None,
        tags=meta.get("tags", []),
        world_size=int(meta.get("world_size", max(len(ranks), 1))),
        ranks=ranks,
        last_step=last_step(statuses, run.last_record),
        last_time=last_time(statuses, run.last_record),
        total_steps=total_steps_of(meta),
        started_at=started or None,
        ended_at=ended if isinstance(ended, (int, float)) else None,
        alert_count=run.alert_count,
        final_loss=_final_loss(run.last_record, statuses),
        best_loss=_number(bests[0]) if bests else None,
        config=config if isinstance(config := meta.get("config"), dict) else {},
    ).with_best_eval(best_eval)


def list_run(path: str | os.PathLike[str], now: float | None = None) -> RunSummary:
    """The listing of the run directory at ``path`` (cheap: meta, status files, last records, alert count)."""
    return listed(RunHead(path).refresh(), now)


def _final_loss(last_record: dict[int, dict[str, Any]], statuses: dict[int, dict[str, Any]]) -> float | None:
    """The lowest rank's last loss: its last record's, else (an evaluation's record came last) its status file's."""
    for rank in sorted(set(last_record) | set(statuses)):
        if "loss" in (rec := last_record.get(rank, {})):
            return _number(rec["loss"])
        if (v := _number(statuses.get(rank, {}).get("final_loss"))) is not None:
            return v
    return None


def _number(v: Any) -> float | None:
    """A JSON value as a float: NaN and Inf arrive as the strings "nan", "inf", "-inf"."""
    if isinstance(v, bool) or v is None:
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def rank_count(world_size: int, ranks: list[int]) -> str:
    """How many ranks a run has, as every view says it: ``"1"``, ``"8"``, ``"8 (3 recorded)"`` when files are missing."""
    if ranks and len(ranks) < world_size:
        return f"{world_size} ({len(ranks)} recorded)"
    return str(max(world_size, len(ranks), 1))


def run_values(run: Run, metric: str, rank: int | None = None, last: int | None = None) -> np.ndarray:
    """Values of ``metric``: of one rank, or every rank's concatenated; ``last=N`` keeps each rank's last N."""
    ranks = [rank] if rank is not None else run.ranks
    parts = []
    for r in ranks:
        v = run.series(metric, rank=r).value
        if last is not None:
            v = v[-last:] if last > 0 else v[:0]
        parts.append(v)
    return np.concatenate(parts) if parts else np.empty(0, np.float64)


def lowest_rank_with(run: Run, metric: str) -> int | None:
    """The lowest rank that recorded ``metric`` (the rank whose first/final value a summary shows)."""
    return next((r for r in run.ranks if len(run.series(metric, rank=r))), None)


def alert_counts(alerts: list[dict[str, Any]]) -> dict[str, int]:
    """Alerts per severity, every severity present (0 when none), most severe first."""
    counts = Counter(str(a.get("severity", "warning")) for a in alerts)
    return {s: counts.get(s, 0) for s in reversed(SEVERITIES)} | {s: n for s, n in counts.items() if s not in SEVERITIES}


def summarize_run(run: Run) -> RunSummary:
    """The full summary of an opened run (finished, failed, killed or still running)."""
    s = listed(run)
    s.full = True
    s.metrics = run.metrics
    s.records = sum(_record_count(run, r) for r in run.ranks)
    s.alerts = alert_counts(run.alerts)
    s.attempts = max(1, len(run.attempts))
    s.time_lost = time_lost(run.attempts) if len(run.attempts) > 1 else None
    loss_rank = lowest_rank_with(run, "loss")
    if loss_rank is not None:
        loss = run.series("loss", rank=loss_rank)
        s.final_loss = float(loss.value[-1])
        cols = run.columns[loss_rank]
        line, value = cols.raw_column("loss")  # in the order written: a rewind's abandoned steps are not the best
        best = kept_best(cols.steps[line], value)
        s.best_loss, s.best_loss_step = best if best is not None else (None, None)
        finite = np.isfinite(loss.value)
        if not finite.all():
            s.first_nonfinite_loss_step = int(loss.step[np.argmin(finite)])
    evaluation = eval_table(run)
    s.with_best_eval(evaluation.best if evaluation else None)
    s.max_grad_norm, s.max_grad_norm_step = _max_with_step(run, "grad_norm")
    s.samples_per_second_p50, s.samples_per_second_p5 = _percentiles(run, "samples_per_second")
    s.tokens_per_second_p50, s.tokens_per_second_p5 = _percentiles(run, "tokens_per_second")
    s.tflops_p50 = _percentiles(run, vocab.TFLOPS)[0]
    s.mfu_p50 = _percentiles(run, vocab.MFU)[0]
    step_time = _after_first(run, "step_time")
    data_time = _after_first(run, "data_time")
    if len(step_time) and len(data_time) and np.nansum(step_time) > 0:
        s.data_wait_share = float(np.nansum(data_time) / np.nansum(step_time))
    return s


def _record_count(run: Run, rank: int) -> int:
    return max((len(run.series(m, rank=rank)) for m in run.metrics), default=0)


def _after_first(run: Run, metric: str) -> np.ndarray:
    parts = [run.series(metric, rank=r).value[1:] for r in run.ranks]
    return np.concatenate(parts) if parts else np.empty(0, np.float64)


def _percentiles(run: Run, metric: str) -> tuple[float | None, float | None]:
    v = _after_first(run, metric)
    v = v[np.isfinite(v)]
    if not len(v):
        return None, None
    return float(np.percentile(v, 50)), float(np.percentile(v, 5))


def _max_with_step(run: Run, metric: str) -> tuple[float | None, int | None]:
    best: tuple[float, int] | None = None
    for r in run.ranks:
        ser = run.series(metric, rank=r)
        if not len(ser):
            continue
        finite = np.isfinite(ser.value)  # NaN and Inf are counted by the non-finite rule, not a maximum
        if not finite.any():
            continue
        i = int(np.argmax(np.where(finite, ser.value, -np.inf)))
        v = float(ser.value[i])
        if best is None or v > best[0]:
            best = (v, int(ser.step[i]))
    return best if best is not None else (None, None)
