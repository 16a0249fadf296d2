"""Carry out what the alert rules request, with MindSpore, at a step boundary.

Example::

    prepare_optimizer(config, opt)                  # training begins: before the graph is compiled
    act = Interventions(session, optimizer=opt, saved=train_net, lr_probe=probe)
    if session.control.pending:                     # at a step boundary
        act.carry_out(step, boundary)               # the front door's StepBoundary: how to stop, its checkpoints

- ``stop``: ``run_context.request_stop()`` (a loop's ``should_stop``); the run ends ``stopped`` with the alert as the reason.
- ``checkpoint``: ``ms.save_checkpoint`` of the train network (a loop's network and optimizer) into
  ``<run_dir>/checkpoints/``, and
  the newest checkpoint a ``ModelCheckpoint`` (MindFormers' ``CheckpointMonitor`` is one) wrote *before* the anomaly
  (the last healthy one).
- ``lr_backoff``: multiply the learning rate by ``alerts.lr_backoff_factor`` from the next step on:
  a fixed rate or a per-step list is rewritten in place (``ops.assign``, works in GRAPH and
  PyNative mode); a ``LearningRateSchedule`` is wrapped at train begin in :class:`ScaledSchedule`,
  whose scale parameter is lowered.
- ``dump_stacks``: every thread's stack into ``<run_dir>/stacks/``.
- ``profile``: MindSpore's profiler around the next ``profile.steps`` steps, into ``<run_dir>/profiles/step_<S>/rank<R>/``
  (:mod:`mindwatch.mindspore.profiling`).
- ``shrink_batch``, ``grow_batch``, ``resize_batch``: a :class:`~mindwatch.mindspore.dynamic_batch.DynamicBatch`'s size,
  from a step agreed in advance (:class:`~mindwatch.mindspore.dynamic_batch.BatchChanges`), the learning rate with it
  when ``dynamic_batch.scale_lr`` says so.
- ``rewind``: the weights and optimizer state of the newest snapshot before the alert's step, and the next
  ``rewind.skip`` batches passed over (:mod:`mindwatch.mindspore.rewind`); after ``rewind.max`` rewinds, ``rewind.then``.

Each action done is reported as an ``intervention`` alert (``severity: info``) naming what it
did: ``lr_before``/``lr_after``, ``checkpoint``/``last_healthy_checkpoint``, ``stacks``.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import mindspore as ms
from mindspore import nn, ops
from mindspore.nn.learning_rate_schedule import LearningRateSchedule
from mindspore.train import ModelCheckpoint

from mindwatch import metrics as vocab
from mindwatch.alerts.alert import Alert, Cooldown, make_alert
from mindwatch.alerts.registry import configured_actions
from mindwatch.alerts.rules.nonfinite import NonFiniteRule, checked_in_step
from mindwatch.alerts.skip import SkipRule
from mindwatch.mindspore.dynamic_batch import BatchChanges
from mindwatch.mindspore.profiling import ProfilerUnavailable, Profiles, profiler_api
from mindwatch.mindspore.rewind import Rewinds
from mindwatch.monitor.watchdog import dump_stacks
from mindwatch.session import RunSession

log = logging.getLogger("mindwatch")


class ScaledSchedule(LearningRateSchedule):
    """A ``LearningRateSchedule`` times a scale held in a Parameter (so a compiled graph sees changes)."""

    def __init__(self, schedule: LearningRateSchedule) -> None:
        super().__init__()
        self.schedule = schedule
        self.scale = ms.Parameter(ms.Tensor(1.0, ms.float32), name="mindwatch_lr_scale", requires_grad=False)

    def construct(self, global_step):
        return self.schedule(global_step) * self.scale


def wrap_schedules(optimizer: nn.Optimizer) -> bool:
    """Wrap the optimizer's ``LearningRateSchedule`` in :class:`ScaledSchedule` (before compilation); True if it did."""
    lr = getattr(optimizer, "learning_rate", None)
    if isinstance(lr, LearningRateSchedule) and not isinstance(lr, ScaledSchedule):
        optimizer.learning_rate = ScaledSchedule(lr)
        return True
    return False


def scale_learning_rate(optimizer: nn.Optimizer, factor: float) -> None:
    """Multiply the optimizer's learning rate(s) by ``factor``, effective from the next step.

    Raises ``TypeError`` for a kind of rate it cannot change (e.g. a schedule not wrapped by
    :func:`wrap_schedules` before the first step).
    """
    lrs = optimizer.learning_rate
    items = list(lrs) if isinstance(lrs, (tuple, list, ms.ParameterTuple, nn.CellList)) else [lrs]
    for lr in items:
        target = _rate_parameter(lr)
        ops.assign(target, target * factor)  # in place: the compiled graph keeps the same buffer


