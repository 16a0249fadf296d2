"""A vanishing layer: its gradient norm below a floor for ``count`` measured steps in a row.

Example::

    alerts: {layer_vanishing: {floor: 1.0e-7, count: 3}}
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from mindwatch.alerts.rules.base import LayerRule, RuleContext, RuleSpec
from mindwatch.schema import RuleSettings


class LayerVanishingSettings(RuleSettings):
    #: A layer whose gradient norm is below this is not learning (MindInsight's "gradient vanishing" watchpoint).
    floor: float = Field(default=1e-7, gt=0)
    #: Measured steps in a row (``layers.every`` apart) before it fires.
    count: int = Field(default=3, ge=1)


class LayerVanishingRule(LayerRule):
    """``grad_norm/<layer>`` below ``floor`` for ``count`` measured steps in a row."""

    name, stat = "layer_vanishing", "grad_norm"
    skip_overflow = True

    def __init__(self, *, floor: float = 1e-7, count: int = 3, rank: int = 0, actions=()) -> None:
        super().__init__(count=count, rank=rank, actions=actions)
        self.floor = floor

    def judge(self, values: np.ndarray) -> np.ndarray:
        return values < self.floor

    def threshold(self, j: int) -> float:
        return self.floor

    def describe(self, layer: str, value: float, j: int) -> str:
        return f"layer {layer}: its gradient vanished (norm {value:.3g}, below {self.floor:g} for {self.count} measured steps)"


def _build(s: LayerVanishingSettings, ctx: RuleContext) -> list[LayerVanishingRule]:
    return [LayerVanishingRule(floor=s.floor, count=s.count, rank=ctx.rank, actions=s.actions)]


SPEC = RuleSpec(
    "layer_vanishing",
    LayerVanishingSettings,
    _build,
    doc="a layer's gradient norm below `floor` for `count` measured steps in a row (per-layer statistics)",
)
