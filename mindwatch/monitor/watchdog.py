"""The stall watchdog: a thread that notices when no training step has ended for too long.

Example::

    dog = Watchdog(emit=monitor.alert, stacks_dir=run_dir / "stacks", rank=0, limits=StallLimits(timeout=120))
    dog.start()
    dog.last_beat = time.perf_counter()     # the training loop, at every step end (one attribute store)
    dog.stop()

When no beat came for ``timeout`` seconds (or, with ``timeout=None``, for
``max(floor, factor x median seconds between recorded steps)``), it writes the stack of every
thread to ``stacks/stall_rank<R>_<time>.txt`` (``sys._current_frames``, thread names included)
plus a ``faulthandler`` dump next to it, and emits a ``stall`` alert; when beats come back it
emits ``resumed``. The :class:`~mindwatch.sinks.alertlog.AlertLog` sink turns these into the
rank's ``stalled`` / ``running`` status. Before the first beat, compilation and the first batch
get their own, longer limit: set ``started = time.perf_counter()`` when training begins, and no
beat within ``first_step_timeout`` seconds of it is a stall too (a data pipeline or a collective
that hangs before step 1).

If the training thread holds the GIL inside C code, no Python thread runs, this one included;
for that case a ``faulthandler`` timer (a C thread) that this thread keeps re-arming writes
``stacks/gil_hang_rank<R>.txt`` once the watchdog itself has been starved for ``timeout``.

No stack-dump file is left empty: a dump is written whole under a hidden name, then renamed. The one
exception is the GIL guard's file, which faulthandler needs open before the hang (nothing can name a
file while the GIL is held); :meth:`Watchdog.stop` removes it when empty, and only a kill, which runs
no code, leaves it behind empty: readers (:mod:`mindwatch.alerts.hang`) take an empty file for no dump.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import math
import os
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from mindwatch.alerts.alert import RESUMED, STALL, Alert, make_alert

log = logging.getLogger("mindwatch")

#: The longest the watchdog thread sleeps: how late it may notice a first-step limit set, or a timeout shrunk, meanwhile.
MAX_WAIT = 1.0


def dump_stacks(directory: Path, name: str) -> Path:
    """Write every Python thread's stack to ``directory/<name>.txt`` (plus ``<name>.faulthandler.txt``); returns the path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.txt"
    names = {t.ident: t.name for t in threading.enumerate()}
    me = threading.get_ident()
    parts = [f"mindwatch stack dump at {time.strftime('%Y-%m-%d %H:%M:%S')} (pid {os.getpid()})\n"]
    for ident, frame in sys._current_frames().items():
        label = names.get(ident) or "thread started outside Python (e.g. a MindSpore dataset worker)"
        mark = " (the watchdog itself)" if ident == me else ""
        parts.append(f"\n--- thread {ident}: {label}{mark}\n")
        parts.append("".join(traceback.format_stack(frame)))
    _write_whole(path, lambda f: f.write("".join(parts)))
    _write_whole(directory / f"{name}.faulthandler.txt", lambda f: faulthandler.dump_traceback(f, all_threads=True))
    return path


