"""A vanishing layer: its gradient norm below a floor for ``count`` measured steps in a row.

Example::

    alerts: {layer_vanishing: {floor: 1.0e-7, count: 3}}
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from mindwatch.alerts.rules.base import LayerFloorRule, RuleContext, RuleSpec, settings_from
from mindwatch.schema import RuleSettings


class LayerVanishingSettings(RuleSettings):
    #: A layer whose gradient norm is below this is not learning (MindInsight's "gradient vanishing" watchpoint).
    floor: float = Field(default=1e-7, gt=0)
    #: Measured steps in a row (``layers.every`` apart) before it fires.
    count: int = Field(default=3, ge=1)


class LayerVanishingRule(LayerFloorRule):
    """``grad_norm/<layer>`` below ``floor`` for ``count`` measured steps in a row."""

    name, stat = "layer_vanishing", "grad_norm"
    meaning = "its gradient vanished"

    def __init__(self, settings: LayerVanishingSettings | None = None, *, rank: int = 0, **values: Any) -> None:
        """``settings`` as ``alerts.layer_vanishing`` validated them; keywords (``LayerVanishingRule(floor=1e-9)``) are
        validated the same way."""
        s = settings_from(LayerVanishingSettings, settings, values)
        super().__init__(floor=s.floor, count=s.count, rank=rank, actions=s.actions)


def _build(s: LayerVanishingSettings, ctx: RuleContext) -> list[LayerVanishingRule]:
    return [LayerVanishingRule(s, rank=ctx.rank)]


SPEC = RuleSpec(
    "layer_vanishing",
    LayerVanishingSettings,
    _build,
    doc="a layer's gradient norm below `floor` for `count` measured steps in a row (per-layer statistics)",
)
