"""Across ranks through the training's own collective: a small vector every rank's step sums.

Example::

    signal = RankSignal(train_net.mindwatch_signal, rank=1, world_size=2)
    signal.ask("stop", alert)                       # before a step: this rank asks for an action
    for asked in signal.read(outputs[i].asnumpy()):  # after it: what every rank asked, the same on every rank
        ...                                         # act on this very step: every rank read the same vector
    signal.announced(vector)                        # what rank 0 announced: run id, lifeline, attempt, resumed step

Each rank owns :data:`SLOTS` slots of the vector (``rank * SLOTS ...``): the actions it asks for (one bit
each), the step of the alert that asked, its step and data time of the step before (what rank 0's
straggler rule and bands need, :meth:`SignalExchange.timed`), and its ``local_grad_norm`` of this very step: the
norm of its own gradients before the all-reduce, which the train cell (or ``DistributedGradReducer``) adds into the
vector inside the step (:func:`with_local_norm`), so every rank reads every rank's after the step (the source of a
shared anomaly, :mod:`mindwatch.alerts.source_rank`). Rank 0 also writes an :class:`Announcement`
into the last :data:`TOKEN_SLOTS` slots (one character code each): the run id, its lifeline's address, the
attempt number and the step the run resumes after. The other ranks learn from it which directory the run is
in, which attempt they belong to and how to number their steps, after the first step, without a shared file
system and without waiting at start: every rank numbers the steps alike, whatever its own folder holds. Every rank's
train cell sums the vector with an ``AllReduce`` inside its step (the slots do not overlap, so the sum is
a gather), so every rank reads the same requests after the same step and acts on it: no margin, no
polling. The vector is written with ``ops.assign`` between steps (~25 us on CPU), only when it changes: with
the timings, every step.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import mindspore as ms
import numpy as np
from mindspore import ops

from mindwatch import metrics as vocab
from mindwatch.mindspore.layer_stats import squares
from mindwatch.mindspore.router_stats import router_stats_cells
from mindwatch.monitor.control import ACTIONS

if TYPE_CHECKING:
    from mindwatch.mindspore.dynamic_batch import BatchChanges

log = logging.getLogger("mindwatch")

#: Where a rank's timings are among its slots: the straggler metrics (``step_time``, ``data_time``), in the
#: vocabulary's order (``metrics.STRAGGLER_METRICS``), in seconds; 0: not sent.
TIMING = slice(2, 2 + len(vocab.STRAGGLER_METRICS))
_STEP_SLOT = 2 + vocab.STRAGGLER_METRICS.index(vocab.STEP_TIME)
_DATA_SLOT = 2 + vocab.STRAGGLER_METRICS.index(vocab.DATA_TIME)
#: A batch size change being agreed (``dynamic_batch.py``): the first step whose batch this rank has not made yet
#: (its pipeline holds it back until the change is agreed) and the size it changes to; 0: none sent.
BATCH_CHANGE = slice(TIMING.stop, TIMING.stop + 2)
#: Where a rank's ``local_grad_norm`` is among its slots (written inside the step, never by :class:`RankSignal`).
LOCAL_NORM_SLOT = BATCH_CHANGE.stop
#: What a NaN/Inf local norm is sent as (a norm is never negative): NaN x 0 would spread to every slot of the vector.
NONFINITE_NORM = -1.0
#: Slots per rank: the bits of the actions asked, the step of the alert that asked, the step and data time sent,
#: a batch size change, and the rank's local gradient norm of the step.
SLOTS = LOCAL_NORM_SLOT + 1
#: Slots for rank 0's :class:`Announcement` (``run_id\nhost:port\nattempt\nresumed_step``), one character code each.
TOKEN_SLOTS = 160
#: How long a rank waits, when another rank's request arrives in the vector, for the alert behind it on the lifeline
#: (it left a step earlier, with the request: it is there unless the lifeline is down).
ALERT_WAIT_SECS = 0.5
#: The bit of each action (float32 holds these sums exactly).
ACTION_BITS = {action: 1 << i for i, action in enumerate(ACTIONS)}


def signal_size(world_size: int) -> int:
    """The length of the vector for ``world_size`` ranks."""
    return world_size * SLOTS + TOKEN_SLOTS


def local_norm_slot(rank: int, world_size: int) -> ms.Tensor:
    """A vector of :func:`signal_size` zeros with 1 at ``rank``'s local-norm slot: the step adds ``norm * it``."""
    onehot = np.zeros(signal_size(world_size), np.float32)
    onehot[rank * SLOTS + LOCAL_NORM_SLOT] = 1.0
    return ms.Tensor(onehot)


