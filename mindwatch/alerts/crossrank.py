"""Rules across ranks, run on rank 0's worker thread: stragglers and hang diagnosis.

Example::

    watch = CrossRankWatch(run_dir, world_size=8, emit=session.emit_alert, config=cfg.distributed,
                           cooldown_secs=cfg.alerts.cooldown_secs)
    Monitor([writer, watch, ...])      # rank 0 only; it is a sink: it polls on write() and flush()

Every ``poll_secs`` it reads the new lines of every rank's ``metrics.rank<R>.jsonl``
(:class:`~mindwatch.store.tails.RankTails`), joins them by step and runs
:class:`StragglerRule` on each step all ranks recorded. It also reads ``alerts.jsonl``: when
ranks report a ``stall`` (the per-rank watchdog, which dumps its stacks into ``stacks/``), it waits
until every rank's dump is there (or ``hang.wait`` seconds) and emits one ``hang`` alert that names
the rank the others wait for (:mod:`mindwatch.alerts.hang`). Nothing here touches the training step.

Rank 0 cannot name itself: :class:`RankZeroWatch`, on rank 1, watches rank 0 the same way
(:class:`~mindwatch.alerts.liveness.RankLiveness`) and raises the ``rank_lost`` alert for it
(``reported_by: 1``). Rank 1 alone does, so that one death is one alert, not one per survivor.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mindwatch import metrics as vocab
from mindwatch.alerts.alert import RESUMED, STALL, Alert, make_alert
from mindwatch.alerts.engine import RuleEngine
from mindwatch.alerts.hang import diagnose
from mindwatch.alerts.liveness import ExitWatch, LostRank, RankLiveness
from mindwatch.alerts.straggler import StragglerRule
from mindwatch.store.bandfiles import BandFileWriter, band_rows
from mindwatch.store.layout import RunLayout, read_json
from mindwatch.store.reader import JsonlTail
from mindwatch.store.states import FINAL_STATES
from mindwatch.store.tails import RankTails, StepAligner

if TYPE_CHECKING:
    from mindwatch.config import DistributedSection

log = logging.getLogger("mindwatch")

#: The rules' names in ``alerts.jsonl``.
HANG, RANK_LOST = "hang", "rank_lost"


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


class _Liveness:
    """What rank 0's and rank 1's watches share: a liveness check on the worker, every ``liveness_secs`` and at
    once when a watched local process exits (the exit watch wakes the worker), remote heartbeats less often."""

    def __init__(
        self,
        layout: RunLayout,
        world_size: int,
        ranks: list[int],
        config: DistributedSection,
        *,
        stale_secs: float,
        wake: Callable[[], None] | None,
        clock: Callable[[], float],
        attempt: int | None,
    ) -> None:
        self.clock = clock
        self.wake = wake
        self.exits = ExitWatch(self._exited) if world_size > 1 else None
        live = RankLiveness(layout, world_size, stale_secs=stale_secs, ranks=ranks, exits=self.exits, attempt=attempt)
        self.liveness = live
        self.liveness_secs = config.liveness_secs
        #: Remote heartbeats are read (one status file a rank) this often: a quarter of the stale limit.
        self.remote_secs = max(config.poll_secs, stale_secs / 4)
        self._last_liveness = -1e18
        self._last_remote = -1e18
        self._due = False
        #: Ranks whose lifeline closed without a goodbye (from the lifeline's thread): ``(rank, its hello)``.
        self._disconnected: list[tuple[int, dict[str, Any]]] = []

    def rank_disconnected(self, rank: int, hello: dict[str, Any]) -> None:
        """The lifeline's thread: ``rank``'s process ended; the worker raises ``rank_lost`` at its next tick."""
        self._disconnected.append((rank, hello))
        self._exited(-1)

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
        run_dir: Path,
        world_size: int,
        emit: Callable[[Alert], None],
        config: DistributedSection,
        *,
        rank: int = 1,
        on_lost: Callable[[LostRank, Alert], None] | None = None,
        stale_secs: float = 10.0,
        wake: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        attempt: int | None = None,
    ) -> None:
        layout = RunLayout(Path(run_dir))
        super().__init__(layout, world_size, [0], config, stale_secs=stale_secs, wake=wake, clock=clock, attempt=attempt)
        self.rank = rank
        self.emit = emit
        self.on_lost = on_lost
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
        lost = self._lost_by_lifeline(lambda rank: self._last_step) + self.liveness.check(remote=remote)
        for gone in lost:
            alert = lost_alert(gone, reported_by=self.rank)
            log.error("mindwatch: %s (seen by rank %d)", gone.message, self.rank)
            if self.on_lost is not None:
                self.on_lost(gone, alert)
            self.emit(alert)


class CrossRankWatch(_Liveness):
    """Sink for rank 0: the straggler rule over all ranks' files, the hang diagnosis after a stall, and
    ``forward``: the other ranks' alerts (read from ``alerts.jsonl``) handed to rank 0's notify channels."""

    def __init__(
        self,
        run_dir: Path,
        world_size: int,
        emit: Callable[[Alert], None],
        config: DistributedSection,
        *,
        alerts_enabled: bool = True,
        cooldown_secs: float = 300.0,
        forward: Callable[[Alert], None] | None = None,
        on_lost: Callable[[LostRank, Alert], None] | None = None,
        stale_secs: float = 10.0,
        write_bands: bool = True,
        close_wait: float = 5.0,
        wake: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        timings_from_signal: bool = False,
        attempt: int | None = None,
    ) -> None:
        self.layout = RunLayout(Path(run_dir))
        #: Our train cells and loops sum every rank's step and data time with the step (``from_signal``): the
        #: straggler rule and those bands read them, with or without a shared file system, not the rank files.
        self.timings_from_signal = timings_from_signal
        self._signal_rows: deque[tuple[int, np.ndarray, int]] = deque(maxlen=10_000)
        #: Whether the other ranks' files are in this run directory (None: not known yet). When they are, the
        #: bands come from them (every recorded step, the last one too); when not, from the signal's timings.
        self._shared: bool | None = None
        self._signal_since: float | None = None
        self._pending_bands: deque[tuple[int, dict[int, dict[str, Any]]]] = deque(maxlen=10_000)
        self._stale_secs = stale_secs
        others = list(range(1, world_size))
        super().__init__(self.layout, world_size, others, config, stale_secs=stale_secs, wake=wake, clock=clock, attempt=attempt)
        self.world_size = world_size
        self.emit = emit
        self.poll_secs = config.poll_secs
        self.close_wait = close_wait
        self.clock = clock
        self.tails = RankTails(self.layout.root, world_size)
        self.aligner = StepAligner(world_size)
        s = config.straggler
        on = alerts_enabled and s.enabled
        rules = [StragglerRule.from_settings(s)] if on else []
        self.engine = RuleEngine(rules, emit, cooldown_secs=cooldown_secs)
        self.forward = forward
        self.hang_enabled = alerts_enabled and config.hang.enabled
        self.hang_wait = config.hang.wait
        self.hang_actions = list(config.hang.actions)
        self.bands = BandFileWriter(self.layout) if write_bands else None
        self.on_lost = on_lost
        self.last_steps: dict[int, int] = {}
        self._alerts = JsonlTail(self.layout.alerts)
        for tail in [self._alerts, *self.tails.tails.values()]:
            tail.offset = _size(tail.path)  # a resumed run's old lines are not news
        self._stalls: dict[int, Alert] = {}
        #: Stall alerts and dumps the other ranks sent over the lifeline (``relayed``), for the worker.
        self._relayed: deque[tuple[int, Alert, str]] = deque()
        self._stall_since: float | None = None
        self._diagnosed = False
        self._last_poll = -1e18
        self.diagnoses = 0

    def from_signal(self, step: int, timings: np.ndarray, joined: int) -> None:
        """Every rank's ``vocab.STRAGGLER_METRICS`` at ``step``, one row a rank (0: none sent), as the collective of
        step ``joined`` summed them: a rank that sent a row took part in that step.
        Training thread: one append; the worker reads them at its next poll."""
        self._signal_rows.append((step, timings, joined))

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
        if self.timings_from_signal:
            self._signal_bands([], final=True)
        self.close_exits()

    def _others_done(self) -> bool:
        if self._shared is False:
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
        if self.hang_enabled or self.forward is not None:
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
        if complete and self.bands is not None:
            skip = vocab.STRAGGLER_METRICS if self._shared is False else ()
            self._write_bands(complete, [m for m in vocab.banded() if m not in skip])

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
        if self._signal_since is None and complete:
            self._signal_since = self.clock()
        self._signal_bands(complete)

    def _signal_bands(self, complete: list[tuple[int, dict[int, dict[str, Any]]]], *, final: bool = False) -> None:
        """The signal's timings into ``bands/`` when the other ranks' files are not here (no shared file system)."""
        if self.bands is None:
            return
        if self._shared is None:
            if any(self.layout.metrics(r).exists() for r in range(1, self.world_size)):
                self._shared = True
            elif final or (self._signal_since is not None and self.clock() - self._signal_since >= self._stale_secs):
                self._shared = False
        if self._shared is None:
            self._pending_bands.extend(complete)
            return
        if self._shared:
            self._pending_bands.clear()
            return
        rows = [*self._pending_bands, *complete]
        self._pending_bands.clear()
        if rows:
            self._write_bands(rows, list(vocab.STRAGGLER_METRICS))

    def _write_bands(self, complete: list[tuple[int, dict[int, dict[str, Any]]]], metrics: list[str]) -> None:
        """Steps across ranks, summarised across ranks per metric (``bands/``: what the dashboard reads)."""
        bands = self.bands
        if bands is None:
            return
        complete.sort(key=lambda item: item[0])
        steps = [step for step, _ in complete]
        ranks = np.arange(self.world_size)
        for metric in metrics:
            values = np.full((len(complete), self.world_size), np.nan)
            seen = False
            for i, (_, by_rank) in enumerate(complete):
                for r, rec in by_rank.items():
                    v = rec.get(metric)
                    if isinstance(v, (int, float)):
                        values[i, r] = v
                        seen = True
            if seen:
                bands.append(metric, band_rows(steps, ranks, values))

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
            alert = lost_alert(gone, reported_by=0)
            log.error("mindwatch: %s", gone.message)
            if self.on_lost is not None:
                self.on_lost(gone, alert)
            self.emit(alert)

    def _read_alerts(self) -> None:
        self._take_relayed()
        for alert in self._alerts.read_new():
            rank = alert.get("rank")
            if not isinstance(rank, int):
                continue
            # rank 0 alone sends notifications: the other ranks' alerts go out from here; not their interventions,
            # which every rank carries out at one step (rank 0 tells of its own: one message for the run)
            if self.forward is not None and alert.get("reported_by", rank) != 0 and alert.get("rule") != "intervention":
                self.forward(alert)
            if not self.hang_enabled:
                continue
            if alert.get("rule") == STALL:
                self._stalls[rank] = alert
                if self._stall_since is None:
                    self._stall_since = self.clock()
            elif alert.get("rule") == RESUMED:
                self._stalls.pop(rank, None)
                if not self._stalls:
                    self._stall_since, self._diagnosed = None, False
        if not self.hang_enabled or self._stall_since is None or self._diagnosed:
            return
        if len(self._stalls) < self.world_size and self.clock() - self._stall_since < self.hang_wait:
            return  # give the other ranks' watchdogs time to write their dumps
        self._diagnosed = True
        self.emit(self.diagnose())

    def relayed(self, rank: int, message: dict[str, Any]) -> None:
        """The lifeline's thread: ``rank``'s stall alert and its stack dump (``StacksRelay``); kept in this run's
        ``stacks/`` on the worker, for the hang diagnosis, with or without a shared folder."""
        if isinstance(message.get("stall"), dict) and isinstance(message.get("stacks_text"), str):
            self._relayed.append((rank, message["stall"], message["stacks_text"]))
            self._exited(-1)  # wake the worker

    def _take_relayed(self) -> None:
        while self._relayed:
            rank, alert, text = self._relayed.popleft()
            name = Path(str(alert.get("stacks") or "")).name
            if not name.startswith(f"stall_rank{rank}_"):
                continue
            path = self.layout.stacks / name
            if not path.exists():  # a shared folder has it already
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    tmp = path.with_name(f".{name}.tmp")
                    tmp.write_text(text, encoding="utf-8")
                    tmp.replace(path)
                except OSError as e:
                    log.warning("mindwatch: cannot keep rank %d's stack dump in %s (%s)", rank, path, e)
                    continue
            if self.hang_enabled:
                self._stalls[rank] = {**alert, "rank": rank, "stacks": str(path)}
                if self._stall_since is None:
                    self._stall_since = self.clock()

    def diagnose(self) -> Alert:
        """The ``hang`` alert from the stall dumps collected so far."""
        self.diagnoses += 1
        dumps = {r: self._local(a["stacks"]) for r, a in self._stalls.items() if a.get("stacks")}
        last_steps = {}
        for r in range(self.world_size):
            st = read_json(self.layout.status(r)) or {}
            last_steps[r] = st.get("last_step")
        d = diagnose(dumps, self.world_size, last_steps)
        step = max((s for s in last_steps.values() if isinstance(s, int)), default=None)
        where = {str(r): {"where": p.where, "detail": p.detail, "stacks": p.stacks} for r, p in d.places.items()}
        return make_alert(
            HANG,
            step=step,
            rank=d.culprits[0] if len(d.culprits) == 1 else 0,
            message=f"run stalled after step {step}: {d.message}",
            severity="error",
            actions=self.hang_actions,
            culprits=d.culprits,
            waiting=d.waiting,
            places=where,
            reported_by=0,
        )

    def _local(self, path: str) -> Path:
        """A dump path as another rank wrote it (maybe relative to its own working directory), found here."""
        p = Path(path)
        return p if p.exists() else self.layout.stacks / p.name


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
