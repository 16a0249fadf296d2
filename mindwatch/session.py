"""A monitored run: its directory, its meta, its Monitor and sinks, from one config.

Example::

    from mindwatch.config import load_config
    from mindwatch.session import RunSession

    session = RunSession.start(load_config({"project": "demo"}), rank=0, world_size=1)
    session.monitor.record({"step": 1, "t": time.time(), "loss": 2.3})
    session.close("finished")

The MindSpore callback uses this; any other training loop can too.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import socket
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mindwatch import __version__
from mindwatch.alerts.alert import Alert
from mindwatch.alerts.crossrank import CrossRankWatch, RankZeroWatch, WatchedRun
from mindwatch.alerts.engine import RuleEngine
from mindwatch.alerts.lifeline import LifelineClient, LifelineServer, StacksRelay, local_address
from mindwatch.alerts.registry import build_rules
from mindwatch.alerts.source_rank import SourceRank
from mindwatch.config import MonitorConfig, setup_logging
from mindwatch.launch_env import local_rank
from mindwatch.monitor.control import Control
from mindwatch.monitor.coordination import ActionCoordinator
from mindwatch.monitor.inbox import RequestInbox
from mindwatch.monitor.role import RankRole
from mindwatch.monitor.watchdog import StallLimits, Watchdog
from mindwatch.monitor.worker import Monitor, Sampler, Sink
from mindwatch.sinks.alertlog import AlertLog
from mindwatch.sinks.console import ConsoleSummary
from mindwatch.store.attempts import continue_meta, new_attempt, this_attempt
from mindwatch.store.layout import RunLayout, fallback_run_id, is_run_dir, new_run_id, read_json, write_json_atomic
from mindwatch.store.rendezvous import RUN_ID_ENV, RendezvousTimeout, agree_run_id, launch_attempt
from mindwatch.store.sink import hook
from mindwatch.store.states import stale_after
from mindwatch.store.writer import RunWriter

if TYPE_CHECKING:
    from mindwatch.sinks.notify import NotifySink

log = logging.getLogger("mindwatch")

#: How often a training's heartbeat appends to the column files: each append fsyncs two files per metric.
COLUMNS_EVERY_SECS = 30.0
#: Rank 0, at its end, waits up to this long for every rank still connected to say how it ended (the ranks of one
#: step end within moments of each other; a rank that trains on is named "still running").
END_WAIT_SECS = 5.0


class RunSession:
    """One rank's part of a run: where it writes, the Monitor that writes there, and what watches the run.

    :meth:`start` makes one. Everything that watches the run is built here, once, each by its builder from this
    rank's :class:`~mindwatch.monitor.role.RankRole`; what a rank's role has no part in is None.
    """

    def __init__(
        self,
        config: MonitorConfig,
        role: RankRole,
        writer: RunWriter,
        monitor: Monitor,
        *,
        meta: dict[str, Any] | None = None,
        attempt: int | None = None,
        checks_in_step: bool = False,
    ) -> None:
        """``checks_in_step``: the training thread checks what must act on the very step (``build_rules``)."""
        self.config, self.role, self.writer, self.monitor = config, role, writer, monitor
        self.run_dir = writer.layout.root
        #: Rank 0's ``meta.json`` ({} on the other ranks).
        self.meta: dict[str, Any] = meta if meta is not None else {}
        #: This attempt's number (``meta.json``'s ``attempts``; None: not known): liveness ignores other attempts' files.
        self.attempt = attempt
        #: The step the training ends at, as :meth:`plan` was last told (None: unknown).
        self.planned: int | None = None
        #: Actions the alert rules request; the framework adapter carries them out at step boundaries.
        self.control = Control(coordinated=role.coordinated)
        #: The alerts behind other ranks' requests, as they came over the lifeline: ``(asking rank, alert step, action)``.
        self.asked_elsewhere: dict[tuple[int, int, str], Alert] = {}
        self._asked_arrived = threading.Condition()
        self._closing = threading.Lock()
        self._closed = False
        #: A person's requests (``mindwatch stop|checkpoint|lr|set``, the dashboard), read on the worker.
        self.inbox = RequestInbox(
            self.run_dir,
            rank=role.rank,
            speaks=role.speaks_for_the_run,
            emit=monitor.alert,
            control=self.control,
            last_step=lambda: writer.last_step,
        )
        engine = _rule_engine(config, role, monitor.alert, self.control, self.inbox, checks_in_step)
        self.watchdog: Watchdog | None = _watchdog(config, role.rank, self.layout.stacks, self.emit_alert)
        context = notify_context(config, self.run_dir, role.rank)
        notify = _notify_sink(config, role, self.run_dir, context, self.rank_ends)
        #: Sends an urgent alert (``rank_lost``) to every notify channel from a process that outlives this one.
        self.notify_now = _urgent_sender(config, role, context, notify)
        watched = WatchedRun(self.run_dir, role, attempt, stale_after(config.flush_secs), wake=monitor.wake)
        #: Rank 0 of a multi-rank run: the straggler rule, the bands, the hang diagnosis, the other ranks' alerts.
        self.cross_rank = _cross_rank_watch(config, watched, self.emit_alert, notify, self.rank_lost)
        #: A collective run: rank 0's lifeline server (every other rank holds a connection to it), or a rank's client
        #: (from :meth:`join_lifeline`, once rank 0's address came with the signal).
        self.lifeline: LifelineServer | LifelineClient | None = _lifeline_server(
            config, watched, self.cross_rank, self._from_a_rank
        )
        #: Rank 1: rank 0's liveness (``rank_lost`` for rank 0).
        self.rank_zero = _rank_zero_watch(config, watched, self.emit_alert, self.rank_lost)
        #: Multi-rank runs without the collective: agrees with the other ranks on the step each action is carried out at.
        self.coordinator = _coordinator(config, role, self.layout, self.control, self.stop_now)
        #: A collective run with alert rules: the rank behind an alert on a shared gradient norm (the step's signal
        #: brings every rank's own norm); rank 0 names it, the other ranks send it their batch when theirs stood out.
        self.source_rank = _source_rank(role, self.layout, engine, self._to_rank_zero)
        self._hook_up(engine, notify)

    def _hook_up(self, engine: RuleEngine | None, notify: Sink | None) -> None:
        """The watchers into the Monitor: its sinks, in the order they see each batch, and its tickers."""
        relay = StacksRelay(self.rank, self._lifeline_client) if self.role.relays_stacks else None
        sinks: list[Sink | None] = [
            self.source_rank,  # first: an alert on a shared norm names its source rank before anything sees it
            AlertLog(self.writer),
            _AttemptStart(self) if self.role.keeps_meta else None,
            self.inbox,
            engine,
            self.watchdog,
            self.cross_rank,
            relay,  # a stall's stack dump goes to rank 0, whatever the folders
            self.rank_zero,
            self.coordinator,
            notify,  # after the cross-rank watch: its last forwards come before the notifier closes
        ]
        self.monitor.sinks.extend(sink for sink in sinks if sink is not None)
        self.monitor.tickers.extend(t for t in (self.cross_rank, self.rank_zero, self.coordinator) if t is not None)

    @classmethod
    def start(
        cls,
        config: MonitorConfig,
        *,
        rank: int = 0,
        world_size: int = 1,
        run_id: str | None = None,
        samplers: list[Sampler] | None = None,
        extra_sinks: list[Sink] | None = None,
        checks_in_step: bool = False,
        versions: dict[str, str] | None = None,
        launch_key: str | None = None,
        launch_meta: dict[str, Any] | None = None,
        collective: bool = False,
        attempt: int | None = None,
        begin: bool = True,
    ) -> RunSession:
        """Create (or join, for ranks > 0) the run directory and start the worker (``begin``: False, the caller
        sets up what the worker will read first, then calls :meth:`begin`).

        ``launch_key``: the same string on every rank of one distributed launch (``RankInfo.launch_key``);
        ranks > 0 then join the directory rank 0 created (:mod:`mindwatch.store.rendezvous`).
        ``collective``: the ranks agree on actions through the train step's own collective (the adapter
        takes the requests from :attr:`control`), not through files in ``control/``.
        ``checks_in_step``: the training thread checks what must act on the very step (the MindSpore adapter).
        ``attempt``: a rank > 0's attempt, as rank 0 announced it (else rank 0's rendezvous file tells it).
        """
        setup_logging(config.log_level)
        began = time.time()  # status files the last attempt left are older (the other ranks join after rank 0 publishes)
        parent = usable_save_dir(config) / config.project
        run_id = run_id or agreed_run_id(config, parent, rank, launch_key)
        run_dir = parent / run_id
        run_dir.mkdir(parents=True, exist_ok=True)
        coordinated = world_size > 1 and config.distributed.coordination.enabled
        role = RankRole(rank, world_size, collective=collective, coordinated=coordinated)
        meta: dict[str, Any] = {}
        if role.keeps_meta:  # before this attempt's writer replaces the status files the last attempt left
            fresh = {**build_meta(config, run_id, world_size, versions or {}), **(launch_meta or {})}
            meta = run_meta(RunLayout(run_dir), began, fresh)
            attempt = this_attempt(meta)
            if coordinated:
                meta["coordination"] = "collective" if collective else "files"
        elif attempt is None:
            attempt = launch_attempt(parent, launch_key, run_id)
        writer = _writer(config, run_dir, rank, attempt)
        monitor = Monitor(
            record_sinks(config, writer, run_id, rank) + (extra_sinks or []),
            queue_size=config.queue_size,
            flush_secs=config.flush_secs,
            samplers=samplers or [],
            retired=lambda: writer.superseded_by is not None,
        )
        session = cls(config, role, writer, monitor, meta=meta, attempt=attempt, checks_in_step=checks_in_step)
        if role.keeps_meta:
            session.write_meta()
        if begin:
            session.begin()
        return session

    def begin(self) -> None:
        """Start the worker and the watchdog: from here the worker owns the run directory, ``meta.json`` and the
        sinks; the training thread only hands it records (and :meth:`plan`)."""
        self.monitor.start()
        if self.watchdog is not None:
            self.watchdog.start()
        log.info("mindwatch: recording run %s (rank %d of %d) in %s", self.run_dir.name, self.rank, self.world_size, self.run_dir)

    @property
    def rank(self) -> int:
        return self.role.rank

    @property
    def world_size(self) -> int:
        return self.role.world_size

    @property
    def speaks_for_the_run(self) -> bool:
        """Whether this rank raises the alerts on values every rank shares (:attr:`RankRole.speaks_for_the_run`)."""
        return self.role.speaks_for_the_run

    @property
    def layout(self) -> RunLayout:
        return self.writer.layout

    def write_meta(self) -> None:
        if self.writer.superseded_by is not None:  # a later attempt owns meta.json now
            return
        try:
            write_json_atomic(self.layout.meta, self.meta)
        except OSError as e:
            log.warning("mindwatch: cannot write %s (%s); training continues", self.layout.meta, e)

    def plan(self, total_steps: int | None) -> None:
        """The step the training ends at (None: unknown): ``total_steps`` in meta.json and the console's progress;
        once the worker runs, it writes them (the sinks and ``meta.json`` are its own)."""
        self.planned = total_steps
        if self.monitor.running:
            self.monitor.call(partial(self._plan, total_steps))
        else:
            self._plan(total_steps)

    def _plan(self, total_steps: int | None) -> None:
        for sink in self.monitor.sinks:
            hook(sink, "plan")(total_steps)  # the console line and the end-of-run message use it
        if self.role.keeps_meta and self.meta:
            self.meta["total_steps"] = total_steps
            self.write_meta()

    def _lifeline_client(self) -> LifelineClient | None:
        return self.lifeline if isinstance(self.lifeline, LifelineClient) else None

    def rank_lost(self, lost: Any, alert: Alert) -> None:
        """This worker saw a rank die (rank 0 any rank, rank 1 rank 0): its alert's line and the notification first (the
        launcher may kill this process within 0.1 s), then this rank's status; with ``on_rank_lost: stop``, stop every
        survivor."""
        if self.writer.check_superseded():  # a relaunch took the run over: this process's view is the old attempt's
            log.info("mindwatch: %s (an earlier attempt's; not reported)", lost.message)
            return
        stop = self.config.distributed.on_rank_lost == "stop"
        if stop:
            alert["on_rank_lost"] = "stop"  # not in "actions": no step ahead can be agreed with a rank gone
        # its line in alerts.jsonl and this rank's status first (one small append, one small rewrite): the hand-off
        # below starts a process, and the launcher that saw the rank die may end this one before either is written
        self.writer.append_alert_now(alert)
        self.writer.lost_ranks[str(lost.rank)] = lost.as_record()
        self.writer.write_status_now()
        if self.notify_now is not None:
            self.notify_now(alert)
        self.writer.flush()
        if not stop:
            return
        if self.coordinator is not None and self.rank == 0:
            self.coordinator.publish_now("stop", alert)  # comes back to this rank too, through decisions.jsonl
        else:
            self.stop_now(alert)

    def stop_now(self, alert: Alert) -> None:
        """Stop at the next step boundary; if none comes within ``stop_grace`` s (the training thread waits in a
        collective for a dead rank), write the final ``stopped`` status and end the process (exit status 1)."""
        self.control.schedule("stop", alert)
        reason = f"stopped by mindwatch: {alert.get('message')}"
        grace = self.config.distributed.stop_grace
        args = (alert, reason, grace)
        threading.Thread(target=self._end_unless_stopped, args=args, name="mindwatch-stop", daemon=True).start()

    def _end_unless_stopped(self, alert: Alert, reason: str, grace: float) -> None:
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if not self.control.waiting(alert) or self.monitor.state != "running":  # the training thread took it
                return
            time.sleep(0.05)
        log.error(
            "mindwatch: no step boundary came within %.1f s (a collective waits for a lost rank): %s; ending the process",
            grace,
            reason,
        )
        self.close("stopped", reason=reason)
        logging.shutdown()
        os._exit(1)

    def emit_alert(self, alert: Alert) -> None:
        """Raise an alert from any thread: its actions go to :attr:`control`, the alert to every sink."""
        if alert.get("actions"):
            self.control.request(alert)
        self.monitor.alert(alert)

    def first_step(self, step: int) -> None:
        """The first step this attempt records (a resumed training starts past 1, or rewinds)."""
        if self.role.keeps_meta and self.meta.get("attempts"):
            self.meta["attempts"][-1]["first_step"] = step
            self.write_meta()

    def share_ask(self, action: str, alert: Alert) -> None:
        """Training thread, as this rank asks every rank for ``action``: the alert behind it goes over the lifeline to
        the other ranks (through rank 0), so that each names it as the reason, with or without a shared folder."""
        message = {"asked": {"by": self.rank, "action": action, "alert": alert}}
        if isinstance(self.lifeline, LifelineServer):
            self.lifeline.broadcast(message)
        elif isinstance(self.lifeline, LifelineClient):
            self.lifeline.send(message)

    def _to_rank_zero(self, message: dict[str, Any]) -> None:
        """A rank > 0: one short line to rank 0 over the lifeline, when it is up (worker thread)."""
        if isinstance(self.lifeline, LifelineClient):
            self.lifeline.send(message)

    def asked_alert(self, rank: int, step: int, action: str, wait: float) -> Alert | None:
        """The alert behind ``rank``'s request for ``action`` (its alert at ``step``), from the lifeline; waits up to
        ``wait`` s for it while a lifeline is up (it left with the request, a step before)."""
        key = (rank, step, action)
        with self._asked_arrived:
            if self.lifeline is not None:
                self._asked_arrived.wait_for(lambda: key in self.asked_elsewhere, wait)
            return self.asked_elsewhere.pop(key, None)

    def _keep_asked(self, message: dict[str, Any]) -> None:
        asked = message.get("asked")
        if not isinstance(asked, dict) or not isinstance(asked.get("alert"), dict):
            return
        step = asked["alert"].get("step")
        key = (int(asked.get("by", -1)), step if isinstance(step, int) else 0, str(asked.get("action")))
        with self._asked_arrived:
            self.asked_elsewhere[key] = asked["alert"]
            self._asked_arrived.notify_all()

    def _from_a_rank(self, rank: int, message: dict[str, Any]) -> None:
        """Rank 0's lifeline thread: a stall's dump for the hang diagnosis, or a request's alert for every rank."""
        if "stall" in message and self.cross_rank is not None:
            self.cross_rank.hang.relayed(rank, message)
        if isinstance(message.get("source"), dict) and self.source_rank is not None:
            self.source_rank.from_lifeline(rank, message["source"])
        if "asked" in message:
            self._keep_asked(message)
            if isinstance(self.lifeline, LifelineServer):
                self.lifeline.broadcast(message, but=rank)

    def rank_ends(self) -> dict[int, dict[str, Any]]:
        """Rank 0 of a collective run: how each other rank ended, as it said on the lifeline (else {})."""
        return self.lifeline.ends() if isinstance(self.lifeline, LifelineServer) else {}

    def join_lifeline(self, address: str) -> None:
        """A rank > 0 of a collective run: hold a connection to rank 0's lifeline (``address``, from the signal), so
        that rank 0 knows at once when this process ends, and rank 1 when rank 0's does."""
        zero = self.rank_zero
        try:
            self.lifeline = LifelineClient(
                address,
                me={"rank": self.rank, "pid": os.getpid(), "host": socket.gethostname(), "attempt": self.attempt},
                on_gone=zero.rank_zero_disconnected if zero is not None else lambda hello: None,
                keepalive_secs=self.config.distributed.lifeline_keepalive_secs,
                on_message=self._keep_asked,
            )
        except (OSError, ValueError) as e:
            log.warning("mindwatch: could not reach rank 0's lifeline at %s (%r): liveness by files only", address, e)

    def close(self, state: str = "finished", error: str | None = None, reason: str | None = None) -> None:
        """End the run once, from whichever thread comes first (the training thread, or ``mindwatch-stop`` when no
        step boundary comes): the worker stops, then the last ``meta.json`` is written."""
        with self._closing:
            if self._closed:
                return
            self._closed = True
        lifeline = self.lifeline
        if isinstance(lifeline, LifelineServer):  # rank 0: how every rank ended, for the end-of-run message
            lifeline.wait_for_byes(END_WAIT_SECS if state != "failed" else 1.0)  # a failing rank 0: its status first
            lifeline.close()
        elif lifeline is not None:  # first: this end is clean, whatever the launcher does next
            lifeline.close({"state": state, "last_step": self.writer.last_step, "reason": reason or error})
            self.lifeline = None
        if self.watchdog is not None:
            self.watchdog.stop()
        self.monitor.close(state, error, reason)
        if self.role.keeps_meta and self.meta:
            now = time.time()
            self.meta["ended_at"] = now
            self.meta["final_state"] = state
            if self.meta.get("attempts"):
                self.meta["attempts"][-1].update(ended_at=now, end=state, last_step=self.writer.last_step)
            self.write_meta()


