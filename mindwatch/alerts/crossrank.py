"""Rank 0's watch over every rank, and rank 1's over rank 0: run on the worker thread of each.

Example::

    run = WatchedRun(run_dir, RankRole(rank=0, world_size=8), attempt=1, stale_secs=10.0, wake=monitor.wake)
    watch = CrossRankWatch(run, emit=session.emit_alert, config=cfg.distributed, cooldown_secs=cfg.alerts.cooldown_secs)
    Monitor([writer, watch, ...])      # rank 0 only; it is a sink: it polls on write() and flush()

Every ``poll_secs`` it reads the new lines of every rank's ``metrics.rank<R>.jsonl``
(:class:`~mindwatch.store.tails.RankTails`), joins them by step and runs :class:`StragglerRule` on each step all
ranks recorded (or on the step and data time the train step's collective brought, ``from_signal``, in a
collective run); the joined steps go to the band files (:mod:`mindwatch.alerts.rank_bands`). It also reads
``alerts.jsonl``: the other ranks' alerts go to the hang watch (:mod:`mindwatch.alerts.hang_watch`), which names
the rank the others wait for after a stall, and to rank 0's notify channels (:mod:`mindwatch.alerts.forwarding`).
Nothing here touches the training step.

Rank 0 cannot name itself: :class:`RankZeroWatch`, on rank 1, watches rank 0 the same way
(:class:`~mindwatch.alerts.liveness.RankLiveness`) and raises the ``rank_lost`` alert for it
(``reported_by: 1``). Rank 1 alone does, so that one death is one alert, not one per survivor.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mindwatch import metrics as vocab
from mindwatch.alerts.alert import Alert, make_alert
from mindwatch.alerts.engine import RuleEngine
from mindwatch.alerts.forwarding import AlertForwarder
from mindwatch.alerts.hang_watch import HangWatch
from mindwatch.alerts.liveness import ExitWatch, LostRank, RankLiveness
from mindwatch.alerts.rank_bands import RankBands
from mindwatch.alerts.straggler import StragglerRule
from mindwatch.monitor.role import RankRole
from mindwatch.store.layout import RunLayout, read_json
from mindwatch.store.reader import JsonlTail
from mindwatch.store.states import FINAL_STATES, STALE_AT_LEAST_SECS
from mindwatch.store.tails import RankTails, StepAligner

if TYPE_CHECKING:
    from mindwatch.config import DistributedSection

log = logging.getLogger("mindwatch")

#: The rule's name in ``alerts.jsonl``.
RANK_LOST = "rank_lost"


def lost_alert(gone: LostRank, *, reported_by: int) -> Alert:
    """The ``rank_lost`` alert for a rank that died, raised by rank ``reported_by``."""
    return make_alert(
        RANK_LOST,
        step=gone.last_step,
        rank=gone.rank,
        message=gone.message,
        severity="error",
        lost_rank=gone.rank,
        pid=gone.pid,
        host=gone.host,
        how=gone.how,
        reported_by=reported_by,
    )


@dataclass(frozen=True)
class WatchedRun:
    """The run whose other ranks a rank's worker watches: what rank 0's and rank 1's watches share."""

    run_dir: Path
    #: This rank's part: its rank, the world size, and whether the train step's collective brings every rank's timings.
    role: RankRole
    #: This attempt's number (``meta.json``'s ``attempts``): other attempts' status files say nothing of this one.
    attempt: int | None = None
    #: A rank on another host whose heartbeat is older than this is gone (:func:`mindwatch.store.states.stale_after`).
    stale_secs: float = STALE_AT_LEAST_SECS
    #: Wakes the worker (``Monitor.wake``) the moment a watched process exits.
    wake: Callable[[], None] | None = None
    #: The watch's clock (a test drives its own).
    clock: Callable[[], float] = time.monotonic

    @property
    def layout(self) -> RunLayout:
        return RunLayout(Path(self.run_dir))


