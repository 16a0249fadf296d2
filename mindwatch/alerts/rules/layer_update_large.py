"""An update ratio that is too large: the step moved a layer's weights by more than a share of their norm.

Example::

    alerts: {layer_update_large: {limit: 0.5}}
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from mindwatch.alerts.rules.base import LayerRule, RuleContext, RuleSpec
from mindwatch.schema import RuleSettings


class LayerUpdateLargeSettings(RuleSettings):
    #: ``||w_after - w_before|| / ||w_before||`` above this: one step moved the weights by half their norm.
    limit: float = Field(default=0.5, gt=0)
    count: int = Field(default=1, ge=1)


class LayerUpdateLargeRule(LayerRule):
    """``update_ratio/<layer>`` above ``limit`` for ``count`` measured steps in a row."""

    name, stat = "layer_update_large", "update_ratio"

    def __init__(self, *, limit: float = 0.5, count: int = 1, rank: int = 0, actions=()) -> None:
        super().__init__(count=count, rank=rank, actions=actions)
        self.limit = limit

    def judge(self, values: np.ndarray) -> np.ndarray:
        return np.isfinite(values) & (values > self.limit)

    def threshold(self, j: int) -> float:
        return self.limit

    def describe(self, layer: str, value: float, j: int) -> str:
        return f"layer {layer}: one step changed its weights by {100 * value:.1f} % of their norm (limit {100 * self.limit:g} %)"


def _build(s: LayerUpdateLargeSettings, ctx: RuleContext) -> list[LayerUpdateLargeRule]:
    return [LayerUpdateLargeRule(limit=s.limit, count=s.count, rank=ctx.rank, actions=s.actions)]


SPEC = RuleSpec(
    "layer_update_large",
    LayerUpdateLargeSettings,
    _build,
    doc="a layer's update ratio above `limit`: one step moved its weights too far (per-layer statistics)",
)
