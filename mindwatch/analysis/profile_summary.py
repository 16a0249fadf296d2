"""A run's profiles (the ``profile`` action) as every view shows them: the steps, who or which alert asked and why, each
rank's state, trace and folder, the top op types with every rank side by side, and the profiled steps' time against the
steps before them.

Example::

    from mindwatch.analysis.profile_summary import profile_summaries
    (p,) = profile_summaries(mindwatch.open_run("monitor_output/gpt/run_1"))
    p.first_step, p.last_step, p.ranks    # 61, 65, [0, 1]
    p.asked                               # 'the throughput_drop alert at step 60: samples_per_second fell to ...'
    p.ops[0]                              # OpRow(op_type='MatMul', ms=[41.2, 55.0], share=[0.38, 0.45], most=1)
    p.step_times[1].ratio                 # 1.9: rank 1's profiled steps ran 1.9 times as long as the 20 before
    p.wire()                              # /api/profiles' entry; the report's Profiles section shows the same

The rows are the op types of every rank's top :data:`~mindwatch.store.profiles.TOP_OPS` (MindSpore's op statistics),
longest first by the most time any rank spent on them, at most ``TOP_OPS`` rows; each rank's time and share come from
its whole op statistics, so a rank where an op type is outside its own top still shows its time. ``most`` is the rank
that spent the most on a row's op type, where several ranks have it: the cell the run page and the report mark.
The run page's alert list links an alert to the profile whose ``alerts`` name its rule and step: the ``intervention``
alert that reported the profile (or a request folded into it) and the alert that asked.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field
from pathlib import PurePosixPath
from typing import Any

from mindwatch import metrics as vocab
from mindwatch.store.profiles import STEPS_BEFORE, TOP_OPS, OpTime, Profile, RankProfile, StepTimes, step_times, top_ops
from mindwatch.store.reader import Run

#: A rank's profile states that move no more.
ENDED_STATES = ("done", "failed")


@dataclass(frozen=True)
class OpRow:
    """One op type's time on each rank of a profile (``None``: the rank's op statistics have no such op type)."""

    op_type: str
    #: Milliseconds, one per rank in :attr:`ProfileSummary.ranks`' order.
    ms: list[float | None]
    #: Of that rank's op time (0..1).
    share: list[float | None]
    #: The index (in ``ranks``) of the rank that spent the most on it; None with one rank, or when the largest is shared.
    most: int | None


@dataclass
class RankSummary:
    """One rank's part of a profile."""

    rank: int
    state: str
    error: str | None
    #: MindSpore's output folder, relative to the run directory (of that rank's node): what MindStudio Insight opens.
    folder: str | None
    #: Whether its Chrome trace (``trace_view.json``) is there to download.
    trace: bool
    #: Its own top op types by time (:attr:`mindwatch.store.profiles.RankProfile.top_ops`).
    top_ops: list[OpTime] = field(default_factory=list)

    def wire(self) -> dict[str, Any]:
        return {**{k: v for k, v in vars(self).items() if k != "top_ops"}, "top_ops": [asdict(op) for op in self.top_ops]}


@dataclass
class ProfileSummary:
    """One profile of steps ``first_step`` .. ``last_step`` as every view shows it (see the module docstring)."""

    first_step: int
    last_step: int
    steps: int
    ranks: list[int]
    reason: str | None
    #: The rule whose alert asked, or ``request`` (a person).
    rule: str | None
    requested_by: str | None
    alert_step: int | None
    #: Who or which alert asked, and why, in words (with the requests folded into it counted).
    asked: str
    #: Requests folded into it while it ran: ``[{rule, requested_by, reason, step}]``.
    folded: list[dict[str, Any]]
    rank_parts: list[RankSummary]
    ops: list[OpRow]
    #: Each rank's profiled steps' mean ``step_time`` against the steps before, in ``ranks``' order.
    step_times: list[StepTimes]
    #: ``[rule, step]`` of each alert that asked for it or reported it.
    alerts: list[list[Any]] = field(default_factory=list)

    @property
    def steps_before(self) -> int:
        """How many steps before the first the step times compare with: :data:`~mindwatch.store.profiles.STEPS_BEFORE`,
        fewer where the run had fewer."""
        return min(STEPS_BEFORE, max(self.first_step - 1, 0))

    @property
    def ended(self) -> bool:
        """Every rank's profile is done or failed: nothing about it changes any more."""
        return all(r.state in ENDED_STATES for r in self.rank_parts)

    def ranks_text(self) -> str:
        """``rank 0``, ``ranks 0–7``, ``ranks 0, 2, 5``."""
        r = self.ranks
        if len(r) == 1:
            return f"rank {r[0]}"
        return f"ranks {r[0]}–{r[-1]}" if r == list(range(r[0], r[-1] + 1)) else f"ranks {', '.join(map(str, r))}"

    def state_text(self) -> str:
        """``done``, or each rank's state where they differ (``done on rank 0, failed on rank 1: <error>``)."""
        states = {r.state for r in self.rank_parts}
        if len(states) == 1 and not any(r.error for r in self.rank_parts):
            return states.pop()
        return ", ".join(f"{r.state} on rank {r.rank}" + (f": {r.error}" if r.error else "") for r in self.rank_parts)

    def wire(self) -> dict[str, Any]:
        """As ``GET /api/profiles`` sends it (numbers as they are; ms and shares per rank in ``ranks``' order)."""
        return {
            "first_step": self.first_step,
            "last_step": self.last_step,
            "steps": self.steps,
            "ranks": self.ranks,
            "ranks_text": self.ranks_text(),
            "reason": self.reason,
            "rule": self.rule,
            "requested_by": self.requested_by,
            "alert_step": self.alert_step,
            "asked": self.asked,
            "folded": self.folded,
            "state": self.state_text(),
            "ended": self.ended,
            "rank_parts": [r.wire() for r in self.rank_parts],
            "ops": [vars(op) for op in self.ops],
            # "during": the profiled steps' mean step time (s)
            "step_times": [{"during": t.profiled, "before": t.before, "ratio": t.ratio} for t in self.step_times],
            "steps_before": self.steps_before,
            "alerts": self.alerts,
        }