class _Liveness:
    """What rank 0's and rank 1's watches share: a liveness check on the worker, every ``liveness_secs`` and at
    once when a watched local process exits (the exit watch wakes the worker), remote heartbeats less often; and
    :meth:`report_lost`, the one way a rank that died is told."""

    def __init__(
        self,
        run: WatchedRun,
        ranks: list[int],
        config: DistributedSection,
        emit: Callable[[Alert], None],
        *,
        on_lost: Callable[[LostRank, Alert], None] | None,
        reporter: int,
    ) -> None:
        self.clock = run.clock
        self.wake = run.wake
        self.emit = emit
        #: Runs first when a rank is lost (the notification: the launcher may kill this process within 0.1 s).
        self.on_lost = on_lost
        #: The rank that names the lost ones (``reported_by``): 0, or 1 for rank 0.
        self.reporter = reporter
        self.exits = ExitWatch(self._exited) if run.role.world_size > 1 else None
        self.liveness = RankLiveness(
            run.layout, run.role.world_size, stale_secs=run.stale_secs, ranks=ranks, exits=self.exits, attempt=run.attempt
        )
        self.liveness_secs = config.liveness_secs
        #: Remote heartbeats are read (one status file a rank) this often: a quarter of the stale limit.
        self.remote_secs = max(config.poll_secs, run.stale_secs / 4)
        self._last_liveness = -1e18
        self._last_remote = -1e18
        self._due = False
        #: Ranks whose lifeline closed without a goodbye (from the lifeline's thread): ``(rank, its hello)``.
        self._disconnected: list[tuple[int, dict[str, Any]]] = []

    def rank_disconnected(self, rank: int, hello: dict[str, Any]) -> None:
        """The lifeline's thread: ``rank``'s process ended; the worker raises ``rank_lost`` at its next tick."""
        self._disconnected.append((rank, hello))
        self._woken()

    def report_lost(self, gone: LostRank) -> None:
        """``gone`` died: ``on_lost`` first (the alert's line and this rank's status, then the notification), then the
        ``rank_lost`` alert."""
        alert = lost_alert(gone, reported_by=self.reporter)
        if self.reporter == 0:
            log.error("mindwatch: %s", gone.message)
        else:
            log.error("mindwatch: %s (seen by rank %d)", gone.message, self.reporter)
        if self.on_lost is not None:
            self.on_lost(gone, alert)
        self.emit(alert)

    def _lost_by_lifeline(self, last_step: Callable[[int], int | None]) -> list[LostRank]:
        out = []
        while self._disconnected:
            rank, hello = self._disconnected.pop(0)
            if rank in self.liveness.lost or self.liveness.watches_pid(rank):
                continue  # named already, or named by its pid on this host (the same moment, with its exit)
            pid, host = hello.get("pid"), hello.get("host")
            pid = pid if isinstance(pid, int) else None
            how = str(hello.get("how") or "disconnected")
            gone = LostRank(rank, pid, str(host or "?"), last_step(rank), how, time.time())
            self.liveness.lost[rank] = gone
            out.append(gone)
        return out

    def _exited(self, pid: int) -> None:  # on the exit watch's thread
        self._woken()

    def _woken(self) -> None:
        """Any thread: the liveness check is due, and the worker wakes for it now."""
        self._due = True
        if self.wake is not None:
            self.wake()

    def liveness_due(self) -> bool:
        now = self.clock()
        if self._due or now - self._last_liveness >= self.liveness_secs:
            self._due = False
            self._last_liveness = now
            return True
        return False

    def remote_due(self) -> bool:
        now = self.clock()
        if now - self._last_remote >= self.remote_secs:
            self._last_remote = now
            return True
        return False

    def close_exits(self) -> None:
        if self.exits is not None:
            self.exits.close()


