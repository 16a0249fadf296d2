"""Rewind a training past a bad stretch: snapshots of its state in host memory, and going back to one.

Example::

    rewinds = Rewinds(config.rewind, network_and_optimizer(net, opt), emit=session.monitor.alert)
    rewinds.after_step(step)                       # every step end: a snapshot after every ``every``-th step
    snapshot = rewinds.go_back(alert_step, step)   # the rewind action: the state of the newest snapshot before it
    while rewinds.passing:                         # the front door passes over the next ``skip`` batches
        rewinds.passed(epoch=1, index=93, ids=None)

A snapshot after step S holds what step S's update left: the weights and the optimizer's whole state (its
moments, its ``global_step``, its learning rate and mindwatch's lr scale), copied to numpy arrays. Going back
assigns them into the same Parameters (``ops.assign``: a compiled graph keeps its buffers), so the state is the
snapshot's bit for bit, and the learning-rate schedule follows the restored ``global_step``. Every rank takes its
snapshots at the same steps (they number steps alike) and rewinds at the step the signal gave them all, so every
rank goes back to the same snapshot. Training thread only.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import ops

from mindwatch.alerts.alert import Alert
from mindwatch.alerts.registry import configured_actions
from mindwatch.analysis.rewinds import batch_span
from mindwatch.config import MonitorConfig, RewindSettings

log = logging.getLogger("mindwatch")

#: Batch names an intervention alert lists; more are counted in ``skipped_batches`` only.
NAMED_BATCHES = 200


def snapshots_wanted(config: MonitorConfig) -> bool:
    """Whether this run takes snapshots: a ``rewind`` section is given, or some rule's actions list ``rewind``."""
    return "rewind" in config.model_fields_set or "rewind" in configured_actions(config)


@dataclass(frozen=True)
class Snapshot:
    """The state after step ``step``: ``{parameter name: array}``."""

    step: int
    arrays: dict[str, np.ndarray]


class Snapshots:
    """The newest ``keep`` copies of ``state`` (``{name: Parameter}``) in host memory.

    Example::

        snapshots = Snapshots(network_and_optimizer(net, opt), keep=2)
        snapshots.take(100)                                  # after step 100
        snapshots.restore(snapshots.newest_before(130))      # the state after step 100, bit for bit
    """

    def __init__(self, state: dict[str, ms.Parameter], keep: int) -> None:
        self.state = state
        self.keep = keep
        self.held: list[Snapshot] = []
        #: Bytes one snapshot takes.
        self.nbytes = sum(math.prod(p.shape) * p.itemsize for p in state.values())

    def take(self, step: int) -> None:
        """Copy the state after ``step``; beyond ``keep`` copies, into the oldest one's arrays (no new memory: a copy
        into memory already mapped is several times faster than into new arrays, ~6 ms for 96 MiB on CPU)."""
        reused = self.held.pop(0).arrays if len(self.held) >= self.keep else None
        arrays = reused if reused is not None else {}
        for name, p in self.state.items():
            value = p.asnumpy()
            if reused is not None:
                np.copyto(arrays[name], value)
            else:
                arrays[name] = np.array(value, copy=True)
        self.held.append(Snapshot(step, arrays))

    def newest_before(self, step: int) -> Snapshot | None:
        """The newest snapshot taken after a step before ``step`` (None: none is that old)."""
        return next((s for s in reversed(self.held) if s.step < step), None)

    def restore(self, snapshot: Snapshot) -> None:
        """Put ``snapshot``'s values back into the Parameters, bit for bit; later snapshots (their steps will run
        again) are dropped."""
        for name, p in self.state.items():
            ops.assign(p, ms.Tensor(snapshot.arrays[name]))
        self.held = [s for s in self.held if s.step <= snapshot.step]