def _rule_engine(
    config: MonitorConfig,
    role: RankRole,
    emit: Callable[[Alert], None],
    control: Control,
    inbox: RequestInbox,
    checks_in_step: bool,
) -> RuleEngine | None:
    """The alert rules the config switches on (None: ``alerts.enabled`` is off); a person may switch each one
    (``alerts.<rule>.enabled``, through the inbox)."""
    alerts = config.alerts
    if not alerts.enabled:
        return None
    rules = build_rules(config, rank=role.rank, checks_in_step=checks_in_step)
    engine = RuleEngine(rules, emit, control=control, cooldown_secs=alerts.cooldown_secs, run_wide=role.speaks_for_the_run)
    for rule in engine.rules:
        inbox.settings[f"alerts.{rule.name}.enabled"] = partial(_switch_rule, engine, rule.name)
    return engine


def _source_rank(
    role: RankRole, layout: RunLayout, engine: RuleEngine | None, to_rank_zero: Callable[[dict[str, Any]], None]
) -> SourceRank | None:
    """Every rank of a collective run with alert rules (:mod:`mindwatch.alerts.source_rank`); None otherwise."""
    if not role.collective or role.world_size < 2 or engine is None:
        return None
    send = to_rank_zero if role.rank > 0 else None
    return SourceRank(layout, rank=role.rank, world_size=role.world_size, send=send)


