"""A person's requests (``mindwatch stop|checkpoint|lr|set|batch``, the dashboard's buttons) into the training.

Example::

    inbox = RequestInbox(run_dir, rank=0, speaks=True, emit=monitor.alert, control=control, last_step=lambda: 812)
    monitor.sinks.append(inbox)       # the worker thread reads control/requests/ about every POLL_SECS

Runs on the worker thread, as a sink (not a ticker: an idle single-rank worker keeps its long sleeps).
Rank 0 (the rank that speaks for the run) takes each request: it answers ``filed``, raises a ``request``
alert (who asked, the reason) and, once that alert is in ``alerts.jsonl``, files its action on the
:class:`~mindwatch.monitor.control.Control`, which carries it to every rank like a rule's request; the
``intervention`` alert of the action done answers ``taken`` (or ``failed``). A ``set`` request changes a
setting of this process, so every rank's inbox applies it (from its next step); rank 0 answers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mindwatch.alerts.alert import Alert, make_alert
from mindwatch.monitor.control import Control
from mindwatch.store.requests import pending_requests, write_answer
from mindwatch.store.sink import BaseSink

log = logging.getLogger("mindwatch")

#: How often the worker looks for new requests while training.
POLL_SECS = 0.3

#: The Control action each request asks for (``set`` is applied by the inbox itself).
ACTION_OF = {
    "stop": "stop",
    "checkpoint": "checkpoint",
    "lr": "lr_backoff",
    "rewind": "rewind",
    "batch": "resize_batch",
    "profile": "profile",
}

#: ``set``'s settings: key -> a function that applies the new value (raises ValueError when it cannot).
LiveSettings = dict[str, Callable[[Any], None]]


class RequestInbox(BaseSink):
    """Reads ``control/requests/`` on the worker thread. See the module docstring."""

    def __init__(
        self,
        run_dir: Path,
        *,
        rank: int,
        speaks: bool,
        emit: Callable[[Alert], None],
        control: Control,
        last_step: Callable[[], int | None],
        settings: LiveSettings | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.rank = rank
        self.speaks = speaks
        self.emit = emit
        self.control = control
        self.last_step = last_step
        #: ``set``'s keys; the adapter and the rule engine add theirs.
        self.settings: LiveSettings = settings if settings is not None else {}
        self._started = time.time() - 1.0  # a request filed just before this attempt's status said "running"
        self._seen: set[str] = set()
        self._next = 0.0

    def write(self, records: list[dict[str, Any]]) -> None:
        self.poll()

    def flush(self) -> None:
        self.poll()

    def poll(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if now < self._next:
            return
        self._next = now + POLL_SECS
        for req in pending_requests(self.run_dir, since=self._started):
            if req["id"] not in self._seen:
                self._seen.add(req["id"])
                self._take(req)

    def _take(self, req: dict[str, Any]) -> None:
        action, who, reason = req.get("action"), req.get("requested_by"), req.get("reason")
        step = self.last_step()
        if action == "set":
            self._set(req, step)
            return
        if not self.speaks or action not in ACTION_OF:
            return
        what = f"lr x {req.get('factor'):g}" if action == "lr" else str(action)
        extra: dict[str, Any] = {"lr_factor": req["factor"]} if action == "lr" else {}
        if action == "rewind" and isinstance(req.get("to_step"), int):
            extra["to_step"] = req["to_step"]
            what = f"rewind to step {req['to_step']} or before"
        if action == "batch":
            what, extra = f"batch size {req.get('size')}", {"batch_size": req.get("size")}
        if action == "profile" and isinstance(req.get("steps"), int):
            what, extra = f"a profile of {req['steps']} steps", {"profile_steps": req["steps"]}
        alert = make_alert(
            "request",
            step=step,
            rank=self.rank,
            message=f"{what} requested by {who}" + (f": {reason}" if reason else ""),
            severity="warning" if action == "stop" else "info",
            actions=[ACTION_OF[action]],
            requested_by=who,
            reason=reason,
            request=req["id"],
            **extra,
        )
        self._answer(req["id"], state="filed", step=step, message=f"filed after step {step}")
        self.emit(alert)  # its action is filed when the alert comes back through alert(): after alerts.jsonl has it

    def _set(self, req: dict[str, Any], step: int | None) -> None:
        key, value = str(req.get("key")), req.get("value")
        apply = self.settings.get(key)
        try:
            if apply is None:
                raise ValueError(f"{key} is not a setting of this training (known: {', '.join(sorted(self.settings))})")
            apply(value)
        except ValueError as e:
            if self.speaks:
                self._answer(req["id"], state="failed", step=step, error=str(e), message=f"set {key} failed: {e}")
            return
        if not self.speaks:
            return
        who, reason = req.get("requested_by"), req.get("reason")
        message = f"set {key}={value} from step {(step or 0) + 1}, requested by {who}" + (f": {reason}" if reason else "")
        self.emit(
            make_alert(
                "request",
                step=step,
                rank=self.rank,
                message=message,
                severity="info",
                requested_by=who,
                reason=reason,
                request=req["id"],
                key=key,
                value=value,
            )
        )
        self._answer(req["id"], state="taken", step=step, message=message)

    def alert(self, alert: Alert) -> None:
        if not self.speaks or alert.get("rank") != self.rank or not alert.get("request"):
            return
        if alert.get("rule") == "request" and alert.get("actions"):
            self.control.request(alert)
        elif alert.get("rule") == "intervention":
            failed = alert.get("error") is not None
            self._answer(
                alert["request"],
                state="failed" if failed else "taken",
                step=alert.get("first_step", alert.get("step")),  # a profile's answer: its first profiled step
                message=alert.get("message"),
                error=alert.get("error"),
            )

    def _answer(self, request_id: str, **fields: Any) -> None:
        try:
            write_answer(self.run_dir, request_id, rank=self.rank, **fields)
        except OSError as e:
            log.warning("mindwatch: cannot answer request %s (%s)", request_id, e)
