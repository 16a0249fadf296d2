"""Host or device memory close to the total.

Example::

    alerts: {memory: {fraction: 0.9, device_total_gb: 64}}
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import Field

from mindwatch.alerts.alert import Alert
from mindwatch.alerts.rules.base import Record, RuleBase, RuleContext, RuleSpec, settings_from, value_of
from mindwatch.schema import RuleSettings
from mindwatch.system import host_memory_total_gb


class MemorySettings(RuleSettings):
    #: Fires when host or device memory in use is above this fraction of the total.
    fraction: float = Field(default=0.9, gt=0, le=1)
    #: Device memory total in GB when the device does not report it.
    device_total_gb: float | None = Field(default=None, gt=0)


class MemoryRule(RuleBase):
    """Host (``host_rss_gb``) or device (``device_mem_gb``) memory above ``fraction`` of the total."""

    name = "memory"

    def __init__(
        self, settings: MemorySettings | None = None, *, host_total_gb: float | None = None, rank: int = 0, **values: Any
    ) -> None:
        """``settings`` as ``alerts.memory`` validated them; keywords (``MemoryRule(fraction=0.8)``) are validated the
        same way. ``host_total_gb``: the host's memory (the settings' ``device_total_gb`` is the device's)."""
        s = settings_from(MemorySettings, settings, values)
        super().__init__(rank, s.actions)
        self.fraction = s.fraction
        self.totals = {"host_rss_gb": host_total_gb, "device_mem_gb": s.device_total_gb}

    def check(self, rec: Record) -> list[Alert]:
        out = []
        for metric, total in self.totals.items():
            v = value_of(rec, metric)
            if v is None or not total or not math.isfinite(v) or v <= self.fraction * total:
                continue
            where = "host" if metric == "host_rss_gb" else "device"
            msg = f"{where} memory at {v:.2f} GB of {total:.2f} GB ({100 * v / total:.0f} %, limit {100 * self.fraction:.0f} %)"
            out.append(self._alert(rec, msg, metric=metric, value=v, threshold=self.fraction * total))
        return out


def _build(s: MemorySettings, ctx: RuleContext) -> list[MemoryRule]:
    device = s.model_copy(update={"device_total_gb": s.device_total_gb or ctx.device_total_gb})  # what the device reports
    return [MemoryRule(device, host_total_gb=host_memory_total_gb(), rank=ctx.rank)]


SPEC = RuleSpec(
    "memory", MemorySettings, _build, doc="host (`host_rss_gb`) or device (`device_mem_gb`) memory above `fraction` of the total"
)
