"""A fault of mindwatch's own in a step hook: caught and said, never the end of the training it watches.

Example::

    failures = StepFailures(config)                     # one per front door
    failures.attach(rank, session.monitor.alert)        # once the run began: where monitor_failed goes
    try:
        ...                                             # record the step
    except Exception as e:
        failures.failed(e, step=step, where="on_train_step_end")   # ``strict: true`` raises it again
    else:
        failures.ok(step)
    if failures.given_up:
        ...                                             # record nothing more: keep the beat and the collectives

The first fault is logged with its traceback; the next ones are counted, and the count is said at most once a
minute (and at the run's end). After ``max_failed_steps`` failing steps in a row the rank stops recording: one
``monitor_failed`` alert names the exception and where it happened, and the front door keeps only what the other
ranks and the watchdog count on (its beat, its part in every collective, the actions every rank carries out).
Both front doors follow it alike. Training thread only.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mindwatch.alerts.alert import Alert, make_alert

log = logging.getLogger("mindwatch")

#: How often the count of faults since the last word is said.
REPORT_EVERY_SECS = 60.0
_PACKAGE = str(Path(__file__).resolve().parents[1])
_clock = time.monotonic


class StepFailures:
    """The failure policy of a front door's step hooks (see the module docstring)."""

    def __init__(self, config: Any) -> None:
        self.strict: bool = config.strict
        self.limit: int = config.max_failed_steps
        self.rank = 0
        #: Where ``monitor_failed`` goes (the session's ``Monitor.alert``), once the run has one.
        self.emit: Callable[[Alert], None] | None = None
        #: Failing steps in a row (a step that recorded well sets it back to 0), and in all.
        self.in_a_row = 0
        self.total = 0
        #: True once ``max_failed_steps`` steps in a row failed: this rank records nothing more.
        self.given_up = False
        self._unsaid = 0
        self._said_at = -REPORT_EVERY_SECS
        self._last = ""
        self._failed_step: int | None = None

    def attach(self, rank: int, emit: Callable[[Alert], None]) -> None:
        """The run has begun: this ``rank``'s ``monitor_failed`` alert goes to ``emit`` (``Monitor.alert``)."""
        self.rank, self.emit = rank, emit

    def ok(self, step: int) -> None:
        """The hooks of ``step`` are done: unless one of them failed, the failing steps in a row are none."""
        if step != self._failed_step:
            self.in_a_row = 0

    def failed(self, error: Exception, *, step: int | None, where: str) -> None:
        """``error`` came out of mindwatch's ``where`` at ``step``: say it (rate-limited) and count it (a step once);
        ``strict`` raises it again."""
        if self.strict:
            raise error
        self.total += 1
        if step is None or step != self._failed_step:
            self.in_a_row += 1
        self._failed_step = step
        place = f"{where}, {origin(error)}"
        self._last = f"step {step}: {error!r} in {place}"
        now = _clock()
        if self.total == 1:
            log.warning(
                "mindwatch: could not record step %s (%r in %s); training continues. This is a fault of mindwatch's "
                "own: please report it with this traceback",
                step,
                error,
                place,
                exc_info=error,
            )
            self._said_at = now
        elif now - self._said_at >= REPORT_EVERY_SECS:
            self._say(now, self._unsaid + 1)
        else:
            self._unsaid += 1
        if self.in_a_row >= self.limit and not self.given_up:
            self._give_up(error, step, place)

    def close(self) -> None:
        """The run ends: say the faults not said yet."""
        if self._unsaid:
            self._say(_clock(), self._unsaid)

    def _say(self, now: float, count: int) -> None:
        log.warning(
            "mindwatch: %d more step%s could not be recorded since the last warning (%d in all; the last at %s); "
            "training continues",
            count,
            "s" * (count != 1),
            self.total,
            self._last,
        )
        self._said_at, self._unsaid = now, 0

    def _give_up(self, error: Exception, step: int | None, place: str) -> None:
        self.given_up = True
        message = (
            f"mindwatch stopped recording on rank {self.rank}: {self.in_a_row} steps in a row failed, the last with "
            f"{error!r} in {place}. The training goes on unrecorded from step {step}; its liveness and actions go on"
        )
        log.error("mindwatch: %s", message)
        if self.emit is not None:
            alert = make_alert(
                "monitor_failed",
                step=step,
                rank=self.rank,
                message=message,
                severity="error",
                value=float(self.in_a_row),
                threshold=float(self.limit),
                error=repr(error),
                where=place,
            )
            self.emit(alert)


def origin(error: BaseException) -> str:
    """Where ``error`` was raised: the innermost frame of mindwatch's own (``mindspore/timing.py:120 in add``), else
    the innermost frame."""
    frames = traceback.extract_tb(error.__traceback__)
    ours = [f for f in frames if f.filename.startswith(_PACKAGE)] or frames
    if not ours:
        return "an unknown place"
    frame = ours[-1]
    name = frame.filename[len(_PACKAGE) + 1 :] if frame.filename.startswith(_PACKAGE) else frame.filename
    return f"{name}:{frame.lineno} in {frame.name}"
