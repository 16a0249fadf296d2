"""A run's best loss, one definition for every view: the smallest finite ``loss`` on the line the training kept.

Example::

    best = BestLoss()                          # the writer's, as records come (the status file's ``best_loss``)
    for step, loss in [(1, 3.0), (2, 1.0), (3, 2.0), (2, 2.5), (3, 2.2)]:   # a rewind went back to step 1
        best.add(step, loss)
    best.value, best.step                      # (2.2, 3): step 2's 1.0 was on the abandoned branch
    kept_best(steps, losses)                   # the same answer from a whole series (the report, the summary)

The line is the ``loss`` series in the order written (records without a loss, such as a user's metrics logged at an
earlier step, go back on nothing). A value whose step a later loss went back to or before (a rewind, a relaunch from
an earlier checkpoint) was on a branch the training abandoned: it no longer counts. :class:`BestLoss` keeps the record
lows of the kept line (a stack of ever smaller losses at ever later steps), so a rewind pops the lows it abandoned and
the best before them is the best again. The listing (the runs page, ``mindwatch runs``) reads the writer's running
value; the full summary (the report, ``mindwatch check``) computes it from the series with :func:`kept_best`;
``tests/test_best_loss.py`` holds them to one answer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np


class BestLoss:
    """The best loss of the kept line, as records come (see the module docstring)."""

    def __init__(self, lows: Iterable[tuple[int, float]] = ()) -> None:
        #: ``(step, loss)`` of each record low of the kept line: steps rising, losses falling.
        self.lows: list[tuple[int, float]] = []
        for step, loss in lows:
            self.add(step, loss)

    def add(self, step: int, loss: object) -> None:
        """A ``loss`` of ``step`` was written (NaN, Inf or None too: only a finite number can be the best, yet each goes
        back on the steps it passes)."""
        lows = self.lows
        while lows and lows[-1][0] >= step:  # went back: what it passes over was abandoned
            lows.pop()
        if isinstance(loss, (int, float)) and math.isfinite(loss) and (not lows or loss < lows[-1][1]):
            lows.append((step, float(loss)))

    @property
    def value(self) -> float | None:
        return self.lows[-1][1] if self.lows else None

    @property
    def step(self) -> int | None:
        return self.lows[-1][0] if self.lows else None


def kept(steps: np.ndarray) -> np.ndarray:
    """Which values of a series whose ``steps`` are in the order written are on the kept line: every later value's step
    is above theirs."""
    if len(steps) == 0:
        return np.zeros(0, bool)
    later_min = np.minimum.accumulate(steps[::-1])[::-1]  # the smallest step from each record on
    out = np.ones(len(steps), bool)
    out[:-1] = steps[:-1] < later_min[1:]
    return out


def kept_best(steps: np.ndarray, losses: np.ndarray) -> tuple[float, int] | None:
    """``(best loss, its step)`` of a whole series in the order written (raw, abandoned branches included); None when
    the kept line has no finite loss."""
    on_line = kept(np.asarray(steps)) & np.isfinite(losses)
    if not on_line.any():
        return None
    i = int(np.argmin(np.where(on_line, losses, np.inf)))
    return float(losses[i]), int(steps[i])