class RankZeroWatch(_Liveness):
    """Sink and ticker for rank 1: rank 0's liveness. ``on_lost(lost, alert)`` runs first (the notification),
    then the alert goes to ``emit`` (alerts.jsonl)."""

    def __init__(
        self,
        run: WatchedRun,
        emit: Callable[[Alert], None],
        config: DistributedSection,
        *,
        on_lost: Callable[[LostRank, Alert], None] | None = None,
    ) -> None:
        super().__init__(run, [0], config, emit, on_lost=on_lost, reporter=run.role.rank)
        self._last_step: int | None = None

    def write(self, records: list[dict[str, Any]]) -> None:
        step = records[-1].get("step") if records else None
        if isinstance(step, int):
            self._last_step = step  # rank 0 is at the same step, give or take one (the collective holds them together)

    def flush(self) -> None:
        self._check(remote=self.remote_due())

    def tick(self) -> None:
        if self.liveness_due():
            self._check(remote=False)

    def rank_zero_disconnected(self, hello: dict[str, Any]) -> None:
        """The lifeline's thread: rank 0's process ended without a goodbye."""
        self.rank_disconnected(0, hello)

    def close(self, state: str, error: str | None = None, reason: str | None = None) -> None:
        self.close_exits()

    def _check(self, *, remote: bool) -> None:
        for gone in self._lost_by_lifeline(lambda rank: self._last_step) + self.liveness.check(remote=remote):
            self.report_lost(gone)