def _switch_rule(engine: RuleEngine, name: str, on: Any) -> None:
    engine.switch(name, bool(on))


def _watchdog(config: MonitorConfig, rank: int, stacks: Path, emit: Callable[[Alert], None]) -> Watchdog | None:
    """The stall watchdog (None unless the rules and the stall rule are on); started with the Monitor."""
    alerts = config.alerts
    if not (alerts.enabled and alerts.stall.enabled):
        return None
    limits = StallLimits(alerts.stall_timeout, alerts.first_step_timeout, alerts.stall_floor, alerts.stall_factor)
    return Watchdog(emit, stacks, rank=rank, limits=limits, actions=alerts.stall.actions)


def notify_context(config: MonitorConfig, run_dir: Path, rank: int) -> dict[str, Any]:
    """What every notification says of the run: project, run, rank, host, folder, and its dashboard page."""
    run_id = run_dir.name
    context = {"project": config.project, "run": run_id, "rank": rank, "host": socket.gethostname(), "run_dir": str(run_dir)}
    if config.dashboard_url:
        context["dashboard"] = run_page_url(config.dashboard_url, config.project, run_id)
    return context


def _notify_sink(
    config: MonitorConfig,
    role: RankRole,
    run_dir: Path,
    context: dict[str, Any],
    rank_ends: Callable[[], dict[int, dict[str, Any]]],
) -> NotifySink | None:
    """Rank 0's notifier (None without channels, or on another rank: rank 0 alone notifies)."""
    if not (config.notify and role.notifies):
        return None
    from mindwatch.sinks.channels import build_channels
    from mindwatch.sinks.handoff import hand_off
    from mindwatch.sinks.notify import NotifySink

    channels = build_channels(config.notify)
    if not channels:
        return None
    handoff = partial(hand_off, config.notify, context)
    return NotifySink(
        channels, context=context, run_dir=run_dir, world_size=role.world_size, handoff=handoff, rank_ends=rank_ends
    )