def _write_whole(path: Path, write: Callable[[IO[str]], object]) -> None:
    """``write`` into a hidden file beside ``path``, renamed to ``path`` once complete: a kill or a full disk mid-write
    leaves no empty or cut-short dump under a name readers list."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # this process's own: rank 0 may keep a relayed copy
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


@dataclass(frozen=True)
class StallLimits:
    """How long without a step end is a stall (``alerts.stall_timeout``, ``stall_floor``, ``stall_factor`` and
    ``first_step_timeout``; docs/alerts.md)."""

    #: Seconds; None: ``max(floor, factor x median seconds between recorded steps)``.
    timeout: float | None = None
    #: Seconds before the first step ends (compilation and the first batch); None: no limit.
    first_step_timeout: float | None = None
    floor: float = 60.0
    factor: float = 10.0


class Watchdog:
    """See the module docstring. ``emit`` receives the ``stall`` / ``resumed`` alerts (``Monitor.alert``)."""

    def __init__(
        self,
        emit: Callable[[Alert], None],
        stacks_dir: Path,
        *,
        rank: int = 0,
        limits: StallLimits = StallLimits(),
        poll_secs: float = 0.1,
        actions: Sequence[str] = (),
        gil_guard: bool = True,
    ) -> None:
        self.emit = emit
        self.stacks_dir = Path(stacks_dir)
        self.rank = rank
        self.fixed_timeout = limits.timeout
        self.first_step_timeout = limits.first_step_timeout
        #: perf_counter() when training began (arms the first-step limit); None: not told.
        self.started: float | None = None
        self.floor, self.factor = limits.floor, limits.factor
        self.poll_secs = poll_secs
        self.actions = list(actions)
        #: perf_counter() of the last step end; None until the first (the watchdog is armed by it).
        self.last_beat: float | None = None
        #: The last recorded step (learnt from the records on the worker thread).
        self.step: int | None = None
        self.stalled = False
        self.stalls = 0
        self._stalled_beat: float | None = None
        self._gaps: deque[float] = deque(maxlen=100)
        self._last_t: float | None = None
        self._gil_guard = gil_guard
        self._gil_file: IO[str] | None = None
        self._gil_armed_at = -1e18
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- timeout ------------------------------------------------------------
    @property
    def timeout(self) -> float:
        """Seconds without a step end that count as a stall."""
        if self.fixed_timeout is not None:
            return self.fixed_timeout
        if not self._gaps:
            return self.floor
        s = sorted(self._gaps)
        return max(self.floor, self.factor * s[len(s) // 2])

    def compiling(self, now: float) -> None:
        """The next step compiles a graph (e.g. the second of a train cell with per-layer statistics): the first-step
        limit applies to it, as to the first step, not the stall timeout. Called by the training thread."""
        self.started, self.last_beat = now, None
        if self._gil_file is not None:
            faulthandler.cancel_dump_traceback_later()  # armed again after the step: a compile may hold the GIL
            self._gil_armed_at = -1e18

    # -- sink interface: learns the step rhythm and the last step from the records (worker thread) --
    def write(self, records: list[dict[str, Any]]) -> None:
        for rec in records:
            step = rec.get("step")
            if isinstance(step, int):
                self.step = step
            t = rec.get("t")
            if isinstance(t, (int, float)):
                if self._last_t is not None and t > self._last_t:
                    self._gaps.append(t - self._last_t)
                self._last_t = t

    def flush(self) -> None:
        pass

    def close(self, state: str, error: str | None = None, reason: str | None = None) -> None:
        self.stop()

    # -- thread -------------------------------------------------------------
    def start(self) -> Watchdog:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="mindwatch-watchdog", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread; a stall that steps ended since gets its ``resumed`` alert now."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(2.0)
        if self.stalled and self.last_beat != self._stalled_beat:
            self.check(time.perf_counter())
        self._disarm_gil_guard()

    def _run(self) -> None:
        wait = self.poll_secs
        while not self._stop.wait(wait):
            now = time.perf_counter()
            try:
                self.check(now)
                wait = self.next_look(now)
            except Exception as e:  # the watchdog must never take the training down
                log.warning("mindwatch: stall watchdog check failed: %r", e)
                wait = self.poll_secs

    def next_look(self, now: float) -> float:
        """Seconds until the thread looks again: when the stall limit would pass if no beat came (at most ``MAX_WAIT``).

        Beats are attribute stores that wake nobody, so a look at the deadline finds a newer beat and sleeps on;
        while stalled it looks every ``poll_secs`` to notice the steps coming back.
        """
        if self.stalled:
            return self.poll_secs
        beat = self.last_beat
        if beat is not None:
            deadline = beat + self.timeout
        elif self.started is not None and self.first_step_timeout is not None:
            deadline = self.started + self.first_step_timeout
        else:
            deadline = math.inf
        wait = deadline - now
        if self._gil_file is not None:
            wait = min(wait, self._gil_armed_at + self._gil_rearm_secs - time.monotonic())
        return min(max(wait, self.poll_secs), MAX_WAIT)

    def check(self, now: float) -> None:
        """One look at the clock (the thread calls it when :meth:`next_look` says)."""
        beat = self.last_beat
        if beat is None:  # no step ended yet: only the first-step limit applies
            if self.started is None or self.first_step_timeout is None:
                return
            beat, timeout = self.started, self.first_step_timeout
        else:
            self._arm_gil_guard()  # not while compiling: a long compile may hold the GIL
            timeout = self.timeout
        idle = now - beat
        if not self.stalled and idle > timeout:
            self.stalled = True
            self.stalls += 1
            self._stalled_beat = beat
            self._on_stall(idle, timeout)
        elif self.stalled and self._stalled_beat is not None and beat != self._stalled_beat:
            self.stalled = False
            gap = beat - self._stalled_beat  # from the last step before the stall to the first after it
            msg = f"steps are back after a stall of {gap:.1f} s"
            self.emit(make_alert(RESUMED, step=self.step, rank=self.rank, message=msg, severity="info", value=gap))

    def _on_stall(self, idle: float, timeout: float) -> None:
        name = f"stall_rank{self.rank}_{time.strftime('%Y%m%d_%H%M%S')}"
        try:
            path: Path | None = dump_stacks(self.stacks_dir, name)
        except OSError as e:
            log.warning("mindwatch: cannot write the stack dump to %s (%s)", self.stacks_dir, e)
            path = None
        where = f"; stacks of every thread in {path}" if path else ""
        if self.last_beat is None:
            since = f"since training began (first-step timeout {timeout:.1f} s: compilation and the first batch included)"
            msg = f"no training step has ended {since}, {idle:.1f} s{where}"
        else:
            msg = f"no training step has ended for {idle:.1f} s (stall timeout {timeout:.1f} s) after step {self.step}{where}"
        self.emit(
            make_alert(
                STALL,
                step=self.step,
                rank=self.rank,
                message=msg,
                metric="seconds_since_step",
                value=idle,
                threshold=timeout,
                severity="error",
                actions=self.actions,
                stacks=str(path) if path else None,
            )
        )

    # -- GIL starvation guard -----------------------------------------------
    @property
    def _gil_rearm_secs(self) -> float:
        return max(1.0, self.timeout / 10)

    def _arm_gil_guard(self) -> None:
        now = time.monotonic()
        rearm = self._gil_rearm_secs
        if not self._gil_guard or now - self._gil_armed_at < rearm:
            return
        self._gil_armed_at = now
        try:
            if self._gil_file is None:
                self.stacks_dir.mkdir(parents=True, exist_ok=True)
                self._gil_file = open(self.stacks_dir / f"gil_hang_rank{self.rank}.txt", "w", encoding="utf-8")  # noqa: SIM115
            # re-armed every `rearm` s (each arming starts a C thread): it fires only when this thread got no GIL for a timeout
            faulthandler.dump_traceback_later(self.timeout + rearm + self.poll_secs, repeat=False, file=self._gil_file)
        except (OSError, ValueError, RuntimeError) as e:
            self._gil_guard = False
            log.warning("mindwatch: the GIL hang guard is off (%s)", e)

    def _disarm_gil_guard(self) -> None:
        if self._gil_file is None:
            return
        faulthandler.cancel_dump_traceback_later()
        with contextlib.suppress(OSError):
            self._gil_file.close()
            path = Path(self._gil_file.name)
            if path.stat().st_size == 0:
                path.unlink()
        self._gil_file = None
