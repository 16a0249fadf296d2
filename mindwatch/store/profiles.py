"""The ``profile`` action's profiles in a run directory: where each rank's goes, what mindwatch notes of it, and how
a reader gets them back with their top op types.

Example::

    from mindwatch.store.profiles import read_profiles
    for p in read_profiles(Path("monitor_output/gpt/run_1")):
        p.first_step, p.steps, p.reason            # 61, 5, "throughput_drop: samples/s fell ..."
        p.ranks[0].top_ops[0]                      # OpTime(op_type='MatMul', total_ms=41.2, share=0.38, calls=120)
        p.ranks[0].trace    # .../step_61/rank0/<host>_<pid>_ascend_ms/ASCEND_PROFILER_OUTPUT/trace_view.json

Layout: ``<run>/profiles/step_<S>/rank<R>/``, S being the first profiled step (the same on every rank), holds
MindSpore's own output folder (``<worker>_ascend_ms/``: ``FRAMEWORK/cpu_op_type_info_<n>.csv``, the op statistics per
type; ``ASCEND_PROFILER_OUTPUT/trace_view.json``, the Chrome trace Perfetto and MindStudio Insight open) and
``profile.json``, mindwatch's note of it (:class:`ProfileNote`): the steps, who or which alert asked, and its state
(``profiling``, ``analysing``, ``done``, ``failed``). Pure Python: no MindSpore needed to read one.
"""

from __future__ import annotations

import csv
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mindwatch.store.layout import RunLayout, read_json, write_json_atomic

#: A profile's states, in order: recording steps, MindSpore's analysis running (off the training thread), done; or
#: failed (the profiler could not start, stop or analyse: ``error`` says why).
STATES = ("profiling", "analysing", "done", "failed")
#: The op types a summary lists, by time.
TOP_OPS = 10
_STEP_DIR = re.compile(r"^step_(\d+)$")
_RANK_DIR = re.compile(r"^rank(\d+)$")
NOTE = "profile.json"


def profile_dir(run_dir: Path, first_step: int, rank: int) -> Path:
    """Where rank ``rank``'s profile that starts at ``first_step`` goes."""
    return Path(run_dir) / "profiles" / f"step_{first_step}" / f"rank{rank}"


@dataclass
class ProfileNote:
    """mindwatch's note of one rank's profile (``profile.json``)."""

    first_step: int
    steps: int
    rank: int
    #: Why: the alert's message, or a person's reason.
    reason: str | None = None
    #: The rule whose alert asked (``throughput_drop``, ...), or ``request`` (a person).
    rule: str | None = None
    #: Who asked, for a person's request (``mindwatch profile``, the dashboard's button).
    requested_by: str | None = None
    #: The step of the alert that asked.
    alert_step: int | None = None
    state: str = "profiling"
    error: str | None = None
    #: Wall times (``time.time()``): started before ``first_step``, stopped after its last step, analysed.
    started_t: float | None = None
    stopped_t: float | None = None
    analysed_t: float | None = None
    #: Requests folded into this profile while it ran: ``[{rule, requested_by, reason, step}]``.
    folded: list[dict[str, Any]] = field(default_factory=list)

    @property
    def last_step(self) -> int:
        return self.first_step + self.steps - 1

    def write(self, folder: Path) -> None:
        write_json_atomic(folder / NOTE, asdict(self))


@dataclass(frozen=True)
class OpTime:
    """One op type's time in a profile (MindSpore's ``cpu_op_type_info`` row)."""

    op_type: str
    total_ms: float
    #: Of the profile's op time (0..1).
    share: float
    calls: int


@dataclass
class RankProfile:
    """One rank's profile as a reader sees it."""

    rank: int
    note: ProfileNote
    #: The folder to open in MindStudio Insight (MindSpore's ``<worker>_ascend_ms``); None before MindSpore made it.
    folder: Path | None
    #: The Chrome trace (once analysed), and MindSpore's op statistics per type.
    trace: Path | None
    op_stats: Path | None
    #: The op types by time, longest first (from ``op_stats``).
    top_ops: list[OpTime]