def _urgent_sender(
    config: MonitorConfig, role: RankRole, context: dict[str, Any], notify: NotifySink | None
) -> Callable[[Alert], object] | None:
    """How this rank sends ``rank_lost`` at once: rank 0 through its notifier's hand-off, rank 1 (which names rank 0
    when it dies) through a hand-off of its own; None on the other ranks."""
    if notify is not None:
        return notify.urgent
    if config.notify and role.watches_rank_zero:
        from mindwatch.sinks.handoff import hand_off

        return partial(hand_off, config.notify, context)
    return None


def _cross_rank_watch(
    config: MonitorConfig,
    run: WatchedRun,
    emit: Callable[[Alert], None],
    notify: NotifySink | None,
    on_lost: Callable[[Any, Alert], None],
) -> CrossRankWatch | None:
    """Rank 0's watch over every rank (None on the other ranks, and alone); it forwards their alerts to ``notify``."""
    if not run.role.watches_every_rank:
        return None
    alerts = config.alerts
    return CrossRankWatch(
        run,
        emit,
        config.distributed,
        alerts_enabled=alerts.enabled,
        cooldown_secs=alerts.cooldown_secs,
        forward=notify.alert if notify is not None else None,
        on_lost=on_lost,
    )


def _lifeline_server(
    config: MonitorConfig,
    run: WatchedRun,
    watch: CrossRankWatch | None,
    on_message: Callable[[int, dict[str, Any]], None],
) -> LifelineServer | None:
    """Rank 0 of a collective run: the server every other rank connects to, so that a rank that dies is known at once,
    on any host (None elsewhere, or when it cannot listen: then a dead rank is known by its files)."""
    if not run.role.serves_lifeline or watch is None:
        return None
    try:
        return LifelineServer(
            local_address(os.environ.get("MS_SCHED_HOST")),
            me={"rank": 0, "pid": os.getpid(), "host": socket.gethostname(), "attempt": run.attempt},
            on_gone=watch.rank_disconnected,
            keepalive_secs=config.distributed.lifeline_keepalive_secs,
            on_message=on_message,
        )
    except OSError as e:
        log.warning("mindwatch: no lifeline for the other ranks (%r): a dead rank is known by its files only", e)
        return None


