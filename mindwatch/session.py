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

import logging
import os
import platform
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mindwatch import __version__
from mindwatch.alerts.alert import Alert
from mindwatch.alerts.engine import RuleEngine
from mindwatch.alerts.registry import build_rules
from mindwatch.config import MonitorConfig
from mindwatch.monitor.control import Control
from mindwatch.monitor.coordination import ActionCoordinator
from mindwatch.monitor.watchdog import Watchdog
from mindwatch.monitor.worker import Monitor, Sampler, Sink
from mindwatch.sinks.alertlog import AlertLog
from mindwatch.sinks.console import ConsoleSummary
from mindwatch.store.layout import RunLayout, new_run_id, write_json_atomic
from mindwatch.store.rendezvous import RendezvousTimeout, agree_run_id
from mindwatch.store.writer import RunWriter

log = logging.getLogger("mindwatch")


@dataclass
class RunSession:
    """One rank's part of a run: where it writes and the Monitor that writes there."""

    config: MonitorConfig
    run_dir: Path
    rank: int
    world_size: int
    writer: RunWriter
    monitor: Monitor
    meta: dict[str, Any] = field(default_factory=dict)
    #: Actions the alert rules request; the framework adapter carries them out at step boundaries.
    control: Control = field(default_factory=Control)
    watchdog: Watchdog | None = None
    #: Multi-rank runs: agrees with the other ranks on the step each action is carried out at.
    coordinator: ActionCoordinator | None = None

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
        nonfinite_checked: tuple[str, ...] = (),
        versions: dict[str, str] | None = None,
        launch_key: str | None = None,
        launch_meta: dict[str, Any] | None = None,
    ) -> RunSession:
        """Create (or join, for ranks > 0) the run directory and start the worker.

        ``launch_key``: the same string on every rank of one distributed launch (``RankInfo.launch_key``);
        ranks > 0 then join the directory rank 0 created (:mod:`mindwatch.store.rendezvous`).
        """
        setup_logging(config.log_level)
        parent = Path(config.save_dir) / config.project
        parent.mkdir(parents=True, exist_ok=True)
        run_id = run_id or agreed_run_id(config, parent, rank, launch_key)
        run_dir = parent / run_id
        run_dir.mkdir(parents=True, exist_ok=True)
        writer = RunWriter(run_dir, rank, flush_secs=config.flush_secs, column_files=config.column_files)
        sinks: list[Sink] = [writer]
        if rank == 0 or config.callback.params.log_all_ranks:
            sinks.append(ConsoleSummary(config.interval))
        sinks.extend(bridge_sinks(config, writer.layout, run_id, rank))
        sinks.extend(extra_sinks or [])
        monitor = Monitor(sinks, queue_size=config.queue_size, flush_secs=config.flush_secs, samplers=samplers or [])
        coordinated = world_size > 1 and config.distributed.coordination.enabled
        session = cls(config, run_dir, rank, world_size, writer, monitor, control=Control(coordinated=coordinated))
        session.watch(run_id, nonfinite_checked)
        if rank == 0:
            session.meta = {**build_meta(config, run_id, world_size, versions or {}), **(launch_meta or {})}
            session.write_meta()
        monitor.start()
        if session.watchdog is not None:
            session.watchdog.start()
        log.info("mindwatch: recording run %s (rank %d of %d) in %s", run_id, rank, world_size, run_dir)
        return session

    @property
    def layout(self) -> RunLayout:
        return self.writer.layout

    def write_meta(self) -> None:
        try:
            write_json_atomic(self.layout.meta, self.meta)
        except OSError as e:
            log.warning("mindwatch: cannot write %s (%s); training continues", self.layout.meta, e)

    def watch(self, run_id: str, nonfinite_checked: tuple[str, ...] = ()) -> None:
        """Add what watches the run: alerts.jsonl + console lines, the rules, notify channels, the stall watchdog.

        ``nonfinite_checked``: metrics the training loop checks for NaN itself (see ``build_rules``).
        """
        cfg, alerts = self.config, self.config.alerts
        sinks: list[Sink] = [AlertLog(self.writer)]
        if alerts.enabled:
            rules = build_rules(cfg, rank=self.rank, nonfinite_checked=nonfinite_checked)
            sinks.append(RuleEngine(rules, self.monitor.alert, control=self.control, cooldown_secs=alerts.cooldown_secs))
            if alerts.stall.enabled:
                self.watchdog = Watchdog(
                    self.emit_alert,
                    self.layout.stacks,
                    rank=self.rank,
                    timeout=alerts.stall_timeout,
                    first_step_timeout=alerts.first_step_timeout,
                    floor=alerts.stall_floor,
                    factor=alerts.stall_factor,
                    actions=alerts.stall.actions,
                )
                sinks.append(self.watchdog)
        notify = None
        if cfg.notify and self.rank == 0:  # rank 0 alone notifies; it forwards the other ranks' alerts
            from mindwatch.sinks.notify import NotifySink, build_channels

            channels = build_channels(cfg.notify)
            if channels:
                host = socket.gethostname()
                context = {"project": cfg.project, "run": run_id, "rank": self.rank, "host": host, "run_dir": str(self.run_dir)}
                notify = NotifySink(channels, context=context)
        if self.rank == 0 and self.world_size > 1:
            from mindwatch.alerts.crossrank import CrossRankWatch

            forward = notify.alert if notify is not None else None
            watch = CrossRankWatch(
                self.run_dir,
                self.world_size,
                self.emit_alert,
                cfg.distributed,
                alerts_enabled=alerts.enabled,
                cooldown_secs=alerts.cooldown_secs,
                forward=forward,
                on_lost=self.rank_lost,
                stale_secs=max(10.0, 5 * cfg.flush_secs),
            )
            sinks.append(watch)
            self.monitor.tickers.append(watch)
        if self.control.coordinated:
            self.coordinator = ActionCoordinator(
                self.layout,
                rank=self.rank,
                world_size=self.world_size,
                control=self.control,
                config=cfg.distributed.coordination,
                on_now=self.stop_now,
            )
            sinks.append(self.coordinator)
            self.monitor.tickers.append(self.coordinator)
        if notify is not None:
            sinks.append(notify)  # after the cross-rank watch: its last forwards come before the notifier closes
        self.monitor.sinks.extend(sinks)

    def rank_lost(self, lost: Any, alert: Alert) -> None:
        """Rank 0's worker saw a rank die: record it in rank 0's status; with ``on_rank_lost: stop``, stop every survivor."""
        self.writer.lost_ranks[str(lost.rank)] = lost.as_record()
        self.writer.flush()
        if self.config.distributed.on_rank_lost != "stop":
            return
        alert["on_rank_lost"] = "stop"  # not in "actions": no step ahead can be agreed with a rank gone
        if self.coordinator is not None:
            self.coordinator.publish_now("stop", alert)  # comes back to this rank too, through decisions.jsonl
        else:
            self.stop_now(alert)

    def stop_now(self, alert: Alert) -> None:
        """Stop at the next step boundary; if none comes within ``stop_grace`` s (the training thread waits in a
        collective for a dead rank), write the final ``stopped`` status and end the process (exit status 1)."""
        self.control.schedule("stop", alert)
        reason = f"stopped by mindwatch: {alert.get('message')}"
        grace = self.config.distributed.stop_grace
        threading.Thread(target=self._end_unless_stopped, args=(reason, grace), name="mindwatch-stop", daemon=True).start()

    def _end_unless_stopped(self, reason: str, grace: float) -> None:
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if self.monitor.state != "running":  # the training thread ended the run
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

    def close(self, state: str = "finished", error: str | None = None, reason: str | None = None) -> None:
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.rank == 0 and self.meta:
            self.meta["ended_at"] = time.time()
            self.meta["final_state"] = state
            self.write_meta()
        self.monitor.close(state, error, reason)


