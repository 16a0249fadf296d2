"""An update ratio that is too large: the step moved a layer's weights by more than a share of their norm.

Example::

    alerts: {layer_update_large: {limit: 0.5}}
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import Field

from mindwatch.alerts.rules.base import LayerRule, RuleContext, RuleSpec, settings_from
from mindwatch.schema import RuleSettings
from mindwatch.units import format_share


class LayerUpdateLargeSettings(RuleSettings):
    #: ``||w_after - w_before|| / ||w_before||`` above this: one step moved the weights by half their norm.
    limit: float = Field(default=0.5, gt=0)
    count: int = Field(default=1, ge=1)


class LayerUpdateLargeRule(LayerRule):
    """``update_ratio/<layer>`` above ``limit`` for ``count`` measured steps in a row."""

    name, stat = "layer_update_large", "update_ratio"

    def __init__(self, settings: LayerUpdateLargeSettings | None = None, *, rank: int = 0, **values: Any) -> None:
        """``settings`` as ``alerts.layer_update_large`` validated them; keywords (``LayerUpdateLargeRule(limit=0.2)``) are
        validated the same way."""
        s = settings_from(LayerUpdateLargeSettings, settings, values)
        super().__init__(count=s.count, rank=rank, actions=s.actions)
        self.limit = s.limit

    def judge(self, values: np.ndarray) -> np.ndarray:
        return np.isfinite(values) & (values > self.limit)

    def threshold(self, j: int) -> float:
        return self.limit

    def describe(self, layer: str, value: float, j: int) -> str:
        return (
            f"layer {layer}: one step changed its weights by {format_share(value, 'their norm')} (limit {100 * self.limit:g} %)"
        )


def _build(s: LayerUpdateLargeSettings, ctx: RuleContext) -> list[LayerUpdateLargeRule]:
    return [LayerUpdateLargeRule(s, rank=ctx.rank)]


SPEC = RuleSpec(
    "layer_update_large",
    LayerUpdateLargeSettings,
    _build,
    doc="a layer's update ratio above `limit`: one step moved its weights too far (per-layer statistics)",
)