def _rank_zero_watch(
    config: MonitorConfig, run: WatchedRun, emit: Callable[[Alert], None], on_lost: Callable[[Any, Alert], None]
) -> RankZeroWatch | None:
    """Rank 1's watch over rank 0 (None on the other ranks)."""
    if not run.role.watches_rank_zero:
        return None
    return RankZeroWatch(run, emit, config.distributed, on_lost=on_lost)


def _coordinator(
    config: MonitorConfig, role: RankRole, layout: RunLayout, control: Control, on_now: Callable[[Alert], None]
) -> ActionCoordinator | None:
    """Agrees with the other ranks, through ``control/``, on the step each action is carried out at (None unless the
    ranks coordinate without the train step's collective)."""
    if not role.agrees_through_files:
        return None
    coordination = config.distributed.coordination
    return ActionCoordinator(
        layout, rank=role.rank, world_size=role.world_size, control=control, config=coordination, on_now=on_now
    )


class _AttemptStart:
    """Sink on rank 0: notes in meta.json the first step this attempt records (on the worker, not the training thread)."""

    def __init__(self, session: RunSession) -> None:
        self.session = session
        self.done = False

    def write(self, records: list[dict[str, Any]]) -> None:
        if not self.done and records:
            self.done = True
            self.session.first_step(records[0]["step"])

    def flush(self) -> None:
        pass

    def close(self, state: str, error: str | None = None, reason: str | None = None) -> None:
        pass