def bridge_sinks(config: MonitorConfig, layout: RunLayout, run_id: str, rank: int) -> list[Sink]:
    """The TensorBoard and Prometheus sinks the config switches on (imported only then)."""
    sinks: list[Sink] = []
    if config.tensorboard_enabled:
        from mindwatch.sinks.tensorboard import TensorBoardSink

        sinks.append(TensorBoardSink(layout.tensorboard(rank)))
    prom = config.prometheus
    if prom.enabled:
        try:
            from mindwatch.sinks.prometheus import PrometheusSink, local_rank
        except ImportError as e:
            log.warning("mindwatch: prometheus.enabled needs prometheus_client (pip install prometheus_client): %s", e)
        else:
            port = prom.port + local_rank()
            sinks.append(PrometheusSink(project=config.project, run=run_id, rank=rank, port=port, host=prom.host))
    return sinks


def agreed_run_id(config: MonitorConfig, parent: Path, rank: int, launch_key: str | None) -> str:
    """The run id all ranks of a launch share; a rank that cannot learn it records into a directory of its own."""
    propose = lambda: new_run_id(parent, config.run_name)  # noqa: E731
    try:
        return agree_run_id(parent, rank=rank, key=launch_key, propose=propose, timeout=config.distributed.rendezvous_timeout)
    except (RendezvousTimeout, OSError) as e:
        own = new_run_id(parent, f"{config.run_name or time.strftime('run_%Y%m%d_%H%M%S')}_rank{rank}")
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


def setup_logging(level: str) -> None:
    """Give the ``mindwatch`` logger a console handler unless the application configured one."""
    logger = logging.getLogger("mindwatch")
    logger.setLevel(level)
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)