def profile_summaries(run: Run) -> list[ProfileSummary]:
    """The run's profiles, by first step (:func:`mindwatch.store.profiles.read_profiles`), each summarised; of each
    only the files the run may read (:meth:`~mindwatch.store.reader.Run.readable`: the dashboard's, inside LOGDIR)."""
    out = []
    for profile in run.profiles:
        parts = {r: readable_part(run, profile, p) for r, p in profile.ranks.items()}
        kept = {r: p for r, p in parts.items() if p is not None}
        if kept:
            out.append(summarize_profile(run, Profile(profile.first_step, profile.steps, kept, profile.path)))
    return out


def readable_part(run: Run, profile: Profile, part: RankProfile) -> RankProfile | None:
    """``part`` without the files ``run`` may not read (None: not even its folder)."""
    # the rank's folder: its output's parent (a rank on another node has it in that node's folder of the run)
    if not run.readable(part.folder.parent if part.folder is not None else profile.path / f"rank{part.rank}"):
        return None
    if all(p is None or run.readable(p) for p in (part.folder, part.trace, part.op_stats)):
        return part
    folder, trace, stats = (p if p is not None and run.readable(p) else None for p in (part.folder, part.trace, part.op_stats))
    return RankProfile(part.rank, part.note, folder, trace, stats, part.top_ops if stats else [])


def summarize_profile(run: Run, profile: Profile) -> ProfileSummary:
    """``profile`` of ``run`` as every view shows it; its step times from each rank's ``step_time`` series."""
    ranks = sorted(profile.ranks)
    parts = [profile.ranks[r] for r in ranks]
    note = profile.note
    times = [step_times(profile, s.step, s.value) for s in (run.series(vocab.STEP_TIME, rank=r) for r in ranks)]
    return ProfileSummary(
        first_step=profile.first_step,
        last_step=profile.last_step,
        steps=profile.steps,
        ranks=ranks,
        reason=note.reason,
        rule=note.rule,
        requested_by=note.requested_by,
        alert_step=note.alert_step,
        asked=_asked(note.rule, note.requested_by, note.alert_step, note.reason) + _folded(note.folded),
        folded=list(note.folded),
        rank_parts=[_rank_summary(p) for p in parts],
        ops=op_rows(parts),
        step_times=times,
        alerts=_alerts_of(run.alerts, profile.first_step),
    )


def op_rows(parts: list[RankProfile], rows: int = TOP_OPS) -> list[OpRow]:
    """The ``rows`` op types with the most time on any of ``parts``' ranks, each rank's time and share beside it."""
    tables = [_all_ops(p) for p in parts]
    shown = dict.fromkeys(op.op_type for table in tables for op in table.values())  # ties: in each rank's order
    longest = {name: max(t[name].total_ms for t in tables if name in t) for name in shown}
    out = []
    for name in sorted(shown, key=lambda n: -longest[n])[:rows]:
        ops = [t.get(name) for t in tables]
        ms = [op.total_ms if op else None for op in ops]
        share = [op.share if op else None for op in ops]
        top = [i for i, v in enumerate(ms) if v is not None and v == longest[name]]
        several = sum(v is not None for v in ms) > 1
        out.append(OpRow(name, ms, share, top[0] if several and len(top) == 1 else None))
    return out


def _all_ops(part: RankProfile) -> dict[str, OpTime]:
    """Every op type of a rank's op statistics (shares of its whole op time), by name."""
    if part.op_stats is None:
        return {}
    return {op.op_type: op for op in top_ops(part.op_stats, n=sys.maxsize)}


def _rank_summary(part: RankProfile) -> RankSummary:
    folder = part.folder
    relative = PurePosixPath("profiles", f"step_{part.note.first_step}", f"rank{part.rank}", folder.name) if folder else None
    folder_text = str(relative) if relative else None
    return RankSummary(part.rank, part.note.state, part.note.error, folder_text, part.trace is not None, list(part.top_ops))


def _asked(rule: str | None, requested_by: str | None, alert_step: int | None, reason: str | None) -> str:
    """``root@vm: slow steps``, or ``the throughput_drop alert at step 60: <its message>``."""
    if rule == "request":
        who = requested_by or "a person"
    else:
        who = f"the {rule or 'unknown'} alert" + (f" at step {alert_step}" if alert_step is not None else "")
    return f"{who}: {reason}" if reason else who


def _folded(folded: list[dict[str, Any]]) -> str:
    """`` · 2 more requests folded into it`` (nothing without one)."""
    return f" · {len(folded)} more request{'s' if len(folded) > 1 else ''} folded into it" if folded else ""


def _alerts_of(alerts: list[dict[str, Any]], first_step: int) -> list[list[Any]]:
    """``[rule, step]`` of the ``intervention`` alerts that report the profile from ``first_step`` (its start, requests
    folded into it) and of the alerts that asked for it, each once."""
    found: list[list[Any]] = []
    for a in alerts:
        if a.get("rule") != "intervention" or a.get("first_step") != first_step or "profile" not in (a.get("actions") or []):
            continue
        for pair in (["intervention", a.get("step")], [a.get("cause"), a.get("cause_step")]):
            if pair[0] is not None and pair[1] is not None and pair not in found:
                found.append(pair)
    return found