def with_local_norm(signal: ms.Tensor, grads: tuple, onehot: ms.Tensor) -> ms.Tensor:
    """Inside the step: ``signal`` with this rank's norm of ``grads`` (before the all-reduce) in its slot (a NaN/Inf
    norm as :data:`NONFINITE_NORM`)."""
    norm = ops.sqrt(ops.reduce_sum(squares(grads)))
    norm = ops.select(ops.isfinite(norm), norm, ops.ones_like(norm) * NONFINITE_NORM)
    return signal + norm * onehot


def sum_signal(all_reduce: Any, vector: ms.Tensor, routing: Any = None, routing_sum: Any = None) -> ms.Tensor:
    """Inside the step: ``vector`` summed over the ranks by ``all_reduce``. With ``routing`` (the ``RouterStats``' value
    Parameters, :mod:`mindwatch.mindspore.router_stats`) their vectors ride on the same ``AllReduce``, read after this
    step's forward, and their sum goes into the Parameter ``routing_sum``: every rank records the whole batch's routing
    with no collective of its own."""
    if routing is None:
        return all_reduce(vector)
    size = vector.shape[0]
    summed = all_reduce(ops.concat([vector] + [ops.depend(v, vector) for v in routing]))
    return ops.depend(summed[:size], ops.assign(routing_sum, summed[size:]))


def routing_parameters(network: Any) -> tuple[Any, Any]:
    """``(a ParameterTuple of network's RouterStats vectors, a Parameter for their sum over the ranks)``, or
    ``(None, None)`` when it holds no ``RouterStats``: what a cell that sums the signal adds for :func:`sum_signal`."""
    cells = router_stats_cells(network) if network is not None else []
    if not cells:
        return None, None
    size = sum(int(cell.values.shape[0]) for _, cell in cells)
    total = ms.Parameter(ms.Tensor(np.zeros(size, np.float32)), name="mindwatch_routing_sum", requires_grad=False)
    return ms.ParameterTuple([cell.values for _, cell in cells]), total


@dataclass(frozen=True)
class Announcement:
    """What rank 0 tells every rank in the signal: the run, its lifeline, this attempt, and the step it resumes after.

    Example::

        Announcement("gpt_0601", "10.0.0.1:41873", attempt=2, resumed_step=150)
    """

    run_id: str | None = None
    #: ``host:port`` of rank 0's lifeline (:mod:`mindwatch.alerts.lifeline`).
    lifeline: str | None = None
    #: This attempt's number (``meta.json``'s ``attempts``): what liveness tells attempts apart by.
    attempt: int | None = None
    #: The last step of the run's earlier attempts: every rank counts this attempt's steps on from it.
    resumed_step: int = 0

    def text(self) -> str:
        return "\n".join((self.run_id or "", self.lifeline or "", str(self.attempt or ""), str(self.resumed_step)))

    @classmethod
    def parse(cls, text: str) -> Announcement:
        parts = [*text.split("\n"), "", "", "", ""][:4]
        number = lambda s: int(s) if s.isdigit() else None  # noqa: E731
        return cls(parts[0] or None, parts[1] or None, number(parts[2]), number(parts[3]) or 0)


@dataclass(frozen=True)
class Asked:
    """An action one rank asked for, as every rank reads it after the same step."""

    rank: int
    action: str
    #: The step of the alert that asked (to find it in alerts.jsonl).
    alert_step: int


