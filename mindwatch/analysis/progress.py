"""How far a run is and when it ends: steps done out of planned, steps per second, time left; and its pace in TFLOPS.

Example::

    rate = StepRate()
    rate.add(185, time.time())                  # per record (the console sink, on the worker thread)
    Progress(185, 1500, rate.value).text()      # "step 185/1,500 (12 %) | ETA 1m 45s"
    Progress(185, None).text()                  # "step 185 (total unknown)"

The total is the step the training ends at (``meta.json`` ``total_steps``, from ``Model.train``);
``None`` when it is unknown (an endless dataset), and then nothing is guessed. The rate is
measured between recorded step ends over the last ``window_secs``: the first step's compilation
ends before its step end, so it never slows the estimate. A later graph compiles inside a step (a
new shape, an evaluation graph): a step that takes over :data:`COMPILE_FACTOR` times the window's
median step is a compile and left out of the rate (at most :data:`COMPILE_STEPS` of them a window,
so that slow steps that recur, a checkpoint every 100 steps, still count). Beside the rate, an opened run's
:class:`Progress` holds the median ``tflops`` and ``mfu`` of the same window (the dashboard's header).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mindwatch import metrics as vocab
from mindwatch.analysis.rewinds import RunRewind
from mindwatch.store.reader import Run
from mindwatch.units import format_duration

#: Seconds of recent steps the rate is measured over.
RATE_WINDOW_SECS = 60.0
#: A step this many times slower than the window's median step is a graph compiling, not the pace.
COMPILE_FACTOR = 10.0
#: At most this many such steps a window are left out (more are the pace: a slow step that recurs).
COMPILE_STEPS = 2
#: The most recent points kept for it (at 1,000 steps/s the window shrinks to 4 s).
_RECENT = 4096


def steps_per_second(steps: Sequence[float], times: Sequence[float], window_secs: float = RATE_WINDOW_SECS) -> float | None:
    """Steps per second between the newest point and the oldest within ``window_secs`` of it (at least two points),
    leaving out the steps that compiled a graph (see the module's docstring).

    Example::

        steps_per_second([1, 2, 3, 4, 5], [0.0, 0.1, 0.2, 12.2, 12.3])   # ~10: the 12 s step compiled a graph
    """
    pts = [(s, t) for s, t in zip(steps, times, strict=True) if t == t]  # t is nan where a line has none
    if len(pts) < 2:
        return None
    last_t = pts[-1][1]
    i = len(pts) - 2
    while i > 0 and last_t - pts[i - 1][1] <= window_secs:
        i -= 1
    window = pts[i:]
    gaps = [(b[0] - a[0], b[1] - a[1]) for a, b in zip(window, window[1:], strict=False) if b[0] > a[0]]
    if not gaps:
        return None
    per_step = sorted(secs / n for n, secs in gaps)
    median = per_step[len(per_step) // 2]
    slow = [g for g in gaps if g[1] / g[0] > COMPILE_FACTOR * median]
    if 0 < len(slow) <= COMPILE_STEPS and len(gaps) > 2 * len(slow):
        gaps = [g for g in gaps if g not in slow]
    done, secs = sum(n for n, _ in gaps), sum(s for _, s in gaps)
    return done / secs if secs > 0 else None


class StepRate:
    """The recent step rate of a stream of records (see :func:`steps_per_second`)."""

    def __init__(self, window_secs: float = RATE_WINDOW_SECS) -> None:
        self.window_secs = window_secs
        self._points: deque[tuple[int, float]] = deque(maxlen=_RECENT)

    def add(self, step: int, t: float) -> None:
        pts = self._points
        if pts and step <= pts[-1][0]:
            return  # a record of the same step (a user metric) or a rewind says nothing about speed
        pts.append((step, t))
        while len(pts) > 2 and t - pts[1][1] > self.window_secs:
            pts.popleft()

    @property
    def value(self) -> float | None:
        return steps_per_second([p[0] for p in self._points], [p[1] for p in self._points], self.window_secs)


@dataclass(frozen=True)
class Progress:
    """Steps done out of planned and, while running, the time left at the current rate."""

    step: int | None
    total: int | None
    steps_per_second: float | None = None
    #: The rate is the whole run's average (an ended run), not the recent pace.
    average: bool = False
    #: The median TFLOPS per device and MFU (%) over the rate's steps; None where the run records none.
    tflops: float | None = None
    mfu: float | None = None

    @property
    def known_total(self) -> int | None:
        """The total, unless it is missing or already passed (then it was wrong)."""
        if self.total is None or self.total <= 0 or (self.step is not None and self.step > self.total):
            return None
        return self.total

    @property
    def fraction(self) -> float | None:
        total = self.known_total
        return None if total is None or self.step is None else self.step / total

    @property
    def eta_secs(self) -> float | None:
        """Seconds to the last step at the current rate; None without a total or a rate."""
        total, rate = self.known_total, self.steps_per_second
        if total is None or self.step is None or not rate or rate <= 0:
            return None
        return (total - self.step) / rate

    def steps_text(self) -> str:
        """``185/1,500 (12 %)``, or ``185 (total unknown)``; the percentage rounds down (100 % only at the end)."""
        step = "-" if self.step is None else f"{self.step:,}"
        total, fraction = self.known_total, self.fraction
        if total is None:
            return f"{step} (total unknown)"
        pct = "" if fraction is None else f" ({int(fraction * 100)} %)"
        return f"{step}/{total:,}{pct}"

    def text(self, running: bool = True) -> str:
        """``step 185/1,500 (12 %) | ETA 1m 45s``; the ETA only while running and once a rate is known."""
        out = f"step {self.steps_text()}"
        eta = self.eta_secs
        if running and eta is not None and eta > 0:
            out += f" | ETA {format_duration(eta)}"
        return out

    def as_dict(self) -> dict[str, Any]:
        """For the dashboard API: ``total_steps`` (null when unknown), ``fraction``, ``steps_per_second``, ``eta_secs``,
        ``rate``: ``"recent"`` (the last minute's pace) or ``"average"`` (an ended run's, over all its steps)."""
        return {
            "step": self.step,
            "total_steps": self.known_total,
            "fraction": self.fraction,
            "steps_per_second": self.steps_per_second,
            "eta_secs": self.eta_secs,
            "rate": "average" if self.average else "recent",
            "tflops": self.tflops,
            "mfu": self.mfu,
        }


def iterations_text(steps: int, rewinds: Sequence[RunRewind]) -> str:
    """A run's steps beside the iterations its framework counted, which a rewind makes more (its log and checkpoint
    names number those): ``265 steps (300 iterations, 35 re-run after a rewind)``; ``265 steps`` without a rewind.

    A rewind from step S to a snapshot at T numbers steps T+1..S again, and the batches it passes over are iterations
    that trained nothing."""
    if not rewinds:
        return f"{steps:,} steps"
    rerun = sum(r.step - r.to_step for r in rewinds)
    passed = sum(r.skipped_batches for r in rewinds)
    after = "a rewind" if len(rewinds) == 1 else f"{len(rewinds)} rewinds"
    over = f", {passed:,} batches passed over" if passed else ""
    return f"{steps:,} steps ({steps + rerun + passed:,} iterations, {rerun:,} re-run after {after}{over})"


def total_steps_of(meta: dict[str, Any]) -> int | None:
    """The planned last step a run's ``meta.json`` holds (``total_steps``), or None."""
    total = meta.get("total_steps")
    return total if isinstance(total, int) and not isinstance(total, bool) and total > 0 else None


