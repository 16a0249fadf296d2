"""Console summary: one line every ``interval`` seconds, on the worker thread.

Example output::

    mindwatch step 120 | loss 2.3100 | lr 1.00e-04 | grad_norm 0.93 | 1,234 tok/s | 12.3 ms/step (data 3%)
"""

from __future__ import annotations

import logging
import time
from typing import Any

log = logging.getLogger("mindwatch")


def format_summary(rec: dict[str, Any]) -> str:
    """The one-line summary of a record."""
    parts = [f"step {rec.get('step')}"]

    def num(key: str, fmt: str, label: str | None = None, scale: float = 1.0, suffix: str = "") -> None:
        v = rec.get(key)
        if isinstance(v, (int, float)):
            parts.append(f"{label or key} {format(v * scale, fmt)}{suffix}")

    num("loss", ".4f")
    num("lr", ".2e")
    num("grad_norm", ".3g")
    num("loss_scale", ".0f")
    num("tokens_per_second", ",.0f", "tok/s")
    num("samples_per_second", ",.1f", "samples/s")
    st, dt = rec.get("step_time"), rec.get("data_time")
    if isinstance(st, (int, float)) and st > 0:
        data = f" (data {100 * dt / st:.0f}%)" if isinstance(dt, (int, float)) else ""
        parts.append(f"{st * 1000:.1f} ms/step{data}")
    num("host_rss_gb", ".2f", "rss", suffix=" GB")
    num("device_mem_gb", ".2f", "device", suffix=" GB")
    return "mindwatch " + " | ".join(parts)


class ConsoleSummary:
    """Logs :func:`format_summary` of the newest record at most every ``interval`` seconds."""

    def __init__(self, interval: float = 30.0, logger: logging.Logger = log) -> None:
        self.interval = interval
        self.logger = logger
        self._last = -1e18
        self._newest: dict[str, Any] | None = None

    def write(self, records: list[dict[str, Any]]) -> None:
        self._newest = records[-1]
        now = time.monotonic()
        if now - self._last >= self.interval:
            self._last = now
            self.logger.info(format_summary(self._newest))

    def flush(self) -> None:
        pass

    def close(self, state: str, error: str | None = None, reason: str | None = None) -> None:
        if self._newest is not None:
            self.logger.info(format_summary(self._newest))
        why = f": {error or reason}" if (error or reason) else ""
        self.logger.info("mindwatch: run %s%s", state, why)