def run_page_url(dashboard_url: str, project: str, run_id: str) -> str:
    """The run's page on a dashboard serving ``save_dir`` (its runs are named ``project/run``)."""
    return f"{dashboard_url.rstrip('/')}/#/run/{urllib.parse.quote(f'{project}/{run_id}', safe='')}"


def _writer(config: MonitorConfig, run_dir: Path, rank: int, attempt: int | None) -> RunWriter:
    """This rank's files in the run directory, and its status."""
    every = COLUMNS_EVERY_SECS
    return RunWriter(
        run_dir,
        rank,
        flush_secs=config.flush_secs,
        column_files=config.column_files,
        columns_every_secs=every,
        attempt=attempt,
        eval_primary=config.evaluation.primary,
        eval_mode=config.evaluation.mode,
    )


def record_sinks(config: MonitorConfig, writer: RunWriter, run_id: str, rank: int) -> list[Sink]:
    """What every recorded step goes to: the rank's files, the console line (rank 0, or every rank with
    ``log_all_ranks``), and the bridges the config switches on."""
    sinks: list[Sink] = [writer]
    if rank == 0 or config.callback.params.log_all_ranks:
        sinks.append(ConsoleSummary(config.interval))
    return sinks + bridge_sinks(config, writer.layout, run_id, rank)


