"""The sink that appends each alert to ``alerts.jsonl``, logs it, and keeps the rank's status in step with stalls.

Example::

    Monitor([writer, AlertLog(writer), ...])
    monitor.alert(alert)     # on the worker: one line in alerts.jsonl and one console line
"""

from __future__ import annotations

import logging
from typing import Any

from mindwatch.alerts.alert import LOG_LEVELS, RESUMED, STALL, Alert, format_alert
from mindwatch.store.sink import BaseSink
from mindwatch.store.states import FINAL_STATES
from mindwatch.store.writer import RunWriter

log = logging.getLogger("mindwatch")


class AlertLog(BaseSink):
    """Sink that appends each alert to ``alerts.jsonl``, logs it, and keeps the status in step with stalls.

    A ``stall`` alert sets the rank's status to ``stalled``, ``resumed`` back to ``running``
    (both written at once, on the worker thread, so the heartbeat file has one writer).
    """

    def __init__(self, writer: RunWriter, logger: logging.Logger = log) -> None:
        self.writer = writer
        self.logger = logger
        self.count = 0

    def alert(self, alert: Alert) -> None:
        self.count += 1
        self.writer.append_alert(alert)
        self.logger.log(LOG_LEVELS.get(str(alert.get("severity")), logging.WARNING), format_alert(alert))
        rule = alert.get("rule")
        if rule in (STALL, RESUMED) and self.writer.state not in FINAL_STATES:
            self.writer.state = "stalled" if rule == STALL else "running"
            self.writer.flush()

    def write(self, records: list[dict[str, Any]]) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self, state: str, error: str | None = None, reason: str | None = None) -> None:
        pass