def run_progress(run: Run, running: bool = True) -> Progress:
    """An opened run's progress: its last step, ``total_steps`` from meta.json, its lowest rank's rate: the recent one
    while ``running``, else the average over all its steps (an ended run has no current pace); TFLOPS and MFU alike."""
    rank = run.ranks[0] if run.ranks else None
    t = run.series("t", rank=rank)
    window = RATE_WINDOW_SECS if running else math.inf
    tflops, mfu = (median_of(run, m, rank, window) for m in (vocab.TFLOPS, vocab.MFU))
    if not running:
        rate = steps_per_second(t.step.tolist(), t.value.tolist(), window_secs=math.inf)
        return Progress(run.last_step, total_steps_of(run.meta), rate, average=True, tflops=tflops, mfu=mfu)
    steps, times = t.step[-_RECENT:].tolist(), t.value[-_RECENT:].tolist()  # the window is the last minute: the tail will do
    return Progress(run.last_step, total_steps_of(run.meta), steps_per_second(steps, times), tflops=tflops, mfu=mfu)


def median_of(run: Run, metric: str, rank: int | None, window_secs: float) -> float | None:
    """The median finite value of ``rank``'s ``metric`` over its newest ``window_secs``, the first record (it holds
    the graph's compilation) left out; None without one."""
    s = run.series(metric, rank=rank)
    v, t = s.value[1:], s.t[1:]
    if len(t) and math.isfinite(window_secs):
        v = v[t >= t[-1] - window_secs]
    v = v[np.isfinite(v)]
    return float(np.median(v)) if len(v) else None
