"""The Monitor: a bounded queue in front of a worker thread that feeds the sinks.

Example::

    from mindwatch.monitor import Monitor
    from mindwatch.store import RunWriter

    mon = Monitor([RunWriter(run_dir)], flush_secs=2.0)
    mon.start()
    mon.record({"step": 1, "t": time.time(), "loss": 2.3})   # the hot path: one append
    mon.close("finished")

The training thread only calls :meth:`Monitor.record`. Everything else (encoding,
writing, fsync, sampling memory, rules, notifications) happens on the worker thread,
and an exception in a sink is a warning, never a failure of training.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from mindwatch import metrics as vocab
from mindwatch.store.sink import HOOKS, Sink, hook

log = logging.getLogger("mindwatch")

Record = dict[str, Any]

#: Seconds without a record after which the worker sleeps until the next one (compiling, evaluating, stalled).
PAUSE_SECS = 1.0
#: While records come, the worker writes a batch this often: larger batches cost less CPU per record (the fixed
#: cost of a wake-up and of each sink's call is shared), and a reader still sees a step well within a second.
BATCH_SECS = 0.25
#: ... and in a multi-rank run, whose coordination reads each rank's newest step from its records.
TICKER_BATCH_SECS = 0.05

#: The longest an idle worker sleeps when it has tickers (they poll files of the other ranks).
TICK_SECS = 0.1


#: A record's key for work the training thread leaves to the worker: a callable whose ``{metric: value}`` the worker
#: merges into the record before any sink sees it (``mindspore/stable_rank.py``: the arithmetic of a measured step).
DEFERRED = "_deferred"
#: A sampler returns extra metrics (memory, ...) merged into the newest record; run on the worker.
Sampler = Callable[[], dict[str, float]]


class Monitor:
    """Bounded queue + worker thread. See the module docstring."""

    def __init__(
        self,
        sinks: Sequence[Sink],
        *,
        queue_size: int = 10_000,
        flush_secs: float = 2.0,
        samplers: Sequence[Sampler] = (),
        sample_secs: float = 1.0,
        batch_secs: float = BATCH_SECS,
        retired: Callable[[], bool] | None = None,
    ) -> None:
        """``batch_secs``: while records come, the worker writes them this often (the first after a pause at once).
        ``retired``: true once this process no longer speaks for the run (a later attempt took it over): records and
        alerts are dropped, and the sinks are not told the end (no end-of-run message for an attempt superseded)."""
        self.sinks = list(sinks)
        self.retired = retired or (lambda: False)
        self.samplers = list(samplers)
        self.flush_secs = flush_secs
        self.sample_secs = sample_secs
        self.batch_secs = batch_secs
        self.dropped = 0
        self.state = "running"
        self._queue: deque[Record] = deque()
        self._alerts: deque[Record] = deque()
        self._calls: deque[Callable[[], None]] = deque()
        self._capacity = queue_size
        self._stop = threading.Event()
        self._wake = threading.Event()
        #: True while the worker sleeps until the next heartbeat; the first record then wakes it.
        self._idle = False
        self._thread: threading.Thread | None = None
        self._last_sample = 0.0
        self._sink_errors: dict[int, float] = {}
        #: Sinks called every loop (``tick()``), at least every ``TICK_SECS`` while idle: a multi-rank run's
        #: action coordinator and rank 0's liveness check. Empty in a single-process run.
        self.tickers: list[Any] = []

    # -- training thread ------------------------------------------------
    def record(self, rec: Record) -> None:
        """Queue one record; when the queue is full, drop it and count it. Never blocks."""
        if len(self._queue) >= self._capacity:
            self.dropped += 1
            return
        self._queue.append(rec)
        if self._idle:  # one Event.set per pause, not per record
            self._idle = False
            self._wake.set()

    def alert(self, alert: Record) -> None:
        """Hand an alert to every sink's ``alert()`` hook; from any thread, delivered on the worker thread."""
        self._alerts.append(alert)
        self._wake.set()

    def call(self, work: Callable[[], None]) -> None:
        """From any thread: run ``work`` on the worker (before its next batch), where the sinks' state is its own."""
        self._calls.append(work)
        self._wake.set()

    def wake(self) -> None:
        """From any thread: run the worker's loop (its tickers) now, not at its next batch or tick."""
        self._wake.set()

    # -- lifecycle ------------------------------------------------------
    def start(self) -> Monitor:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="mindwatch-monitor", daemon=True)
            self._thread.start()
        return self

    def close(self, state: str = "finished", error: str | None = None, reason: str | None = None, timeout: float = 10.0) -> None:
        """Drain the queue, tell every sink the final state, stop the worker."""
        if self._stop.is_set():
            return
        self.state = state
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._run_calls()
        self._drain()
        self._deliver_alerts()
        if self.retired():
            return
        if self.dropped:
            log.warning(
                "mindwatch: %d records were dropped because the queue was full (queue_size=%d)", self.dropped, self._capacity
            )
        for sink in self.sinks:
            self._call(sink, "close", state, error, reason)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- worker thread --------------------------------------------------
    def _run(self) -> None:
        """Write records every ``batch_secs`` while they come; after a pause of ``PAUSE_SECS``, sleep until one comes.

        While training, the worker is not woken per record: a wake-up from inside the callback makes the
        worker ask for the GIL while the training thread still needs it.
        """
        next_flush = time.monotonic() + self.flush_secs  # the sinks wrote their first heartbeat when built
        busy_until = -1.0
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_flush:
                next_flush = now + self.flush_secs
                for sink in self.sinks:
                    self._call(sink, "flush")
            if now < busy_until:  # a multi-rank run (tickers: coordination, liveness) keeps the short batches
                batch = min(self.batch_secs, TICKER_BATCH_SECS) if self.tickers else self.batch_secs
                self._wake.wait(max(0.0, min(batch, next_flush - now)))  # an alert (stall, resumed) cuts it short
                self._wake.clear()
            else:
                self._idle = True  # set before looking at the queue: a record appended after the look sees it
                if not self._queue and not self._alerts and not self._calls:
                    self._wake.wait(min(next_flush - now, TICK_SECS) if self.tickers else next_flush - now)
                self._idle = False
                self._wake.clear()
            self._run_calls()
            self._deliver_alerts()
            if self._queue:
                self._drain()
                busy_until = time.monotonic() + PAUSE_SECS
            for ticker in self.tickers:
                self._call(ticker, "tick")

    def _run_calls(self) -> None:
        while self._calls:
            work = self._calls.popleft()
            try:
                work()
            except Exception as e:
                self._warn_once(id(work), f"mindwatch: {work!r} failed on the worker: {e!r}; training continues")

    def _drain(self) -> None:
        batch: list[Record] = []
        q = self._queue
        while q:
            batch.append(q.popleft())
        if not batch or self.retired():
            return
        for rec in batch:
            if DEFERRED in rec:
                self._deferred(rec)
        now = time.monotonic()
        # the newest step's record: an evaluation's (or a user's own metrics') is not a step's, memory is sampled per step
        newest = next((r for r in reversed(batch) if not vocab.is_evaluation(r)), None)
        if self.samplers and newest is not None and now - self._last_sample >= self.sample_secs:
            self._last_sample = now
            for sampler in self.samplers:
                try:
                    for k, v in sampler().items():
                        newest.setdefault(k, v)
                except Exception as e:  # a broken probe must not stop monitoring
                    self._warn_once(id(sampler), f"mindwatch: sampler {sampler!r} failed: {e!r}")
        for sink in self.sinks:
            self._call(sink, "records_dropped", self.dropped)
            self._call(sink, "write", batch)
        self._deliver_alerts()  # what the rules raised on this batch, without waiting for the next one

    def _deferred(self, rec: Record) -> None:
        """The work ``rec`` carries (:data:`DEFERRED`), merged into it; a failure is a warning, the record is written."""
        work = rec.pop(DEFERRED)
        try:
            rec.update(work())
        except Exception as e:  # noqa: BLE001  # a measurement of ours that fails must not lose the step
            self._warn_once(id(DEFERRED), f"mindwatch: a measurement left to the worker failed: {e!r}")

    def _deliver_alerts(self) -> None:
        if self._alerts and self.retired():
            self._alerts.clear()
        while self._alerts:
            alert = self._alerts.popleft()
            for sink in self.sinks:
                self._call(sink, "alert", alert)

    def _call(self, sink: Sink, method: str, *args: Any) -> None:
        try:
            (hook(sink, method) if method in HOOKS else getattr(sink, method))(*args)
        except Exception as e:
            self._warn_once(id(sink), f"mindwatch: {type(sink).__name__}.{method} failed: {e!r}; training continues")

    def _warn_once(self, key: int, msg: str) -> None:
        now = time.monotonic()
        if now - self._sink_errors.get(key, -1e9) > 60:
            self._sink_errors[key] = now
            log.warning(msg)
