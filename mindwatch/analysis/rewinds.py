"""A run's rewinds, read from its alerts: where each acted, where it went back to, the batches it passed over.

Example::

    from mindwatch.analysis.rewinds import run_rewinds
    for r in run_rewinds(open_run(path).alerts):
        print(r.step, r.to_step, r.skipped_batches, r.span, r.ranks)

Every rank writes its own ``intervention`` alert of a rewind (``actions: ["rewind"]``); they are one rewind when
they acted at the same step and went back to the same snapshot. One owner for the report's table of them and the
wording of the batches passed over (the alert's message uses :func:`batch_span` too).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RunRewind:
    """One rewind of a run, as every rank that did it recorded it."""

    #: The step it acted at, and the snapshot's step it went back to.
    step: int
    to_step: int
    skipped_batches: int = 0
    #: The batches passed over, ``{epoch, index, sample_ids}``: the source rank's of the alert that asked, when it
    #: names one (``source_rank``: an alert on a gradient norm every rank shares), else rank 0's, else the first rank's.
    batches: list[dict[str, Any]] = field(default_factory=list)
    #: The alert that asked: its rule and step.
    cause: str | None = None
    cause_step: int | None = None
    ranks: list[int] = field(default_factory=list)

    @property
    def span(self) -> str:
        """The batches passed over in words (``epoch 1, batches 86-95``)."""
        return batch_span(self.batches)


def run_rewinds(alerts: Iterable[dict[str, Any]]) -> list[RunRewind]:
    """The rewinds in ``alerts``, in the order they happened, one per rewind (not per rank)."""
    alerts = list(alerts)
    sources = {(a.get("rule"), a.get("step")): a["source_rank"] for a in alerts if isinstance(a.get("source_rank"), int)}
    found: dict[tuple[int, int, float], RunRewind] = {}
    for a in alerts:
        step, to = a.get("step"), a.get("to_step")
        if a.get("rule") != "intervention" or a.get("actions") != ["rewind"] or not isinstance(step, int):
            continue
        if not isinstance(to, int):
            continue  # a rewind that failed
        rank: int = a["rank"] if isinstance(a.get("rank"), int) else 0
        # the same (step, to_step) may repeat in a run (a stretch that stays bad): a repeat by a rank is a new rewind
        key = next((k for k, r in found.items() if k[:2] == (step, to) and rank not in r.ranks), (step, to, len(found)))
        entry = found.setdefault(key, RunRewind(step, to, cause=a.get("cause"), cause_step=a.get("cause_step")))
        entry.ranks.append(rank)
        named = sources.get((a.get("cause"), a.get("cause_step")), 0)  # whose batches: the rank behind the anomaly
        if rank == named or not entry.batches:
            entry.skipped_batches = int(a.get("skipped_batches") or 0)
            entry.batches = list(a.get("batches") or [])
    return list(found.values())


def batch_span(batches: list[dict[str, Any]]) -> str:
    """``epoch 1, batches 86-95`` (their indices within the epoch); ``""`` for none."""
    if not batches:
        return ""
    first, last = batches[0], batches[-1]
    if first.get("epoch") == last.get("epoch"):
        return f"epoch {first.get('epoch')}, batches {first.get('index')}-{last.get('index')}"
    return f"epoch {first.get('epoch')} batch {first.get('index')} to epoch {last.get('epoch')} batch {last.get('index')}"