@dataclass
class Profile:
    """A profile of steps ``first_step`` .. ``first_step + steps - 1``, on each rank that took it."""

    first_step: int
    steps: int
    ranks: dict[int, RankProfile]
    path: Path

    @property
    def note(self) -> ProfileNote:
        """The note of the lowest rank (every rank's says the same steps and cause)."""
        return self.ranks[min(self.ranks)].note

    @property
    def reason(self) -> str | None:
        return self.note.reason

    @property
    def last_step(self) -> int:
        return self.first_step + self.steps - 1


#: The steps a profile's step times are compared with: this many before its first (fewer where the run has fewer).
STEPS_BEFORE = 20


@dataclass(frozen=True)
class StepTimes:
    """The profiled steps' mean ``step_time`` against the mean of the :data:`STEPS_BEFORE` steps before them (s)."""

    profiled: float | None
    before: float | None

    @property
    def ratio(self) -> float | None:
        """How many times slower the profiled steps ran (what profiling cost, plus whatever slowed them)."""
        return self.profiled / self.before if self.profiled and self.before else None


def step_times(profile: Profile, steps: Any, values: Any) -> StepTimes:
    """:class:`StepTimes` of ``profile`` from a rank's ``step_time`` series (``steps``, ``values``: arrays)."""
    pairs = [(int(s), float(v)) for s, v in zip(steps, values, strict=True) if v == v]  # NaN: not a step time
    inside = [v for s, v in pairs if profile.first_step <= s <= profile.last_step]
    before = [v for s, v in pairs if profile.first_step - STEPS_BEFORE <= s < profile.first_step]
    mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    return StepTimes(mean(inside), mean(before))


def top_ops(csv_path: Path, n: int = TOP_OPS) -> list[OpTime]:
    """The ``n`` op types with the most time in MindSpore's op statistics (``cpu_op_type_info_<n>.csv``), longest first,
    each with its share of the time the file lists."""
    try:
        with open(csv_path, newline="") as f:
            rows = list(csv.DictReader(f))
    except (OSError, csv.Error):
        return []
    ops = []
    for row in rows:
        try:
            ops.append((row["op_type"], float(row["total_compute_time"]), int(float(row.get("type_occurrences") or 0))))
        except (KeyError, TypeError, ValueError):
            continue
    total = sum(t for _, t, _ in ops) or 1.0
    ops.sort(key=lambda op: op[1], reverse=True)
    return [OpTime(name, round(t, 6), t / total, calls) for name, t, calls in ops[:n]]


def _mindspore_output(folder: Path) -> tuple[Path | None, Path | None, Path | None]:
    """``(MindSpore's output folder, its trace, its op statistics)`` under a rank's profile folder."""
    outputs = sorted(p for p in folder.glob("*_ascend_ms") if p.is_dir())
    if not outputs:
        return None, None, None
    out = outputs[-1]
    trace = out / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
    stats = sorted(out.glob("FRAMEWORK/cpu_op_type_info_*.csv"))
    return out, trace if trace.is_file() else None, stats[0] if stats else None


def read_profiles(run_dir: Path | RunLayout) -> list[Profile]:
    """The run's profiles, by first step; each rank's from every folder of the run (one a node)."""
    layout = run_dir if isinstance(run_dir, RunLayout) else RunLayout(Path(run_dir))
    found: dict[int, Profile] = {}
    for root in layout.roots:
        base = root / "profiles"
        for step_dir in sorted(base.iterdir()) if base.is_dir() else ():
            m = _STEP_DIR.match(step_dir.name)
            if not m or not step_dir.is_dir():
                continue
            for rank_dir in sorted(step_dir.iterdir()):
                r = _RANK_DIR.match(rank_dir.name)
                raw = read_json(rank_dir / NOTE) if r else None
                if r is None or not isinstance(raw, dict):
                    continue
                note = ProfileNote(**{k: v for k, v in raw.items() if k in ProfileNote.__dataclass_fields__})
                folder, trace, stats = _mindspore_output(rank_dir)
                rank = RankProfile(int(r.group(1)), note, folder, trace, stats, top_ops(stats) if stats else [])
                profile = found.setdefault(int(m.group(1)), Profile(note.first_step, note.steps, {}, step_dir))
                profile.ranks[rank.rank] = rank
    return [found[s] for s in sorted(found)]