class RankSignal:
    """This rank's slots of the signal vector, and what a reduced vector says. Training thread only."""

    def __init__(self, parameter: ms.Parameter | None, *, rank: int, world_size: int) -> None:
        #: The train cell's Parameter the step sums (None: a loop, which sums :meth:`tensor` with one call).
        self.parameter = parameter
        self.rank, self.world_size = rank, world_size
        self._vector = np.zeros(signal_size(world_size), np.float32)
        self._own = slice(rank * SLOTS, (rank + 1) * SLOTS)
        #: The alerts behind this rank's bits, until every rank has read them.
        self.asking: dict[str, dict[str, Any]] = {}
        self._dirty = False

    def announce(self, announcement: Announcement | None) -> None:
        """Rank 0: put ``announcement`` into the vector (None: clear it); the other ranks read it after the next sum."""
        text = announcement.text() if announcement is not None else ""
        if len(text) > TOKEN_SLOTS and announcement is not None:  # the numbers still go: every rank numbers steps alike
            log.warning("mindwatch: run id %r is too long to announce to the other ranks; they record apart", announcement.run_id)
            text = Announcement(None, None, announcement.attempt, announcement.resumed_step).text()
        codes = [ord(c) for c in text]
        token = self._vector[-TOKEN_SLOTS:]
        token[:] = 0
        token[: len(codes)] = codes
        self._dirty = True

    def ask(self, action: str, alert: dict[str, Any]) -> None:
        """Ask every rank for ``action`` (sent with the next step)."""
        if action not in ACTION_BITS:
            return
        self.asking[action] = alert
        own = self._vector[self._own]
        step = alert.get("step")
        own[0] = int(own[0]) | ACTION_BITS[action]
        own[1] = float(step) if isinstance(step, int) else 0.0
        self._dirty = True

    def time(self, step_secs: float, data_secs: float) -> None:
        """This rank's step and data time, sent with the next step (every rank reads every rank's)."""
        own = self._vector[self._own]
        own[_STEP_SLOT], own[_DATA_SLOT] = step_secs, data_secs
        self._dirty = True

    def batch_change(self, from_step: int, size: int) -> None:
        """This rank's side of a batch size change being agreed (sent with the next step): the first step whose batch
        its pipeline has not made, and the size it understood (0: it does not know it)."""
        own = self._vector[self._own]
        own[BATCH_CHANGE] = (from_step, size)
        self._dirty = True

    def batch_changes(self, reduced: np.ndarray) -> np.ndarray:
        """After a step: every rank's ``(from_step, size)`` of a batch size change, one row a rank (0: none sent); this
        rank's own are cleared (they were read)."""
        rows = np.asarray(reduced[: self.world_size * SLOTS], np.float64).reshape(self.world_size, SLOTS)[:, BATCH_CHANGE]
        own = self._vector[self._own]
        if own[BATCH_CHANGE].any():
            own[BATCH_CHANGE] = 0.0
            self._dirty = True
        return np.rint(rows).astype(np.int64)

    def send(self) -> None:
        """Before a step: write the vector if it changed (one small assign)."""
        if self._dirty and self.parameter is not None:
            ops.assign(self.parameter, ms.Tensor(self._vector))
            self._dirty = False

    def tensor(self) -> ms.Tensor:
        """The vector as a Tensor (a loop sums it itself)."""
        return ms.Tensor(self._vector)

    def read(self, reduced: np.ndarray) -> list[Asked]:
        """After a step: every rank's requests in the summed vector; this rank's own are cleared (they were read)."""
        asked: list[Asked] = []
        slots = np.asarray(reduced[: self.world_size * SLOTS]).reshape(self.world_size, SLOTS)
        for rank in np.flatnonzero(slots[:, 0]):
            bits, step = int(round(float(slots[rank, 0]))), int(round(float(slots[rank, 1])))
            asked.extend(Asked(int(rank), action, step) for action, bit in ACTION_BITS.items() if bits & bit)
        own = self._vector[self._own]
        if own[0]:
            own[:2] = 0.0
            self._dirty = True
        return asked

    def timings(self, reduced: np.ndarray) -> np.ndarray:
        """Every rank's straggler metrics (``metrics.STRAGGLER_METRICS``, in order) in the summed vector, one row a rank
        (0: that rank sent none)."""
        return np.asarray(reduced[: self.world_size * SLOTS], np.float64).reshape(self.world_size, SLOTS)[:, TIMING]

    def local_norms(self, reduced: np.ndarray) -> np.ndarray:
        """Every rank's ``local_grad_norm`` of the step in the summed vector, one a rank (0: that rank's step sent none;
        NaN: it was NaN or Inf)."""
        slots = np.asarray(reduced[: self.world_size * SLOTS], np.float64).reshape(self.world_size, SLOTS)
        norms = slots[:, LOCAL_NORM_SLOT].copy()
        norms[norms < 0] = np.nan
        return norms

    @staticmethod
    def announced(reduced: np.ndarray) -> Announcement:
        """What rank 0 announced in the summed vector (``run_id`` None: rank 0 records nothing, it has no callback)."""
        codes = [int(round(float(c))) for c in reduced[-TOKEN_SLOTS:]]
        return Announcement.parse("".join(chr(c) for c in codes if 0 < c < 0x110000))


def find_alert(alerts_file: Any, asked: Asked) -> dict[str, Any] | None:
    """The alert behind ``asked`` in a shared run directory's ``alerts.jsonl`` (None without a shared file system)."""
    from mindwatch.store.jsonl import decode_line

    try:
        lines = alerts_file.read_bytes().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        alert = decode_line(line)
        if (
            alert is not None
            and alert.get("rank") == asked.rank
            and alert.get("step") == asked.alert_step
            and asked.action in (alert.get("actions") or ())
        ):
            return alert
    return None


