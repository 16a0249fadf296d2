"""The rank behind an anomaly in a value every rank shares: the one whose own gradient norm stood out on that step.

Example::

    sources = SourceRank(RunLayout(run_dir), rank=0, world_size=8)
    sources.saw(step, norms)       # training thread, after each step: every rank's local_grad_norm, from the signal
    Monitor([sources, AlertLog(writer), ...])   # the first sink: an alert on a shared gradient norm gets
                                                # ``source_rank`` and that rank's epoch, batch and sample_ids

After the gradient all-reduce, ``grad_norm`` and the per-layer norms are the same on every rank, and rank 0 alone
raises an alert on them (``metrics.py``: ``same``). Which rank's batch caused it shows in each rank's own gradient
norm before the all-reduce, ``local_grad_norm``, which every step's signal brings to every rank
(:mod:`mindwatch.mindspore.rank_signal`). The source is the rank whose local norm at that step is the largest
multiple of its own median over its last :data:`WINDOW` steps, if that multiple is at least :data:`STANDS_OUT`
and at least :data:`STANDS_OUT` x the median of the other ranks' multiples (a NaN/Inf local norm stands out
unless most ranks' are too). Each rank judges its own steps alike, from the same vector:

- rank 0, as such an alert reaches its sinks, names the rank (``source_rank``, ``source_ratio``) and replaces its own
  batch keys with that rank's: from the rank itself over the lifeline, else from its records in a shared run
  directory, else the alert's ``batch_note`` says where they are (that rank's ``metrics.rank<R>.jsonl``);
- a rank > 0 whose own norm stood out on a step it recorded sends that step's batch keys to rank 0 over the
  lifeline (one short line; nothing on ordinary steps);
- when no rank stands out (every rank's norm rose alike: the model, the learning rate, not one batch), the alert
  says so, ``source_rank`` is null, and it names no batch (each rank's is in its own records).

Runs on the worker thread; ``saw`` is one append on the training thread. Nothing here touches the training step.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

import numpy as np

from mindwatch import metrics as vocab
from mindwatch.alerts.alert import Alert
from mindwatch.alerts.rules.base import BATCH_KEYS, RollingMedian
from mindwatch.store.jsonl import record_at
from mindwatch.store.layout import RunLayout
from mindwatch.store.sink import BaseSink
from mindwatch.units import format_number

#: A rank's local norm stands out at this multiple of its own recent median, and of the other ranks' median multiple.
STANDS_OUT = 2.0
#: Each rank's median is over its last this many steps' local norms.
WINDOW = 50
#: Local norms a rank's median needs before its steps are judged (early training moves fast).
WARMUP = 5
#: How long rank 0's worker waits for the source rank's batch (over the lifeline, or in a shared folder).
SOURCE_WAIT_SECS = 2.0
#: Steps whose ratios are kept for an alert that comes late (a recorded step's alert is judged within a batch or two).
KEPT_STEPS = 1000


def attributable(alert: Alert) -> bool:
    """Whether ``alert`` is on a gradient norm every rank shares (``grad_norm``, ``grad_norm/<layer>``)."""
    metric = alert.get("metric")
    if not isinstance(metric, str):
        return False
    return metric == vocab.GRAD_NORM or metric.startswith(vocab.GRAD_NORM + "/")


class SourceRank(BaseSink):
    """See the module docstring. ``send``: a rank > 0's way to rank 0 (its lifeline), None on rank 0."""

    def __init__(
        self,
        layout: RunLayout,
        *,
        rank: int,
        world_size: int,
        send: Callable[[dict[str, Any]], Any] | None = None,
        wait_secs: float = SOURCE_WAIT_SECS,
    ) -> None:
        self.layout = layout
        self.rank, self.world_size = rank, world_size
        self.send = send
        self.wait_secs = wait_secs
        self._rows: deque[tuple[int, np.ndarray]] = deque(maxlen=10_000)
        self._history = [RollingMedian(WINDOW) for _ in range(world_size)]
        #: Each step's multiples of every rank's own median (NaN: not judged yet), the last :data:`KEPT_STEPS`.
        self._ratios: OrderedDict[int, np.ndarray] = OrderedDict()
        self._norms: dict[int, np.ndarray] = {}
        #: Rank 0: the batches the other ranks sent, by ``(rank, step)`` (the lifeline's thread adds them).
        self._sent: dict[tuple[int, int], dict[str, Any]] = {}
        self._arrived = threading.Condition()

    def saw(self, step: int, norms: np.ndarray) -> None:
        """Every rank's ``local_grad_norm`` at ``step`` (0: none sent). Training thread: one append."""
        self._rows.append((step, norms))

    def source(self, step: int) -> tuple[int | None, float]:
        """``(the rank whose local norm stood out at step, its multiple of its own median)``; ``(None, largest)`` when
        none did (``nan``: the step's norms are not known)."""
        self._take()
        ratios = self._ratios.get(step)
        if ratios is None or np.isnan(ratios).all():
            return None, math.nan
        r = int(np.nanargmax(ratios))
        ratio = float(ratios[r])
        others = np.delete(ratios, r)
        others = others[~np.isnan(others)]
        # it stands out against its own past and against the other ranks' rise at that step (not all rose alike)
        rest = float(np.median(others)) if len(others) else 1.0
        alone = not math.isinf(rest) if math.isinf(ratio) else ratio >= STANDS_OUT * max(rest, 1.0)
        return (r if alone else None), ratio

    # -- sink interface (worker thread) ------------------------------------------------
    def write(self, records: list[dict[str, Any]]) -> None:
        """A rank > 0: the batch of each recorded step its own norm stood out on goes to rank 0."""
        if self.send is None:
            return
        for rec in records:
            step = rec.get("step")
            if isinstance(step, int) and self.source(step)[0] == self.rank:
                batch = {k: rec[k] for k in BATCH_KEYS if rec.get(k) is not None}
                self.send({"source": {"rank": self.rank, "step": step, **batch}})

    def alert(self, alert: Alert) -> None:
        """Rank 0: an alert on a shared gradient norm names its source rank, and that rank's batch."""
        step = alert.get("step")
        if self.rank != 0 or not isinstance(step, int) or not attributable(alert):
            return
        source, ratio = self.source(step)
        if math.isnan(ratio):
            return  # no local norms at that step (a train cell that sends none): nothing to tell
        alert["source_rank"] = source
        if source is None:
            for key in BATCH_KEYS:
                alert.pop(key, None)
            alert["message"] += (
                f"; no rank's own gradient norm stood out (the largest was {format_number(ratio)} x its median): "
                "not one rank's batch"
            )
            return
        alert["source_ratio"] = ratio
        alert["local_grad_norm"] = float(self._norms[step][source])
        alert["message"] += f"; from rank {source}, whose own gradient norm was {_times(ratio)}"
        if source == self.rank:
            return  # the batch keys are this rank's already
        for key in BATCH_KEYS:
            alert.pop(key, None)
        batch = self._batch_of(source, step)
        if batch is None:
            alert["batch_note"] = (
                f"rank {source}'s batch at step {step} is in its own records (metrics.rank{source}.jsonl in its run directory)"
            )
        else:
            alert.update({k: v for k, v in batch.items() if k in BATCH_KEYS and v is not None})

    def from_lifeline(self, rank: int, message: dict[str, Any]) -> None:
        """Rank 0's lifeline thread: a rank's batch at a step its norm stood out on."""
        step = message.get("step")
        if not isinstance(step, int):
            return
        with self._arrived:
            self._sent[(rank, step)] = message
            while len(self._sent) > KEPT_STEPS:
                self._sent.pop(next(iter(self._sent)))
            self._arrived.notify_all()

    # -- internals ---------------------------------------------------------------------
    def _take(self) -> None:
        """The rows the training thread added: each rank's multiple of its own median, then the medians move on."""
        while self._rows:
            step, norms = self._rows.popleft()
            ratios = np.full(self.world_size, np.nan)
            for r, norm in enumerate(norms.tolist()[: self.world_size]):
                if norm == 0.0:
                    continue  # that rank's step sent none
                history = self._history[r]
                if not math.isfinite(norm):
                    ratios[r] = math.inf
                elif len(history) >= WARMUP and history.median > 0:
                    ratios[r] = norm / history.median
                history.add(norm)
            self._ratios[step] = ratios
            self._norms[step] = np.asarray(norms, np.float64)
            while len(self._ratios) > KEPT_STEPS:
                old, _ = self._ratios.popitem(last=False)
                self._norms.pop(old, None)

    def _batch_of(self, rank: int, step: int) -> dict[str, Any] | None:
        """``rank``'s batch keys at ``step``: sent over the lifeline, or in its records here; waits up to ``wait_secs``."""
        deadline = time.monotonic() + self.wait_secs
        while True:
            with self._arrived:
                sent = self._sent.get((rank, step))  # kept: several alerts may name one step
            if sent is not None:
                return sent
            found = record_at(self.layout.metrics(rank), step)
            if found is not None:
                return found
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            with self._arrived:
                self._arrived.wait(min(left, 0.1))


def _times(ratio: float) -> str:
    return "NaN/Inf" if not math.isfinite(ratio) else f"{format_number(ratio)} x its recent median"
