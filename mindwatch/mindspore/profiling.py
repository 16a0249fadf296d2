"""The ``profile`` action: MindSpore's profiler around the next ``profile.steps`` steps, started and stopped at step
boundaries on the training thread, analysed off it.

Example::

    profiles = Profiles(session, rank=0)                 # nothing of MindSpore's profiler is made before a request
    done = profiles.start(alert, step=60)               # at the boundary after step 60: steps 61..65 are profiled
    profiles.after_step(65)                             # the boundary after the last: stop; MindSpore analyses it
    profiles.close()                                    # the run ends: stop what runs, wait for the analyses

Every rank carries the action out at the same boundary (it travels in the step's signal as the other actions do), so
the first profiled step S is one number on every rank: the folder ``profiles/step_<S>/rank<R>/``
(:mod:`mindwatch.store.profiles`), the request's answer and the intervention alert. ``mindspore.profiler.profile``
starts before step S and stops after step S + steps - 1; its analysis (the Chrome trace, ``trace_view.json``) runs in
the process MindSpore's asynchronous analysis forks (``tensorboard_trace_handler(async_mode=True)``), so the training
thread only starts and stops the collection. The op statistics (``cpu_op_type_info``) are written at the stop. A
request while a profile runs is folded into it (noted in its ``profile.json``); past ``profile.max`` a request is
answered with why. A profiler that fails to start, stop or analyse is a warning: this rank goes on unprofiled.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mindspore as ms

from mindwatch.config import ProfileSettings
from mindwatch.session import RunSession
from mindwatch.store.profiles import ProfileNote, profile_dir

log = logging.getLogger("mindwatch")

#: How long the run's end waits for MindSpore's analysis of a profile, at most.
ANALYSIS_WAIT_SECS = 300.0
#: Each device's profiler activities, besides the host's (``CPU``).
_DEVICE_ACTIVITY = {"Ascend": "NPU", "GPU": "GPU"}


class ProfilerUnavailable(RuntimeError):
    """This MindSpore cannot profile as asked (no ``mindspore.profiler.profile``, an activity it does not know)."""


def profiler_api() -> Any:
    """MindSpore's ``mindspore.profiler`` with the API a profile needs, or :class:`ProfilerUnavailable` saying what to do."""
    try:
        from mindspore import profiler
    except ImportError as e:
        raise ProfilerUnavailable(f"this MindSpore has no profiler ({e}): install MindSpore 2.5 or later to profile") from e
    missing = [n for n in ("profile", "tensorboard_trace_handler", "ProfilerActivity") if not hasattr(profiler, n)]
    if missing:
        raise ProfilerUnavailable(
            f"MindSpore {ms.__version__}'s profiler lacks {', '.join(missing)}: install MindSpore 2.5 or later to profile"
        )
    return profiler


def default_activities(target: str) -> list[str]:
    """What the device has: the host's ``CPU``, with the accelerator's (``NPU`` on Ascend, ``GPU``)."""
    extra = _DEVICE_ACTIVITY.get(target)
    return ["CPU", extra] if extra else ["CPU"]


@dataclass
class _Running:
    profiler: Any
    note: ProfileNote
    folder: Path


@dataclass
class _Analysis:
    note: ProfileNote
    folder: Path
    process: Any  # the multiprocessing.Process MindSpore's asynchronous analysis runs in (None: none seen)


