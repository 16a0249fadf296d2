"""The numbers a person looks at first after a run: steps, duration, loss, grad norm, throughput, alerts.

Example::

    import mindwatch
    from mindwatch.analysis.summary import summarize_run

    s = summarize_run(mindwatch.open_run("monitor_output/gpt/run_20261129_074500"))
    s.final_loss, s.best_loss, s.max_grad_norm, s.samples_per_second_p50, s.data_wait_share

Definitions (docs/reports.md repeats them):

- ``final_loss``/``best_loss``: last value and smallest finite value of ``loss`` on the lowest rank;
- ``max_grad_norm``: largest ``grad_norm`` over every rank (``inf``/NaN count as larger than any number);
- throughput percentiles and the data-wait share skip each rank's first record, which holds the
  graph compilation; ``data_wait_share = sum(data_time) / sum(step_time)``;
- ``duration``: from ``started_at`` in meta.json to ``ended_at``, else to the last record's time.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from mindwatch import metrics as vocab
from mindwatch.alerts.alert import SEVERITIES
from mindwatch.analysis.progress import total_steps_of
from mindwatch.store.attempts import time_lost
from mindwatch.store.reader import Run
from mindwatch.store.states import lost_message


def ordered_metrics(names: list[str] | set[str]) -> list[str]:
    """``names`` in the vocabulary's order (:data:`mindwatch.metrics.STEP_METRICS`), then alphabetically."""
    return sorted(names, key=vocab.order_key)


@dataclass
class RunSummary:
    """One run in numbers; ``None`` where the run did not record what a number needs."""

    run_id: str
    project: str
    path: str
    state: str
    error: str | None = None
    ranks: list[int] = field(default_factory=list)
    world_size: int = 1
    metrics: list[str] = field(default_factory=list)
    records: int = 0
    last_step: int | None = None
    #: The step the training was planned to end at (meta.json ``total_steps``); None when unknown.
    total_steps: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    duration: float | None = None
    #: Trainings into this run (a resumed run has more than one) and the seconds between them.
    attempts: int = 1
    time_lost: float | None = None
    final_loss: float | None = None
    best_loss: float | None = None
    best_loss_step: int | None = None
    first_nonfinite_loss_step: int | None = None
    max_grad_norm: float | None = None
    max_grad_norm_step: int | None = None
    samples_per_second_p50: float | None = None
    samples_per_second_p5: float | None = None
    tokens_per_second_p50: float | None = None
    tokens_per_second_p5: float | None = None
    data_wait_share: float | None = None
    alerts: dict[str, int] = field(default_factory=dict)
    tags: Any = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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


def run_times(run: Run) -> tuple[float | None, float | None]:
    """``(started_at, ended_at)``: meta.json's, else the status files', else the last record's time."""
    started = run.meta.get("started_at")
    if not isinstance(started, (int, float)):
        starts = [s["started_at"] for s in run.statuses.values() if isinstance(s.get("started_at"), (int, float))]
        started = min(starts) if starts else None
    ended = run.meta.get("ended_at")
    if not isinstance(ended, (int, float)):
        ts = [r["t"] for r in run.last_record.values() if isinstance(r.get("t"), (int, float))]
        ended = max(ts) if ts else None
    return started, ended


def alert_counts(alerts: list[dict[str, Any]]) -> dict[str, int]:
    """Alerts per severity, every severity present (0 when none), most severe first."""
    counts = Counter(str(a.get("severity", "warning")) for a in alerts)
    return {s: counts.get(s, 0) for s in reversed(SEVERITIES)} | {s: n for s, n in counts.items() if s not in SEVERITIES}


def summarize_run(run: Run) -> RunSummary:
    """The summary of an opened run (finished, failed, killed or still running)."""
    started, ended = run_times(run)
    errors = [s["error"] for s in run.statuses.values() if s.get("error")]
    s = RunSummary(
        run_id=run.id,
        project=str(run.meta.get("project", run.path.parent.name)),
        path=str(run.path),
        state=run.state,
        error=lost_message(run.statuses) or (errors[0] if errors else None),
        ranks=run.ranks,
        world_size=int(run.meta.get("world_size", max(len(run.ranks), 1))),
        metrics=run.metrics,
        records=sum(_record_count(run, r) for r in run.ranks),
        last_step=run.last_step,
        total_steps=total_steps_of(run.meta),
        started_at=started,
        ended_at=ended,
        duration=max(0.0, ended - started) if started is not None and ended is not None else None,
        alerts=alert_counts(run.alerts),
        tags=run.meta.get("tags", []),
        attempts=max(1, len(run.attempts)),
        time_lost=time_lost(run.attempts) if len(run.attempts) > 1 else None,
    )
    loss_rank = lowest_rank_with(run, "loss")
    if loss_rank is not None:
        loss = run.series("loss", rank=loss_rank)
        s.final_loss = float(loss.value[-1])
        finite = np.isfinite(loss.value)
        if finite.any():
            i = int(np.argmin(np.where(finite, loss.value, np.inf)))
            s.best_loss, s.best_loss_step = float(loss.value[i]), int(loss.step[i])
        if not finite.all():
            s.first_nonfinite_loss_step = int(loss.step[np.argmin(finite)])
    s.max_grad_norm, s.max_grad_norm_step = _max_with_step(run, "grad_norm")
    s.samples_per_second_p50, s.samples_per_second_p5 = _percentiles(run, "samples_per_second")
    s.tokens_per_second_p50, s.tokens_per_second_p5 = _percentiles(run, "tokens_per_second")
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