class CrossRankWatch(_Liveness):
    """Sink and ticker for rank 0: every rank's steps joined for the straggler rule and the bands, the other ranks'
    alerts read for the hang watch and rank 0's notify channels (``forward``), and the ranks that die named."""

    def __init__(
        self,
        run: WatchedRun,
        emit: Callable[[Alert], None],
        config: DistributedSection,
        *,
        alerts_enabled: bool = True,
        cooldown_secs: float = 300.0,
        forward: Callable[[Alert], None] | None = None,
        on_lost: Callable[[LostRank, Alert], None] | None = None,
        write_bands: bool = True,
        close_wait: float = 5.0,
    ) -> None:
        world_size = run.role.world_size
        super().__init__(run, list(range(1, world_size)), config, emit, on_lost=on_lost, reporter=0)
        self.layout = layout = run.layout
        self.world_size = world_size
        #: Our train cells and loops sum every rank's step and data time with the step (``from_signal``): the
        #: straggler rule and those bands read them, with or without a shared file system, not the rank files.
        self.timings_from_signal = run.role.collective
        self._signal_rows: deque[tuple[int, np.ndarray, int]] = deque(maxlen=10_000)
        self._norm_rows: deque[tuple[int, np.ndarray]] = deque(maxlen=10_000)
        self.poll_secs = config.poll_secs
        self.close_wait = close_wait
        self.tails = RankTails(layout.root, world_size)
        self.aligner = StepAligner(world_size)
        s = config.straggler
        rules = [StragglerRule.from_settings(s)] if alerts_enabled and s.enabled else []
        self.engine = RuleEngine(rules, emit, cooldown_secs=cooldown_secs)
        self.bands = RankBands(layout, world_size, decide_after=run.stale_secs, clock=self.clock) if write_bands else None
        hang_on = alerts_enabled and config.hang.enabled
        self.hang = HangWatch(layout, world_size, config.hang, emit, enabled=hang_on, wake=self._woken, clock=self.clock)
        self.forwarder = AlertForwarder(forward) if forward is not None else None
        self.last_steps: dict[int, int] = {}
        self._alerts = JsonlTail(layout.alerts)
        for tail in [self._alerts, *self.tails.tails.values()]:
            tail.offset = _size(tail.path)  # a resumed run's old lines are not news
        self._last_poll = -1e18

    def from_signal(self, step: int, timings: np.ndarray, joined: int) -> None:
        """Every rank's ``vocab.STRAGGLER_METRICS`` at ``step``, one row a rank (0: none sent), as the collective of
        step ``joined`` summed them: a rank that sent a row took part in that step.
        Training thread: one append; the worker reads them at its next poll."""
        self._signal_rows.append((step, timings, joined))

    def local_norms(self, step: int, norms: np.ndarray) -> None:
        """Every rank's ``local_grad_norm`` of ``step`` (0: none sent), as the step's collective summed them: their band
        when the other ranks' files are not here. Training thread: one append."""
        self._norm_rows.append((step, norms))

    # -- sink interface (rank 0's worker thread) ----------------------------------
    def write(self, records: list[dict[str, Any]]) -> None:
        if self.clock() - self._last_poll >= self.poll_secs:
            self.poll()

    def flush(self) -> None:
        self.poll()

    def tick(self) -> None:
        """Every worker loop: the liveness of the ranks on this host, every ``liveness_secs`` (a signal 0 per pid)
        and at once when one of them exits."""
        if self.liveness_due():
            self._check_liveness(remote=False)

    def close(self, state: str, error: str | None = None, reason: str | None = None) -> None:
        """A last look, after the other ranks ended too (up to ``close_wait`` s): their last alerts get forwarded."""
        deadline = self.clock() + self.close_wait
        while True:
            self.poll()
            if self._others_done() or self.clock() >= deadline:
                break
            time.sleep(0.05)
        if self.timings_from_signal and self.bands is not None:
            self.bands.from_signal([], final=True)
        self.close_exits()

    def _others_done(self) -> bool:
        if self.bands is not None and self.bands.others_elsewhere:
            return True  # the other ranks' files are on their own hosts: nothing to wait for here
        # a rank writes its final status after its last alert is in alerts.jsonl
        for r in range(1, self.world_size):
            if r in self.liveness.lost:
                continue
            st = read_json(self.layout.status(r))
            if st is None or st.get("state") not in FINAL_STATES:
                return False
        return True

    # -- one look at the other ranks --------------------------------------------------
    def poll(self) -> None:
        self._last_poll = self.clock()
        self._read_steps()
        self._check_liveness(remote=self.remote_due())
        if self.hang.enabled or self.forwarder is not None:
            self._read_alerts()

    def _read_steps(self) -> None:
        if self.timings_from_signal:
            self._read_signal()
        complete = []
        for rank, records in self.tails.read_new().items():
            step = records[-1].get("step")
            if isinstance(step, int):
                self.last_steps[rank] = step
            for step, ranks in self.aligner.add(rank, records):
                if not self.timings_from_signal:
                    self.engine.write([{"step": step, "ranks": ranks}])
                complete.append((step, ranks))
        if self.bands is not None:
            self.bands.from_files(complete)

    def _read_signal(self) -> None:
        """The timings the collective brought since the last poll: the straggler rule and their bands."""
        complete = []
        while self._signal_rows:
            step, timings, joined = self._signal_rows.popleft()
            ranks = {
                r: {"step": step, **dict(zip(vocab.STRAGGLER_METRICS, row, strict=True))}
                for r, row in enumerate(timings.tolist())
                if any(row)  # a rank whose step sent nothing (no callback there, or not started yet)
            }
            for r in ranks:  # its last step: the last collective it joined (rank 0 finished that step too)
                self.last_steps[r] = max(joined, self.last_steps.get(r, joined))
            self.engine.write([{"step": step, "ranks": ranks}])
            complete.append((step, ranks))
        while self._norm_rows:
            step, norms = self._norm_rows.popleft()
            by_rank = {r: {"step": step, vocab.LOCAL_GRAD_NORM: v} for r, v in enumerate(norms.tolist()) if v != 0.0}
            complete.append((step, by_rank))
        if self.bands is not None:
            self.bands.from_signal(complete)

    def _check_liveness(self, *, remote: bool) -> None:
        if self.world_size < 2:
            return
        lost = self._lost_by_lifeline(self.last_steps.get) + self.liveness.check(self.last_steps, remote=remote)
        if not lost:
            return
        self._read_steps()  # the lost rank's last records, if they arrived since the last poll
        for gone in lost:
            last = max(s for s in (gone.last_step, self.last_steps.get(gone.rank), -1) if isinstance(s, int))
            gone = LostRank(gone.rank, gone.pid, gone.host, last if last >= 0 else None, gone.how, gone.t)
            self.liveness.lost[gone.rank] = gone
            self.report_lost(gone)

    def _read_alerts(self) -> None:
        """The other ranks' new alerts: to rank 0's notify channels, and to the hang watch (with the dumps relayed)."""
        self.hang.take_relayed()
        for alert in self._alerts.read_new():
            rank = alert.get("rank")
            if not isinstance(rank, int):
                continue
            if self.forwarder is not None:
                self.forwarder.saw(rank, alert)
            self.hang.saw(rank, alert)
        self.hang.check()


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