class Profiles:
    """The run's profiles on this rank (see the module docstring)."""

    def __init__(self, session: RunSession, *, rank: int) -> None:
        self.session = session
        self.settings: ProfileSettings = session.config.profile
        self.rank = rank
        #: Profiles this run took (a request past ``settings.max`` is refused).
        self.taken = 0
        self.running: _Running | None = None
        self._analyses: list[_Analysis] = []
        #: The last step whose time a profile touched (the step after its last pays the stop); 0: none.
        self._touched_until = 0

    def start(self, alert: dict[str, Any], step: int) -> dict[str, Any]:
        """At the boundary after ``step``: profile the next ``profile.steps`` steps (or fold ``alert`` into the profile
        that runs, or refuse past ``profile.max``). Returns what the intervention alert says; raises what failed."""
        running = self.running
        if running is not None:
            note = running.note
            note.folded.append({k: alert.get(k) for k in ("rule", "requested_by", "reason", "step")})
            self._write(note, running.folder)
            return {
                "message": f"folded into the profile of steps {note.first_step} to {note.last_step}",
                "first_step": note.first_step,
                "profile": os.fspath(running.folder),
            }
        if self.taken >= self.settings.max:
            raise RuntimeError(f"this run took its {self.settings.max} profiles (profile.max); raise profile.max to take more")
        steps = _steps_asked(alert, self.settings.steps)
        first = step + 1
        folder = profile_dir(self.session.run_dir, first, self.rank)
        folder.mkdir(parents=True, exist_ok=True)
        note = ProfileNote(
            first,
            steps,
            self.rank,
            reason=alert.get("reason") if alert.get("rule") == "request" else alert.get("message"),
            rule=alert.get("rule"),
            requested_by=alert.get("requested_by"),
            alert_step=alert.get("step") if isinstance(alert.get("step"), int) else None,
            started_t=time.time(),
        )
        profiler = self._new_profiler(folder)
        profiler.start()
        self.taken += 1
        self.running = _Running(profiler, note, folder)
        self._write(note, folder)
        return {
            "message": f"profiling steps {first} to {note.last_step} into profiles/step_{first}/rank{self.rank}",
            "first_step": first,
            "profile_steps": steps,
            "profile": os.fspath(folder),
        }

    @property
    def busy(self) -> bool:
        """A profile runs, or its analysis (the boundaries have something to look at)."""
        return self.running is not None or bool(self._analyses)

    def profiled(self, step: int) -> bool:
        """Whether global step ``step``'s time includes the profiler's: a profiled step, or the step after the last (its
        time holds the stop). Its record says so (``profiled``), and ``throughput_drop`` does not judge it."""
        return (self.running is not None and step >= self.running.note.first_step) or step <= self._touched_until

    def after_step(self, step: int) -> None:
        """The boundary after ``step``: stop the profile whose last step it was; note the analyses that ended."""
        running = self.running
        if running is not None and step >= running.note.last_step:
            self.running = None
            self._stop(running)
        if self._analyses:
            self._collect(wait=0.0)

    def close(self) -> None:
        """The run ends: stop a profile still running (its steps as far as they went), wait for the analyses."""
        running = self.running
        if running is not None:
            self.running = None
            self._stop(running)
        if any(a.process is not None and a.process.is_alive() for a in self._analyses):
            log.info("mindwatch: waiting for MindSpore's analysis of the profile (at most %.0f s)", ANALYSIS_WAIT_SECS)
        self._collect(wait=ANALYSIS_WAIT_SECS)

    # -- MindSpore's profiler ------------------------------------------------------------------------------------------
    def _new_profiler(self, folder: Path) -> Any:
        api = profiler_api()
        s = self.settings
        names = s.activities or default_activities(str(ms.get_context("device_target")))
        try:
            activities = [getattr(api.ProfilerActivity, name) for name in names]
        except AttributeError as e:
            raise ProfilerUnavailable(f"MindSpore's profiler has no activity {e.name!r}: set profile.activities") from e
        kwargs: dict[str, Any] = {
            "activities": activities,
            "with_stack": s.with_stack,
            "on_trace_ready": api.tensorboard_trace_handler(os.fspath(folder), analyse_flag=True, async_mode=True),
        }
        if s.profiler_level is not None:
            kwargs["experimental_config"] = api._ExperimentalConfig(profiler_level=getattr(api.ProfilerLevel, s.profiler_level))
        return api.profile(**kwargs)

    def _stop(self, running: _Running) -> None:
        note = running.note
        self._touched_until = note.last_step + 1
        pool = _analysis_pool()
        before = list(getattr(pool, "porcess_list", ())) if pool is not None else []
        try:
            running.profiler.stop()  # the op statistics now; the trace in the analysis process it forks
        except Exception as e:  # a full disk, a profiler that breaks: this rank goes on unprofiled
            log.warning(
                "mindwatch: the profile of steps %d to %d failed to stop (%r); training continues",
                note.first_step,
                note.last_step,
                e,
            )
            note.state, note.error = "failed", repr(e)
            self._write(note, running.folder)
            return
        note.stopped_t = time.time()
        note.state = "analysing"
        started = [p for p in getattr(pool, "porcess_list", ()) if p not in before] if pool is not None else []
        self._analyses.append(_Analysis(note, running.folder, started[-1] if started else None))
        self._write(note, running.folder)

    def _collect(self, wait: float) -> None:
        """Note the analyses that ended as ``done`` (within ``wait`` seconds for all of them)."""
        deadline = time.monotonic() + wait
        for analysis in list(self._analyses):
            process = analysis.process
            if process is not None:
                process.join(max(0.0, deadline - time.monotonic()))
                if process.is_alive():
                    continue
            note = analysis.note
            note.state, note.analysed_t = "done", time.time()
            if process is not None and process.exitcode:
                note.state, note.error = "failed", f"MindSpore's analysis exited with code {process.exitcode}"
            self._analyses.remove(analysis)
            self._write(note, analysis.folder)

    def _write(self, note: ProfileNote, folder: Path) -> None:
        try:
            note.write(folder)
        except OSError as e:  # a full disk: the profile goes on, its note is late
            log.warning("mindwatch: cannot write %s (%s)", folder / "profile.json", e)


def _steps_asked(alert: dict[str, Any], default: int) -> int:
    """A person's ``--steps``, else ``profile.steps``."""
    asked = alert.get("profile_steps")
    return int(asked) if isinstance(asked, int) and asked >= 1 else default


def _analysis_pool() -> Any:
    """MindSpore's pool of asynchronous analysis processes (None where this MindSpore has none)."""
    try:
        from mindspore.profiler.common.process_pool import MultiProcessPool
    except ImportError:
        return None
    return MultiProcessPool()