def _rate_parameter(lr: Any) -> ms.Parameter:
    if isinstance(lr, ms.Parameter):  # a fixed rate
        return lr
    if isinstance(lr, ScaledSchedule):
        return lr.scale
    inner = getattr(lr, "learning_rate", None)  # _IteratorLearningRate (a per-step table) / _ConvertToCell
    if isinstance(inner, ms.Parameter):
        return inner
    raise TypeError(
        f"lr_backoff cannot change a learning rate of type {type(lr).__name__}: a LearningRateSchedule must be "
        "wrapped before training starts (MonitorCallback does it when an alert rule lists lr_backoff)"
    )


def prepare_optimizer(config: Any, optimizer: Any) -> bool:
    """Before the graph compiles: wrap the optimizer's schedule when a rule may ask for ``lr_backoff`` (or the learning
    rate follows the batch size, ``dynamic_batch.scale_lr``); True if it did."""
    scaled = "lr_backoff" in configured_actions(config) or config.dynamic_batch.scale_lr != "none"
    return optimizer is not None and scaled and wrap_schedules(optimizer)


_CKPT_SUFFIXES = (".ckpt", ".safetensors")  # CheckpointConfig(format="ckpt" | "safetensors")
# ModelCheckpoint: <prefix>-<epoch>_<step in epoch>.<format>, epochs of batch_num steps (the sink size in sink mode)
_CKPT_NAME = re.compile(r"-(\d+)_(\d+)(?:_breakpoint)?\.(?:ckpt|safetensors)$")


def checkpoint_files(callbacks: list[Any] | None, latest: str | None) -> list[Path]:
    """Checkpoint files the user's ``ModelCheckpoint`` callbacks wrote (and ``latest_ckpt_file``).

    A subclass counts too: MindFormers' ``CheckpointMonitor`` writes into its ``_directory``,
    ``output/checkpoint/rank_<R>/``, as ``<prefix>_rank_<R>-<epoch>_<step>.ckpt`` (or ``.safetensors``).
    """
    dirs: set[Path] = set()
    files: set[Path] = set()
    if latest:
        files.add(Path(latest))
        dirs.add(Path(latest).parent)
    for cb in callbacks or []:
        if isinstance(cb, ModelCheckpoint) and cb._directory:
            dirs.add(Path(cb._directory))
    for d in dirs:
        if d.is_dir():
            for suffix in _CKPT_SUFFIXES:
                files.update(d.glob(f"*{suffix}"))
    return [f for f in files if f.is_file()]


def last_healthy_checkpoint(files: list[Path], *, before_step: int, steps_per_epoch: int | None, before_t: float) -> Path | None:
    """The newest of ``files`` saved before step ``before_step`` (the anomaly) changed the weights.

    ``ModelCheckpoint`` names give the step (``<prefix>-<epoch>_<step>.ckpt``, with ``steps_per_epoch``);
    other files count when they were written before the wall time ``before_t``.
    """
    healthy = []
    for f in files:
        m = _CKPT_NAME.search(f.name)
        try:
            mtime = f.stat().st_mtime
        except OSError:
            continue
        if m and steps_per_epoch:
            step = (int(m.group(1)) - 1) * steps_per_epoch + int(m.group(2))
            ok = step < before_step
        else:
            ok = mtime < before_t
        if ok:
            healthy.append((mtime, f))
    return max(healthy)[1] if healthy else None


def coordination_fields(info: dict[str, Any] | None, step: int) -> dict[str, Any]:
    """What the intervention alert says about the agreement (docs/distributed.md): the agreed step, lateness, or acting alone."""
    if not info:
        return {}
    if info.get("alone"):
        return {"alone": info["alone"]}
    at = info.get("at_step")
    out: dict[str, Any] = {"decision": info.get("seq"), "requested_by": info.get("requested_by")}
    if isinstance(at, int):
        out["at_step"] = at
        if step > at:
            out["late_steps"] = step - at
    return out


class StepBoundary(Protocol):
    """What a front door tells :meth:`Interventions.carry_out` of the step boundary it acts at.

    ``request_stop``: ends the training after this step (``run_context.request_stop``, or a loop's
    ``should_stop``); ``checkpoints``: the checkpoint files the user's own callbacks wrote so far;
    ``steps_per_epoch``: to read the step out of ``ModelCheckpoint``'s file names; ``iteration``: the framework's own
    count of this step (``cur_step_num``, a loop's calls), ahead of the step after a rewind.
    """

    @property
    def steps_per_epoch(self) -> int | None: ...

    @property
    def iteration(self) -> int: ...

    def request_stop(self) -> None: ...

    def checkpoints(self) -> list[Path]: ...

    def rewound(self, to_step: int, from_step: int) -> None:
        """A rewind at ``from_step`` went back to ``to_step``: the next step is numbered ``to_step + 1``."""
        ...