class SignalExchange:
    """The Control's side of the signal: this rank's requests go out with the next step, and what every rank asked
    comes back after it, filed on the Control for this very step boundary (the same on every rank)."""

    def __init__(self, signal: RankSignal, session: Any, *, batch: BatchChanges | None = None) -> None:
        """``batch``: a DynamicBatch's changes (``dynamic_batch.BatchChanges``), agreed through this vector."""
        self.signal = signal
        self.session = session
        #: Rank 0: its cross-rank watch, which takes every rank's timings (``CrossRankWatch.from_signal``).
        self.watch = getattr(session, "cross_rank", None) if signal.rank == 0 else None
        #: Every rank: the ranks' local gradient norms of each step, for the source of a shared anomaly (None: no rules).
        self.sources = getattr(session, "source_rank", None)
        #: This rank's ``local_grad_norm`` of the last step summed, to record (None: the step sent none, not our cell
        #: or reducer, or ``metrics`` leaves it out).
        self.local_norm: float | None = None
        self._records_local_norm = vocab.LOCAL_GRAD_NORM in session.config.enabled_metrics
        #: The step whose timings this rank set last, and the one they went out with in the step in flight.
        self._timed_step: int | None = None
        self._sent_step: int | None = None
        #: A DynamicBatch's changes: agreed through this vector; None: none.
        self.batch = batch

    def timed(self, step: int, step_secs: float, data_secs: float) -> None:
        """This rank's step and data time at ``step``: they go out with the next sum (rank 0 hears every rank's)."""
        self.signal.time(step_secs, data_secs)
        self._timed_step = step

    def before_step(self, step: int) -> None:
        """Send what this rank's rules asked for since the last step (a lock only when something waits). ``step``: the
        step whose sum carries the vector (a batch size change is agreed after it, so no batch after it is held back)."""
        control = self.session.control
        if control.outgoing_waiting:
            for action, alert in control.outgoing():
                self.signal.ask(action, alert)
                self.session.share_ask(action, alert)
        if self.batch is not None and self.batch.agreeing:
            self.batch.send(self.signal, carried_by=step)
        self.signal.send()
        self._sent_step = self._timed_step

    def after_step(self, reduced: np.ndarray, step: int) -> None:
        """File the actions every rank asked for in this step's vector, due at this boundary; rank 0 hands every
        rank's timings and local gradient norms to its cross-rank watch."""
        if self.watch is not None and self._sent_step is not None:
            self.watch.from_signal(self._sent_step, self.signal.timings(reduced), joined=step)
            self._sent_step = None
        norms = self.signal.local_norms(reduced)
        own = float(norms[self.signal.rank])
        self.local_norm = own if own != 0.0 and self._records_local_norm else None
        if own != 0.0:
            if self.watch is not None:
                self.watch.local_norms(step, norms)
            if self.sources is not None:
                self.sources.saw(step, norms)
        if self.batch is not None and self.batch.sent:  # before this step's requests: they fold into the change
            self.batch.agree(self.signal.batch_changes(reduced), step)
        for asked in self.signal.read(reduced):
            if asked.rank == self.signal.rank:
                alert = self.signal.asking.pop(asked.action, None)
            else:  # it came over the lifeline with the request (else from a shared alerts.jsonl)
                alert = self.session.asked_alert(asked.rank, asked.alert_step, asked.action, ALERT_WAIT_SECS)
                alert = alert or find_alert(self.session.layout.alerts, asked)
            if alert is None:  # no lifeline, no shared file system: what the vector says
                alert = {
                    "rule": "rank_request",
                    "rank": asked.rank,
                    "step": asked.alert_step,
                    "message": f"rank {asked.rank} asked for {asked.action} (its alert at step {asked.alert_step})",
                }
            info = {"at_step": step, "requested_by": asked.rank, "collective": True}
            self.session.control.schedule(asked.action, {**alert, "coordination": info}, step)


_ALL_REDUCE: Any = None


def sum_over_ranks(vector: ms.Tensor) -> np.ndarray:
    """``vector`` summed over every rank (one ``AllReduce`` outside any step: a loop's signal, an evaluation's agreed
    value); every rank must call it at the same point."""
    global _ALL_REDUCE
    if _ALL_REDUCE is None:
        _ALL_REDUCE = ops.AllReduce()
    return _ALL_REDUCE(vector).asnumpy()