class Rewinds:
    """A run's snapshots and its rewinds: when to take one, where a rewind goes, the batches passed over after it.

    Example::

        rewinds = Rewinds(RewindSettings(every=100, skip=50), state, emit=session.monitor.alert)
        rewinds.after_step(200)              # a snapshot after step 200
        rewinds.go_back(alert_step=230, step=233).step   # 200; rewinds.passing == 50

    ``emit``: how the intervention alert of a rewind goes out, once the batches after it have passed (their names are
    in it). ``pass_over``: how the front door passes over a batch: the train cell's switch that makes a step pass over
    its batch without an update (``Model.train``), True where the front door passes over batches itself (a loop's
    ``run.batches``), False where it cannot (a rewind then restores the state and passes over none).
    """

    def __init__(
        self,
        settings: RewindSettings,
        state: dict[str, ms.Parameter],
        emit: Callable[[Alert], None],
        *,
        pass_over: Callable[[bool], None] | bool = True,
    ) -> None:
        self.settings = settings
        self.snapshots = Snapshots(state, settings.keep)
        self.emit = emit
        self.gate: Callable[[bool], None] | None = None if isinstance(pass_over, bool) else pass_over
        #: Batches passed over after a rewind: ``skip``, or 0 where the front door cannot pass over any.
        self.skip = settings.skip if pass_over is not False else 0
        #: Rewinds done in this run.
        self.count = 0
        #: Batches still to pass over after the last rewind.
        self.passing = 0
        self._every = settings.every
        self._covered: tuple[int, int] | None = None  # (to_step, at_step) of the last rewind
        self._alert: Alert | None = None  # the last rewind's intervention alert, until its batches have passed
        self._batches: list[dict[str, Any]] = []
        self._passed = 0
        self._rewound_now = False  # a rewind at this very boundary: its step is not the run's step any more
        #: Why the run takes no snapshots any more (None: it does).
        self.broken: str | None = None

    def memory(self) -> dict[str, Any]:
        """What the snapshots take, for ``meta.json``."""
        s, one = self.settings, self.snapshots.nbytes
        return {"every": s.every, "keep": s.keep, "snapshot_bytes": one, "bytes": one * s.keep}

    def after_step(self, step: int) -> None:
        """At the end of global step ``step``: a snapshot when it is due (never while passing over batches). A snapshot
        that fails is a warning, and the run takes no more (the training goes on; a rewind then fails, saying why)."""
        if self._rewound_now:
            self._rewound_now = False
            return
        if step % self._every or self.passing or self.broken is not None:
            return
        held = self.snapshots.held
        if held and held[-1].step >= step:  # the snapshot a rewind went back to, after the batches it passed over
            return
        try:
            self.snapshots.take(step)
        except Exception as e:
            self.broken = f"the snapshot after step {step} failed ({e!r})"
            self.snapshots.held = []
            log.warning("mindwatch: %s; this run takes no more snapshots and cannot rewind; training continues", self.broken)

    def covers(self, alert_step: int, step: int) -> bool:
        """Whether the last rewind already went back past an anomaly at ``alert_step``, asked at the boundary of ``step``:
        a step it abandoned that the run has not reached again (the alert came from the abandoned branch: one rewind
        for one bad stretch)."""
        covered = self._covered
        if covered is None:
            return False
        now = covered[0] if self._rewound_now else step  # a second request at the very boundary a rewind went back at
        return covered[0] < alert_step <= covered[1] and alert_step > now

    @property
    def exhausted(self) -> bool:
        """``max`` rewinds were done: a further request does ``then``."""
        return self.count >= self.settings.max

    def go_back(self, alert_step: int, step: int) -> Snapshot:
        """At the boundary after step ``step``: restore the newest snapshot before ``alert_step``; the next ``skip``
        batches are to be passed over. Raises ``RuntimeError`` when no snapshot is that old."""
        if self.broken is not None:
            raise RuntimeError(f"no snapshot to rewind to: {self.broken}")
        snapshot = self.snapshots.newest_before(alert_step)
        if snapshot is None:
            taken = ", ".join(str(s.step) for s in self.snapshots.held) or "none yet"
            raise RuntimeError(
                f"no snapshot before step {alert_step} to rewind to (snapshots after steps: {taken}; one every "
                f"{self._every} steps: a smaller rewind.every reaches earlier steps)"
            )
        self.flush()  # an earlier rewind's batches, if the new one came while they passed
        self.snapshots.restore(snapshot)
        self.count += 1
        self._covered = (snapshot.step, step)
        self._rewound_now = True
        self.passing = self.skip
        if self.passing and self.gate is not None:
            self.gate(True)
        return snapshot

    def hold(self, alert: Alert) -> None:
        """The rewind's intervention alert: out once its batches have passed (now, when it passes over none)."""
        self._alert, self._batches, self._passed = alert, [], 0
        if not self.passing:
            self.flush()

    def passed(self, epoch: int | None, index: int | None, ids: list[Any] | None = None) -> None:
        """A batch was passed over (its epoch, its index in the epoch, its sample ids where known)."""
        if len(self._batches) < NAMED_BATCHES:
            name: dict[str, Any] = {"epoch": epoch, "index": index}
            if ids is not None:
                name["sample_ids"] = ids
            self._batches.append(name)
        self._passed += 1
        self.passing -= 1
        if not self.passing:
            if self.gate is not None:
                self.gate(False)
            self.flush()

    def flush(self) -> None:
        """Send the held intervention alert with the batches passed over so far (the training may end before all)."""
        alert = self._alert
        if alert is None:
            return
        self._alert = None
        alert["skipped_batches"] = self._passed
        alert["batches"] = self._batches
        if self._batches:
            alert["message"] += f"; passed over {alert['skipped_batches']} batches ({batch_span(self._batches)})"
        self.emit(alert)
