"""Weights that do not change: a layer's update ratio below a floor for ``count`` measured steps in a row.

Example::

    alerts: {layer_frozen: {floor: 1.0e-8, count: 3}}
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from mindwatch.alerts.rules.base import LayerFloorRule, RuleContext, RuleSpec, settings_from
from mindwatch.schema import RuleSettings


class LayerFrozenSettings(RuleSettings):
    #: ``||w_after - w_before|| / ||w_before||`` below this: the step left the layer as it was.
    floor: float = Field(default=1e-8, gt=0)
    count: int = Field(default=3, ge=1)


class LayerFrozenRule(LayerFloorRule):
    """``update_ratio/<layer>`` below ``floor`` for ``count`` measured steps (loss-scale overflow steps skipped)."""

    name, stat = "layer_frozen", "update_ratio"
    meaning = "its weights are not changing"

    def __init__(self, settings: LayerFrozenSettings | None = None, *, rank: int = 0, **values: Any) -> None:
        """``settings`` as ``alerts.layer_frozen`` validated them; keywords (``LayerFrozenRule(floor=1e-9)``) are
        validated the same way."""
        s = settings_from(LayerFrozenSettings, settings, values)
        super().__init__(floor=s.floor, count=s.count, rank=rank, actions=s.actions)


def _build(s: LayerFrozenSettings, ctx: RuleContext) -> list[LayerFrozenRule]:
    return [LayerFrozenRule(s, rank=ctx.rank)]


SPEC = RuleSpec(
    "layer_frozen",
    LayerFrozenSettings,
    _build,
    doc="a layer's update ratio below `floor` for `count` measured steps: its weights are not changing (per-layer statistics)",
)