class Interventions:
    """The MindSpore side of :class:`~mindwatch.monitor.control.Control`. See the module docstring.

    ``saved``: what a checkpoint holds, a Cell (the train network: weights and optimizer state) or
    ``{name: Parameter}`` (a loop's network and optimizer).
    """

    def __init__(
        self,
        session: RunSession,
        *,
        optimizer: Any,
        saved: Any,
        lr_probe: Any = None,
        rank: int = 0,
        batch: Any = None,
        rewinds: Rewinds | None = None,
        collective: bool = False,
        rewound: Callable[[], int] = lambda: 0,
    ) -> None:
        self.session = session
        #: The training's :class:`~mindwatch.mindspore.dynamic_batch.DynamicBatch`, with what changes it; None: none.
        self.batch = (
            BatchChanges(
                batch,
                session.config.dynamic_batch,
                report=self.report,
                schedule=session.control.schedule,
                collective=collective,
                rewound=rewound,
            )
            if batch is not None
            else None
        )
        self.optimizer = optimizer
        self.saved = saved
        self.lr_probe = lr_probe
        self.rank = rank
        self.factor = session.config.alerts.lr_backoff_factor
        self.stop_reason: str | None = None
        a = session.config.alerts
        checked = checked_in_step(a)
        #: Whether the training thread checks loss / grad_norm for NaN itself.
        self.guard_nonfinite = bool(checked)
        # values every rank shares (grad_norm after the all-reduce) are checked first: every rank decides alike
        shared = [m for m in checked if (known := vocab.get(m)) is not None and known.same_on_every_rank]
        own = [m for m in checked if m not in shared]
        self._nonfinite_shared = NonFiniteRule(shared, rank=rank, actions=a.nonfinite.actions) if shared else None
        self._nonfinite_own = NonFiniteRule(own, rank=rank, actions=a.nonfinite.actions) if own else None
        self._cooldown = Cooldown(a.cooldown_secs)
        skip = session.config.skip_steps
        #: ``skip_steps``: its alerts, raised here so that ``max_consecutive`` skips act on that very step.
        self._skip = SkipRule(skip, rank=rank) if skip.enabled else None
        self._skip_shared = vocab.get(skip.metric).same_on_every_rank  # type: ignore[union-attr]
        #: The run's snapshots for ``rewind`` (None: it takes none).
        self.rewinds = rewinds
        #: The ``profile`` action's profiles (MindSpore's profiler is made at the first request, not before).
        self.profiles = Profiles(session, rank=rank)
        if "profile" in configured_actions(session.config):
            try:
                profiler_api()
            except ProfilerUnavailable as e:
                log.warning("mindwatch: the profile action cannot run: %s", e)

    def nonfinite(self, rec: dict[str, Any]) -> None:
        """A NaN/Inf in this step's record: raise the non-finite alert and request its actions for this very step.

        A NaN/Inf in a value every rank shares (``grad_norm``) is seen by every rank on the same step: each acts at
        once, with no agreement to wait for, and rank 0 alone raises the alert (once for the run). A rank's own
        value (its loss) is raised by that rank and agreed with the others (every rank acts at one step).
        """
        session = self.session
        shared = self._nonfinite_shared.check(rec) if self._nonfinite_shared is not None else []
        for alert in shared:
            if self._cooldown.admit(alert):
                session.control.request(alert, every_rank_alike=True)
                if session.speaks_for_the_run:
                    session.monitor.alert(alert)
        if shared or self._nonfinite_own is None:
            return
        for alert in self._nonfinite_own.check(rec):
            if self._cooldown.admit(alert):
                session.emit_alert(alert)

    def skipped(self, rec: dict[str, Any]) -> None:
        """``skip_steps`` skipped this step's update: its ``skip`` alert, and after ``max_consecutive`` in a row the
        configured actions. On ``grad_norm`` (the same on every rank) every rank skipped alike: each acts at once and
        rank 0 alone raises the alerts; on a rank's own ``loss``, the rank raises them and the ranks agree on the step."""
        if self._skip is None:
            return
        session = self.session
        for alert in self._skip.check(rec):
            if not self._skip_shared:
                session.emit_alert(alert)
                continue
            if alert.get("actions"):
                session.control.request(alert, every_rank_alike=True)
            if session.speaks_for_the_run:
                session.monitor.alert(alert)

    def carry_out(self, step: int, boundary: StepBoundary) -> None:
        """Do every request due after ``step`` (training thread, at a step boundary), and what those file for this very
        boundary. Failures are warnings."""
        while due := self.session.control.take(step):
            for action, alert in due:
                self._do(action, alert, step, boundary)

    def act(self, alert: Alert, step: int, boundary: StepBoundary) -> None:
        """Carry out ``alert``'s actions at this boundary, now (an alert every rank raised alike at this very boundary:
        early stopping, decided on the ranks' agreed evaluation)."""
        for action in alert.get("actions") or ():
            self._do(action, alert, step, boundary)

    def _do(self, action: str, alert: Alert, step: int, boundary: StepBoundary) -> None:
        try:
            done = getattr(self, f"_{action}")(alert, step, boundary)
        except Exception as e:
            log.warning("mindwatch: the %s action for the %s alert failed: %r; training continues", action, alert.get("rule"), e)
            done = {"message": f"{action} failed: {e!r}", "severity": "warning", "error": repr(e)}
        # None: nothing to do (a rewind that an earlier one covers), or recorded later (a batch size change,
        # once the ranks agreed its step)
        if done is not None:
            self.report(action, alert, step, done)

    def report(self, action: str, alert: Alert, step: int, done: dict[str, Any]) -> None:
        """The ``intervention`` alert of ``action`` done at the boundary after ``step`` for ``alert``: ``done`` says what
        (its ``message``, its ``severity``, what it made)."""
        action = done.pop("action", action)  # a rewind past rewind.max does rewind.then
        cause = f"{alert.get('rule')}" + (f" on {alert['metric']}" if alert.get("metric") else "")
        asked_at = f" at step {alert['step']}" if alert.get("step") is not None else ""  # a request before step 1
        message = f"{done.pop('message')} (requested by the {cause} alert{asked_at}"
        message += f" on rank {alert.get('rank')})" if alert.get("rank") is not None and alert.get("rank") != self.rank else ")"
        done.update(coordination_fields(alert.get("coordination"), step))
        if alert.get("request"):  # a person's request: its answer is written when this alert is
            done["request"] = alert["request"]
        if done.get("late_steps"):
            message += f"; {done['late_steps']} steps later than the agreed step {done['at_step']}"
        elif done.get("alone"):
            message += f"; this rank alone: {done['alone']}"
        held = done.pop("held", False)
        record = make_alert(
            "intervention",
            step=step,
            rank=self.rank,
            message=message,
            severity=done.pop("severity", "info"),
            actions=[action],
            cause=alert.get("rule"),
            cause_step=alert.get("step"),
            **done,
        )
        if held and self.rewinds is not None:  # out once the batches after the rewind have passed, with their names
            self.rewinds.hold(record)
        else:
            self.session.monitor.alert(record)

    # -- actions: each returns what to put in the intervention alert ---------------
    def _stop(self, alert: Alert, step: int, boundary: StepBoundary) -> dict[str, Any]:
        boundary.request_stop()
        if self.stop_reason is None and alert.get("rule") == "request":
            self.stop_reason = f"stopped by {alert.get('requested_by')}" + (f": {alert['reason']}" if alert.get("reason") else "")
        elif self.stop_reason is None:
            self.stop_reason = f"stopped by mindwatch: {alert.get('message')}"
        return {"message": f"training stops after step {step}"}

    def _lr_backoff(self, alert: Alert, step: int, boundary: StepBoundary) -> dict[str, Any]:
        if self.optimizer is None:
            raise RuntimeError("no optimizer in the training")
        factor = float(alert.get("lr_factor") or self.factor)  # a person's request says its own factor
        before = self.lr_probe(step + 1) if self.lr_probe is not None else None
        scale_learning_rate(self.optimizer, factor)
        after = None
        if self.lr_probe is not None:
            self.lr_probe.invalidate()
            after = self.lr_probe(step + 1)
        shown = f"{before:.3g} -> {after:.3g}" if before is not None and after is not None else f"x {factor:g}"
        return {
            "message": f"learning rate {shown} from step {step + 1}",
            "lr_before": before,
            "lr_after": after,
            "factor": factor,
        }

    def _checkpoint(self, alert: Alert, step: int, boundary: StepBoundary) -> dict[str, Any]:
        if self.saved is None:
            raise RuntimeError("no network to save (pass network= to start_run)")
        directory = self.session.run_dir / "checkpoints"
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"anomaly_rank{self.rank}_step{step}.ckpt"
        # the files are named by the framework's count, which a rewind does not take back: the alert's step in it
        asked_at = int(alert.get("step") or step)
        healthy = last_healthy_checkpoint(
            boundary.checkpoints(),
            before_step=boundary.iteration - (step - asked_at),
            steps_per_epoch=boundary.steps_per_epoch,
            before_t=float(alert.get("t") or 0.0),
        )
        ms.save_checkpoint(self.saved, str(path))
        last = f"; last checkpoint saved while healthy: {healthy}" if healthy else "; no earlier checkpoint found"
        return {
            "message": f"saved {path.name}{last}",
            "checkpoint": os.fspath(path),
            "last_healthy_checkpoint": os.fspath(healthy) if healthy else None,
        }

    def _shrink_batch(self, alert: Alert, step: int, boundary: StepBoundary) -> dict[str, Any] | None:
        return self._batch_changes().ask("shrink_batch", alert, step)

    def _grow_batch(self, alert: Alert, step: int, boundary: StepBoundary) -> dict[str, Any] | None:
        return self._batch_changes().ask("grow_batch", alert, step)

    def _resize_batch(self, alert: Alert, step: int, boundary: StepBoundary) -> dict[str, Any] | None:
        return self._batch_changes().ask("resize_batch", alert, step)

    def _batch_changes(self) -> Any:
        if self.batch is None:
            raise RuntimeError(
                "this training has no DynamicBatch: build batch = mw.DynamicBatch(32, min=8, max=128), pass it to "
                "dataset.batch(batch_size=batch) and to MonitorCallback(config, batch=batch) or start_run(..., batch=batch)"
            )
        return self.batch

    def _batch_lr(self, alert: Alert, step: int, boundary: StepBoundary) -> dict[str, Any]:
        """``dynamic_batch.scale_lr``: the learning rate follows a batch size change, from its ``from_step``."""
        done = self._lr_backoff(alert, step, boundary)
        done["message"] += f" (dynamic_batch.scale_lr, with the batch size from step {alert.get('from_step')})"
        return done

    def _rewind(self, alert: Alert, step: int, boundary: StepBoundary) -> dict[str, Any] | None:
        rewinds = self.rewinds
        if rewinds is None:
            raise RuntimeError("this run takes no snapshots: give it a rewind section (rewind: {every: 100}) to rewind")
        asked = alert.get("step")
        asked = asked if isinstance(asked, int) else step  # a person's request without --to: before this step
        asked = min(asked, int(alert["to_step"]) + 1) if isinstance(alert.get("to_step"), int) else asked
        if alert.get("rule") != "request" and rewinds.covers(asked, step):
            log.info("mindwatch: the rewind at step %d already went back past step %d", step, asked)
            return None
        if rewinds.exhausted:
            n = rewinds.count
            past = {**alert, "message": f"{n} rewind{'s' if n > 1 else ''} did not get past: {alert.get('message')}"}
            then = rewinds.settings.then
            return {**getattr(self, f"_{then}")(past, step, boundary), "action": then}
        iteration = boundary.iteration  # before the rewind: the framework's count of the step it acts at
        snapshot = rewinds.go_back(asked, step)
        boundary.rewound(snapshot.step, step)
        self.session.control.forget_after(snapshot.step)
        if self.lr_probe is not None:
            self.lr_probe.invalidate()
        skip = rewinds.passing
        if self.session.planned:  # the steps taken back, and the batches passed over, are not steps the run makes
            self.session.plan(self.session.planned - (step - snapshot.step) - skip)
        return {
            "message": f"rewound from step {step} (iteration {iteration}) to step {snapshot.step} "
            f"(rewind {rewinds.count} of {rewinds.settings.max})",
            "iteration": iteration,
            "to_step": snapshot.step,
            "skipped_batches": skip,
            "held": True,
        }

    def _profile(self, alert: Alert, step: int, boundary: StepBoundary) -> dict[str, Any]:
        return self.profiles.start(alert, step)

    def _dump_stacks(self, alert: Alert, step: int, boundary: StepBoundary) -> dict[str, Any]:
        path = dump_stacks(self.session.layout.stacks, f"request_rank{self.rank}_step{step}")
        return {"message": f"stacks of every thread in {path}", "stacks": os.fspath(path)}


def network_and_optimizer(network: Any, optimizer: Any) -> dict[str, Any] | None:
    """``{name: Parameter}`` of ``network`` and ``optimizer`` (its moments, step, rate): what a loop's checkpoint saves."""
    params: dict[str, Any] = {}
    for cell in (network, optimizer):
        if cell is not None:
            for p in cell.get_parameters():
                params.setdefault(p.name, p)
    return params or None