def bridge_sinks(config: MonitorConfig, layout: RunLayout, run_id: str, rank: int) -> list[Sink]:
    """The TensorBoard and Prometheus sinks the config switches on (imported only then)."""
    sinks: list[Sink] = []
    if config.tensorboard_enabled:
        from mindwatch.sinks.tensorboard import TensorBoardSink

        sinks.append(TensorBoardSink(layout.tensorboard(rank)))
    prom = config.prometheus
    if prom.enabled:
        try:
            from mindwatch.sinks.prometheus import PrometheusSink
        except ImportError as e:
            log.warning("mindwatch: prometheus.enabled needs prometheus_client (pip install prometheus_client): %s", e)
        else:
            port = prom.port + local_rank()
            sinks.append(PrometheusSink(project=config.project, run=run_id, rank=rank, port=port, host=prom.host))
    return sinks


class SaveDirUnavailable(OSError):
    """Neither ``save_dir`` nor the fallback folder can be written (or ``strict`` forbids the fallback)."""


class ResumeError(RuntimeError):
    """``resume: must`` and the run to continue is not there."""


def usable_save_dir(config: MonitorConfig) -> Path:
    """``save_dir`` when it can be written; else, unless ``strict``, a folder under the temp dir, with a warning.

    A temp folder rather than console-only: the records, alerts and reports survive the run and can be copied
    out; its name depends only on ``save_dir``, so every rank on a host falls back to the same one (and meets there).
    """
    wanted = Path(config.save_dir)
    try:
        _check_writable(wanted / config.project)
        return wanted
    except OSError as e:
        cause = f"{type(e).__name__}: {e.strerror or e}"
        if config.strict:
            raise SaveDirUnavailable(f"mindwatch: cannot write in save_dir {wanted} ({cause}); strict is on") from e
    digest = hashlib.sha1(str(wanted.absolute()).encode()).hexdigest()[:8]
    fallback = Path(tempfile.gettempdir()) / f"mindwatch-{digest}"
    try:
        _check_writable(fallback / config.project)
    except OSError as e2:
        raise SaveDirUnavailable(f"mindwatch: cannot write in save_dir {wanted} ({cause}) nor in {fallback} ({e2})") from e2
    log.warning(
        "mindwatch: cannot write in save_dir %s (%s); recording into %s instead (a temporary folder: copy it out). "
        "Set save_dir to a writable folder, or strict: true to stop instead",
        wanted,
        cause,
        fallback,
    )
    return fallback


