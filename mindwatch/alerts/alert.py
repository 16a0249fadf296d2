"""Alerts: the record every rule emits, its severity and console line, and the per-rule cooldown.

Example::

    alert = make_alert("spike", step=120, rank=0, metric="grad_norm", value=45.2, threshold=12.0,
                       message="grad_norm 45.2 > 3 x median 4.0", actions=["lr_backoff"])
    monitor.alert(alert)     # any thread; every sink with an ``alert()`` method receives it on the worker

An alert is a plain dict with the ``alerts.jsonl`` contract fields (docs/architecture.md):
``t, step, rank, rule, metric, value, threshold, severity, message, actions``; rules may add
keys of their own (readers ignore unknown keys). ``severity`` is ``info``, ``warning`` or ``error``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

log = logging.getLogger("mindwatch")

Alert = dict[str, Any]

SEVERITIES = ("info", "warning", "error")
LOG_LEVELS = {"info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}

#: Rules the stall watchdog emits; they also move the rank's status between ``stalled`` and ``running``.
STALL, RESUMED = "stall", "resumed"


def make_alert(
    rule: str,
    *,
    step: int | None,
    rank: int,
    message: str,
    metric: str | None = None,
    value: float | None = None,
    threshold: float | None = None,
    severity: str = "warning",
    actions: Iterable[str] = (),
    t: float | None = None,
    **extra: Any,
) -> Alert:
    """One alert in the ``alerts.jsonl`` contract shape; ``extra`` keys are appended."""
    return {
        "t": time.time() if t is None else t,
        "step": step,
        "rank": rank,
        "rule": rule,
        "metric": metric,
        "value": value,
        "threshold": threshold,
        "severity": severity,
        "message": message,
        "actions": list(actions),
        **extra,
    }


def severity_at_least(alert: Alert, minimum: str) -> bool:
    """Whether ``alert`` is at least as severe as ``minimum`` (``info`` < ``warning`` < ``error``)."""
    rank = {s: i for i, s in enumerate(SEVERITIES)}
    return rank.get(str(alert.get("severity")), 1) >= rank.get(minimum, 0)


def format_alert(alert: Alert) -> str:
    """The console line of an alert: ``mindwatch ALERT [spike] rank 0 step 120: ... (actions: stop)``."""
    actions = alert.get("actions") or []
    todo = f" (actions: {', '.join(actions)})" if actions else ""
    return f"mindwatch ALERT [{alert.get('rule')}] rank {alert.get('rank')} {step_text(alert)}: {alert.get('message')}{todo}"


def step_text(alert: Alert) -> str:
    """``step 120``, or ``before step 1`` for an alert raised before any step ended."""
    step = alert.get("step")
    return "before step 1" if step is None else f"step {step}"


class Cooldown:
    """Lets a key (rule, metric) fire at most once per ``secs``; counts what it held back.

    Example::

        cool = Cooldown(300)
        if cool.allow(("spike", "loss")):
            emit(...)
    """

    def __init__(self, secs: float, clock: Any = time.monotonic) -> None:
        self.secs = secs
        self._clock = clock
        self._last: dict[Any, float] = {}
        #: Alerts held back per key since it last fired.
        self.suppressed: dict[Any, int] = {}

    def allow(self, key: Any) -> bool:
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self.secs:
            self.suppressed[key] = self.suppressed.get(key, 0) + 1
            return False
        self._last[key] = now
        return True

    def take_suppressed(self, key: Any) -> int:
        """How many alerts of ``key`` were held back since it last fired (and reset the count)."""
        return self.suppressed.pop(key, 0)

    def admit(self, alert: Alert) -> bool:
        """Whether ``alert`` may go out now (its key: rule and metric); if so it gets ``suppressed``, the
        count held back since its key last fired."""
        key = (alert.get("rule"), alert.get("metric"))
        if not self.allow(key):
            return False
        if held := self.take_suppressed(key):
            alert["suppressed"] = held
        return True
