"""Weights that do not change: a layer's update ratio below a floor for ``count`` measured steps in a row.

Example::

    alerts: {layer_frozen: {floor: 1.0e-8, count: 3}}
"""

from __future__ import annotations

from pydantic import Field

from mindwatch.alerts.rules.base import LayerFloorRule, RuleContext, RuleSpec
from mindwatch.schema import RuleSettings


class LayerFrozenSettings(RuleSettings):
    #: ``||w_after - w_before|| / ||w_before||`` below this: the step left the layer as it was.
    floor: float = Field(default=1e-8, gt=0)
    count: int = Field(default=3, ge=1)


class LayerFrozenRule(LayerFloorRule):
    """``update_ratio/<layer>`` below ``floor`` for ``count`` measured steps (loss-scale overflow steps skipped)."""

    name, stat = "layer_frozen", "update_ratio"
    meaning = "its weights are not changing"

    def __init__(self, *, floor: float = 1e-8, count: int = 3, rank: int = 0, actions=()) -> None:
        super().__init__(floor=floor, count=count, rank=rank, actions=actions)


def _build(s: LayerFrozenSettings, ctx: RuleContext) -> list[LayerFrozenRule]:
    return [LayerFrozenRule(floor=s.floor, count=s.count, rank=ctx.rank, actions=s.actions)]


SPEC = RuleSpec(
    "layer_frozen",
    LayerFrozenSettings,
    _build,
    doc="a layer's update ratio below `floor` for `count` measured steps: its weights are not changing (per-layer statistics)",
)