def _check_writable(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    fd, probe = tempfile.mkstemp(dir=folder, prefix=".mindwatch-write-test-")
    os.close(fd)
    os.unlink(probe)


def run_meta(layout: RunLayout, began: float, meta: dict[str, Any]) -> dict[str, Any]:
    """``meta`` with its ``attempts``: the first, or the old run's attempts (the last settled) and this one."""
    old = read_json(layout.meta)
    if old is None:
        return {**meta, "attempts": [new_attempt(1, meta["started_at"])]}
    resumed = continue_meta(old, meta, layout.root, before=began)
    last = resumed["attempts"][-2]
    log.info("mindwatch: resuming run %s (attempt %d; the last one %s)", layout.root, len(resumed["attempts"]), last["end"])
    return resumed


def resumed_run_id(config: MonitorConfig, parent: Path) -> str | None:
    """The run directory this training continues (``resume`` with a fixed name), or None for a new one."""
    fixed = os.environ.get(RUN_ID_ENV) or (config.run_name if config.resume != "never" else None)
    if config.resume == "must":
        if not fixed:
            raise ResumeError(f"monitor_config.resume is 'must': set run_name (or {RUN_ID_ENV}) to the run to continue")
        if not is_run_dir(parent / fixed):
            raise ResumeError(
                f"monitor_config.resume is 'must' but there is no run {fixed!r} in {parent} to continue; "
                "use resume: allow to create it"
            )
    return fixed


def agreed_run_id(config: MonitorConfig, parent: Path, rank: int, launch_key: str | None) -> str:
    """The run id all ranks of a launch share; a rank that cannot learn it records into a directory of its own."""
    resumed = resumed_run_id(config, parent)
    propose = lambda: resumed or new_run_id(parent, config.run_name)  # noqa: E731
    try:
        return agree_run_id(parent, rank=rank, key=launch_key, propose=propose, timeout=config.distributed.rendezvous_timeout)
    except (RendezvousTimeout, OSError) as e:
        own = new_run_id(parent, fallback_run_id(config.run_name, rank))
        log.warning("mindwatch: %s; rank %d records into %s instead", e, rank, parent / own)
        return own


def build_meta(config: MonitorConfig, run_id: str, world_size: int, versions: dict[str, str]) -> dict[str, Any]:
    """What ``meta.json`` holds: who, what, where and with which config."""
    return {
        "run_id": run_id,
        "project": config.project,
        "tags": config.tags,
        "config": config.snapshot(),
        "world_size": world_size,
        "hosts": [socket.gethostname()],
        "pid": os.getpid(),
        "command": sys.argv,
        "started_at": time.time(),
        "versions": {"mindwatch": __version__, "python": platform.python_version(), **versions},
    }
