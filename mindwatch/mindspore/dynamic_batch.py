"""A batch size that changes during training: :class:`DynamicBatch`, and the actions that change it.

Example::

    import mindwatch.mindspore as mw

    batch = mw.DynamicBatch(32, min=8, max=128)
    dataset = dataset.batch(batch_size=batch, drop_remainder=True)      # MindSpore asks it for every batch's size
    monitor = mw.MonitorCallback({"alerts": {"memory": {"actions": ["shrink_batch"]}}}, batch=batch)
    model.train(epochs, dataset, callbacks=[monitor], dataset_sink_mode=False)

The pipeline runs ahead of the training (``ds.config.get_prefetch_size()`` batches and more), so a new size
cannot reach the network at once: a change takes effect at the first batch the pipeline has not made yet, a step
known in advance (``from_step``). :class:`DynamicBatch` counts the batches it made (``BatchInfo``: a pipeline run that
starts again from batch 0, such as the one ``Model.train`` runs to count the dataset's batches, is a new pipeline, and
its batches are not counted as trained) and the front door tells it which step took a batch (:meth:`DynamicBatch.took`).

:class:`BatchChanges` carries out ``shrink_batch``, ``grow_batch`` (``dynamic_batch.factor``) and a person's
``resize_batch``. In one process the change is set at once; across ranks it is agreed through the step's collective
(:mod:`mindwatch.mindspore.rank_signal`): every rank reads the request after the same step, holds its pipeline back at
its first batch not made yet, and sends that step with the next step; every rank then switches at the largest of
them, and lets its pipeline go on. Requests made before a change lands fold into it. The pipeline's thread calls
:class:`DynamicBatch`; everything else runs on the training thread.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import nn

from mindwatch.config import DynamicBatchSection

log = logging.getLogger("mindwatch")

#: How long a pipeline waits, at most, for the ranks to agree on a change (the training ended, a rank died): then it
#: goes on with the size it has.
HOLD_TIMEOUT_SECS = 120.0


class DynamicBatch:
    """The batch size of a dataset, changed during training by mindwatch's ``shrink_batch`` / ``grow_batch`` actions.

    Example::

        batch = mw.DynamicBatch(32, min=8, max=128)
        dataset = dataset.batch(batch_size=batch)
        model.train(1, dataset, callbacks=[mw.MonitorCallback(config, batch=batch)], dataset_sink_mode=False)

    ``initial``: the size it starts with; ``min``, ``max``: the bounds no change goes past (default: ``initial``
    alone, so set at least one). Pass the same object to the dataset's ``batch`` and to the front door
    (``MonitorCallback(..., batch=batch)`` or ``start_run(..., batch=batch)``). Train with ``dataset_sink_mode=False``.
    """

    def __init__(self, initial: int, *, min: int | None = None, max: int | None = None) -> None:  # noqa: A002
        low = initial if min is None else min
        high = initial if max is None else max
        for name, value in (("initial", initial), ("min", low), ("max", high)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"DynamicBatch {name} must be a whole number >= 1, not {value!r}")
        if not low <= initial <= high:
            raise ValueError(f"DynamicBatch needs min <= initial <= max, got min={low}, initial={initial}, max={high}")
        self.initial, self.min, self.max = initial, low, high
        self._lock = threading.Condition()
        #: ``(from_step, size)``, oldest first: the size of the batch a step takes is the last entry at or before it.
        self._sizes: list[tuple[int, int]] = [(0, initial)]
        #: The step that takes the current pipeline's first batch (guessed when it starts, known at its first step).
        self._base = 1
        #: Batches the current pipeline made.
        self._made = 0
        #: ``(epoch, batch)`` of the last batch the current pipeline asked for (one that starts again asks for less).
        self._last: tuple[int, int] | None = None
        self._rebase = True
        #: The thread of the current pipeline (each pipeline run has its own), and one that asked once: a new pipeline,
        #: or a getter's one look (``output_shapes()``), which must not count. It is the current one from its second.
        self._live: int | None = None
        self._candidate: int | None = None
        #: The step the candidate's first batch went to (guessed: the next one).
        self._candidate_step = 0
        #: The first step that took a batch since the candidate asked (its first batch, when it is the new pipeline).
        self._first_took: int | None = None
        #: The last step that took a batch.
        self.last_step = 0
        #: No batch for this step or later is made while set (a change is being agreed).
        self._hold: int | None = None

    def __repr__(self) -> str:
        return f"DynamicBatch({self.size}, min={self.min}, max={self.max})"

    @property
    def size(self) -> int:
        """The newest size set (the size of the batches from the last change's ``from_step`` on)."""
        return self._sizes[-1][1]

    def size_at(self, step: int) -> int:
        """The size of the batch step ``step`` takes."""
        sizes = self._sizes
        for from_step, size in reversed(sizes):
            if from_step <= step:
                return size
        return sizes[0][1]

    def __call__(self, info: Any) -> int:
        """MindSpore's ``batch(batch_size=...)`` asks for the size of the next batch (the pipeline's thread)."""
        try:
            return self._next_size(info)
        except Exception as e:  # never break the pipeline: the newest size
            log.warning("mindwatch: DynamicBatch could not count this batch (%r); it has the newest size", e)
            return self.size

    def _next_size(self, info: Any) -> int:
        key = (int(info.get_epoch_num()), int(info.get_batch_num()))
        thread = threading.get_ident()
        with self._lock:
            if thread != self._live:
                if thread != self._candidate:  # counted from its second batch on, if it asks again
                    self._candidate, self._first_took = thread, None
                    self._wait_if_held(lambda: self.last_step + 1)
                    self._candidate_step = self.last_step + 1
                    return self.size_at(self._candidate_step)
                self._live, self._candidate, first = thread, None, self._first_took
                self._base, self._made, self._rebase = (first, 1, False) if first else (self.last_step + 1, 1, True)
            elif self._last is not None and key <= self._last:  # this thread runs a new pipeline
                self._base, self._made, self._rebase = self.last_step + 1, 0, True
            self._last = key
            self._wait_if_held(lambda: self._base + self._made)
            step = self._base + self._made
            self._made += 1
            return self.size_at(step)

    def _wait_if_held(self, step: Callable[[], int]) -> None:
        """Wait (the lock released) while a change being agreed holds back the batch of ``step()``."""
        held = lambda: self._hold is not None and step() >= self._hold  # noqa: E731
        if held() and not self._lock.wait_for(lambda: not held(), timeout=HOLD_TIMEOUT_SECS):
            log.warning("mindwatch: the ranks did not agree a batch size change in time; the batch size stays")
            self._hold = None

    def took(self, step: int) -> int:
        """The front door: step ``step`` took its batch (the next one the pipeline made); returns that batch's size."""
        with self._lock:
            new_training = step <= self.last_step
            if new_training:  # a new training counts from 1 again: the newest size from its first step
                self._sizes = [(0, self._sizes[-1][1])]
            if self._candidate is not None and self._first_took is None and (self._rebase or new_training):
                # the live pipeline never fed a step (a pass that counted the dataset) or fed another training: the
                # candidate made this batch, its first. Counted from now on, before it asks again (on a busy machine a
                # change asked at step 1 came before that, and the counting pass's 300 batches were taken as made).
                self._live, self._candidate, self._last = self._candidate, None, None
                self._base, self._made, self._rebase = step, 1, False
            elif self._candidate is not None and self._first_took is None:
                self._first_took = step
            if self._rebase:  # the first step of a new pipeline: now its numbering is known
                self._base, self._rebase = step, False
            self.last_step = step
            return self.size_at(step)

    def next_unmade(self) -> int:
        """The first step whose batch the pipeline has not made yet."""
        with self._lock:
            return self._unmade()

    def _unmade(self) -> int:
        unmade = self._base + self._made
        return unmade if self._candidate is None else max(unmade, self._candidate_step + 1)

    def hold(self, not_before: int) -> int:
        """Hold the pipeline back at its first batch not made yet (no earlier than step ``not_before``'s) until
        :meth:`switch` or :meth:`release`; returns that step."""
        with self._lock:
            self._hold = max(self._unmade(), not_before)
            return self._hold

    def switch(self, from_step: int, size: int) -> None:
        """Batches from step ``from_step`` on have ``size`` samples; the pipeline goes on."""
        with self._lock:
            kept = [entry for entry in self._sizes if entry[0] < from_step]
            # the entries before the one the last step took its batch by matter no more
            newest = max((i for i, entry in enumerate(kept) if entry[0] <= self.last_step), default=0)
            self._sizes = [*kept[newest:], (from_step, size)]
            self._hold = None
            self._lock.notify_all()

    def release(self) -> None:
        """Let a held pipeline go on with the size it has (the change was not agreed)."""
        with self._lock:
            self._hold = None
            self._lock.notify_all()

    def change(self, size: int, not_before: int) -> int:
        """In one process: batches from the first one not made yet (no earlier than step ``not_before``'s) on have
        ``size`` samples; returns that step."""
        with self._lock:
            from_step = max(self._unmade(), not_before)
            self.switch(from_step, size)  # the Condition's lock is reentrant
            return from_step

    def meta(self) -> dict[str, int]:
        """For meta.json (``mindwatch batch`` checks a size against the bounds)."""
        return {"initial": self.initial, "min": self.min, "max": self.max}


def warn_unagreed(batch: DynamicBatch | None, world_size: int, agreed: bool) -> None:
    """A multi-rank training whose changes cannot be agreed through the step's collective: say so, once at start."""
    if batch is not None and world_size > 1 and not agreed:
        log.warning(
            "mindwatch: a DynamicBatch in a %d-rank training without mindwatch's signal: each rank changes its batch "
            "size on its own, maybe at different steps. Train with TrainOneStepWithGradNorm (Model.train) or pass "
            "grad_reducer=mw.DistributedGradReducer(...) to start_run so that every rank switches at one step",
            world_size,
        )


def batch_axis_dynamic(cell: Any, element: Any) -> bool:
    """Let a GRAPH-mode ``cell`` take any batch size with one compilation: the first axis of its inputs, shaped as
    ``element`` (the step's inputs), is dynamic (``cell.set_inputs``). Before its first step; True if it did.

    A cell whose inputs are set already (``set_inputs`` of your own) is left as it is.
    """
    if ms.get_context("mode") != ms.GRAPH_MODE or not isinstance(cell, nn.Cell) or cell.get_inputs() is not None:
        return False
    tensors = tuple(element) if isinstance(element, (tuple, list)) else (element,)
    if not tensors or not all(isinstance(t, ms.Tensor) and t.ndim >= 1 for t in tensors):
        return False
    try:
        cell.set_inputs(*(ms.Tensor(shape=[None, *t.shape[1:]], dtype=t.dtype) for t in tensors))
    except Exception as e:  # the training goes on: each new size compiles once
        log.warning("mindwatch: could not make the train cell's batch axis dynamic (%r); each batch size compiles", e)
        return False
    return True


@dataclass
class _Asked:
    """A change asked for, while the ranks agree on its step."""

    action: str
    alert: dict[str, Any]
    before: int
    #: The size asked for (0: this rank does not know it: a person's request whose alert did not reach it).
    after: int
    step: int


#: What reports a change done: ``(action, alert, step, fields)`` (``Interventions.report``).
Report = Callable[[str, dict[str, Any], int, dict[str, Any]], None]


class BatchChanges:
    """What ``shrink_batch``, ``grow_batch`` and ``resize_batch`` do to a :class:`DynamicBatch`. See the module docstring.

    ``settings``: ``dynamic_batch`` (the factor; ``scale_lr``: the learning rate follows, through a ``batch_lr``
    action filed for the boundary before ``from_step``); ``report`` records a change once its step is known (the
    intervention alert); ``schedule`` files an action for a later step boundary (``Control.schedule``);
    ``collective``: the ranks agree each change's step through the step's signal; ``rewound``: the batches consumed
    beyond the global step so far (a rewind's steps numbered again, its batches passed over).
    """

    def __init__(
        self,
        batch: DynamicBatch,
        settings: DynamicBatchSection,
        *,
        report: Report,
        schedule: Callable[[str, dict[str, Any], int], None],
        collective: bool = False,
        rewound: Callable[[], int] = lambda: 0,
    ) -> None:
        self.batch = batch
        self.factor = settings.factor
        self.scale_lr = settings.scale_lr
        self.report = report
        self.schedule = schedule
        #: Changes are agreed with the other ranks through the step's collective (``SignalExchange.batch``).
        self.collective = collective
        #: A change asked for whose step the ranks are agreeing; whether this rank's side went out.
        self._asked: _Asked | None = None
        self.sent = False
        #: ``(from_step, size)`` of the last change, until that step took its batch.
        self._landing: tuple[int, int] | None = None
        #: The batches consumed beyond the global step (a rewind's steps numbered again, its batches passed over): a
        #: step's batch is number ``step + rewound()`` of the DynamicBatch's count, which never goes back.
        self.rewound = rewound

    @property
    def agreeing(self) -> bool:
        """A change waits for this rank's side to go out with the next step."""
        return self._asked is not None and not self.sent

    def ask(self, action: str, alert: dict[str, Any], step: int) -> dict[str, Any] | None:
        """``action`` at the boundary after step ``step`` (every rank alike): the intervention's fields, or None when it
        is recorded later (once the ranks agreed its step) or folds into a change not landed yet."""
        batch = self.batch
        landing = self._landing
        shift = self.rewound()
        if landing is not None and batch.last_step >= landing[0]:
            self._landing = landing = None
        if self._asked is not None or landing is not None:  # fold: one change, not one per request
            to, at = (self._asked.after, None) if self._asked is not None else (landing[1], landing[0] - shift)  # type: ignore[index]
            when = f" from step {at}" if at is not None else ""
            log.info("mindwatch: %s at step %d folds into the batch size change to %s%s", action, step, to, when)
            if not alert.get("request"):
                return None
            return {"message": f"batch size already changes to {to}{when}: this request folds into that change"}
        before = batch.size
        after = self._size_asked(action, alert, before)
        if after == before and after:
            bound = "its minimum" if action == "shrink_batch" else "its maximum" if action == "grow_batch" else "asked"
            return {"message": f"batch size stays {before} ({bound})", "batch_size_before": before, "batch_size_after": before}
        asked = _Asked(action, alert, before, after, step)
        if self.collective:
            self._asked = asked
            return None
        return self._changed(asked, batch.change(after, not_before=step + shift + 1), step)

    def send(self, signal: Any, carried_by: int) -> None:
        """Before the step ``carried_by`` (whose sum carries it): hold the pipeline at its first batch not made yet and
        send that step and the size asked for."""
        asked = self._asked
        assert asked is not None
        signal.batch_change(self.batch.hold(not_before=carried_by + self.rewound() + 1), asked.after)
        self.sent = True

    def agree(self, rows: np.ndarray, step: int) -> None:
        """After the step that carried every rank's side: switch at the latest of their steps, the size they asked."""
        asked, self._asked, self.sent = self._asked, None, False
        steps, sizes = rows[:, 0], rows[:, 1]
        if asked is None or not (steps > 0).any() or not (sizes > 0).any():
            self.batch.release()
            log.warning("mindwatch: the ranks sent no batch size change; the batch size stays")
            return
        asked.after = int(sizes[sizes > 0].max())
        from_batch = int(steps.max())
        self.batch.switch(from_batch, asked.after)
        done = self._changed(asked, from_batch, step)
        # each rank's first step whose batch it had not made (0: none sent)
        done["first_unmade"] = [int(s) - self.rewound() if s > 0 else 0 for s in steps]
        self.report(asked.action, asked.alert, asked.step, done)  # at the boundary every rank read the request at

    def close(self) -> None:
        """The training ends: a held pipeline goes on."""
        self._asked, self.sent = None, False
        self.batch.release()

    def _size_asked(self, action: str, alert: dict[str, Any], before: int) -> int:
        batch = self.batch
        if action == "resize_batch":
            size = alert.get("batch_size")
            if size is None and self.collective:
                return 0  # another rank's person's request whose alert did not reach this rank: the others know it
            if not isinstance(size, int) or not batch.min <= size <= batch.max:
                bounds = f"its DynamicBatch takes {batch.min} to {batch.max}"
                raise ValueError(f"batch size {size!r} is out of this run's bounds: {bounds}")
            return size
        factor = self.factor if action == "shrink_batch" else 1.0 / self.factor
        return min(batch.max, max(batch.min, round(before * factor)))

    def _changed(self, asked: _Asked, from_batch: int, step: int) -> dict[str, Any]:
        """The intervention's fields of a change set from batch number ``from_batch``; the learning rate follows it."""
        self._landing = (from_batch, asked.after)
        from_step = from_batch - self.rewound()
        done: dict[str, Any] = {
            "message": f"batch size {asked.before} -> {asked.after} from step {from_step}",
            "batch_size_before": asked.before,
            "batch_size_after": asked.after,
            "from_step": from_step,
        }
        lr = self._lr_factor(asked.before, asked.after)
        if lr is not None:
            done["lr_factor"] = lr
            done["message"] += f"; learning rate x {lr:.4g} from that step (dynamic_batch.scale_lr: {self.scale_lr})"
            self.schedule(
                "batch_lr",
                {"rule": "dynamic_batch", "step": step, "lr_factor": lr, "from_step": from_step, "message": done["message"]},
                from_step - 1,
            )
        return done

    def _lr_factor(self, before: int, after: int) -> float | None:
        if self.scale_lr == "linear":
            return after / before
        if self.scale_lr == "sqrt":
            return math.sqrt(after / before)
        return None
