"""The flagged batches of a run: the steps an anomaly alert named, with where their batch came from.

Example::

    from mindwatch.analysis.batches import flagged_batches
    for b in flagged_batches(open_run(path).alerts):
        print(b.step, b.rules, b.epoch, b.batch, b.sample_ids)

One owner for ``mindwatch batches RUN`` and the report's table of them. An alert on a value every rank shares
(``grad_norm`` after the all-reduce) names the rank whose own gradient norm stood out, ``source_rank``
(:mod:`mindwatch.alerts.source_rank`): its step is listed under that rank, with that rank's batch, or with the note
that the batch is in that rank's own records.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

#: The rules whose alerts point at a step's batch (a spike, a NaN/Inf, a step skip_steps skipped).
ANOMALY_RULES: tuple[str, ...] = ("spike", "nonfinite", "skip")


@dataclass
class FlaggedBatch:
    """One step (of one rank) that an anomaly alert named."""

    step: int
    rank: int
    epoch: int | None = None
    #: The batch's index within its epoch, from 0.
    batch: int | None = None
    sample_ids: list[Any] | None = None
    #: The alerts' rules (and metrics): ``["spike on grad_norm", "skip"]``.
    rules: list[str] = field(default_factory=list)
    #: Where the batch is when the alert could not name it (another rank's, in that rank's own run directory).
    note: str | None = None


def flagged_batches(
    alerts: Iterable[dict[str, Any]], records: Callable[[int, int], dict[str, Any] | None] | None = None
) -> list[FlaggedBatch]:
    """The steps the anomaly alerts named, in step order, one entry per step and rank. ``records(rank, step)``: that
    rank's record of the step, for a batch an alert left in that rank's records (another node's folder, ``--also``)."""
    found: dict[tuple[int, int], FlaggedBatch] = {}
    for a in alerts:
        step, rank = a.get("step"), a.get("source_rank", a.get("rank"))
        if a.get("rule") not in ANOMALY_RULES or not isinstance(step, int):
            continue
        if "source_rank" in a and not isinstance(rank, int):
            continue  # a shared anomaly no rank's batch stood out in: no batch to name
        key = (step, rank if isinstance(rank, int) else 0)
        entry = found.setdefault(key, FlaggedBatch(step, key[1]))
        entry.epoch = entry.epoch if entry.epoch is not None else a.get("epoch")
        entry.batch = entry.batch if entry.batch is not None else a.get("batch")
        entry.sample_ids = entry.sample_ids if entry.sample_ids is not None else a.get("sample_ids")
        entry.note = entry.note or a.get("batch_note")
        name = str(a["rule"]) + (f" on {a['metric']}" if a.get("metric") else "")
        if name not in entry.rules:
            entry.rules.append(name)
    for (step, rank), entry in found.items():
        if entry.note and entry.sample_ids is None and records is not None and (rec := records(rank, step)) is not None:
            entry.epoch, entry.batch, entry.sample_ids = rec.get("epoch"), rec.get("batch"), rec.get("sample_ids")
            entry.note = None
    return [found[k] for k in sorted(found)]


def ids_text(ids: list[Any] | None, limit: int = 8) -> str:
    """Sample ids for a table cell: the first ``limit``, then how many more."""
    if not ids:
        return ""
    shown = ", ".join(str(i) for i in ids[:limit])
    return shown + (f", ... ({len(ids) - limit} more)" if len(ids) > limit else "")
