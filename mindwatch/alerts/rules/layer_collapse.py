"""A collapsing optimizer state: a layer's Adam moment norm below 1/``factor`` of its own rolling median.

Example::

    alerts: {layer_collapse: {factor: 10, window: 20, warmup: 5, stats: [adam_v_norm]}}

Adam divides a layer's step by the square root of its second moment ``v``: when ``v`` falls far below where it
was, the next gradient of the old size moves the layer by many times its usual step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from mindwatch import metrics as vocab
from mindwatch.alerts.rules.base import LayerMedianRule, LayerMedianSettings, RuleSpec
from mindwatch.units import format_number, format_times

#: The per-layer statistics a collapse is judged on: the optimizer's moments (an Adam-family optimizer's).
COLLAPSING_STATS = (vocab.ADAM_M_NORM, vocab.ADAM_V_NORM)
if TYPE_CHECKING:
    CollapsingStat = str
else:  # the names as a Literal: the error lists them
    CollapsingStat = Literal[COLLAPSING_STATS]


class LayerCollapseSettings(LayerMedianSettings):
    #: Which moments are watched: ``v``, what divides the step, by default; ``adam_m_norm`` warns of falling gradients.
    stats: list[CollapsingStat] = Field(default_factory=lambda: [vocab.ADAM_V_NORM])


class LayerCollapseRule(LayerMedianRule):
    """``<stat>/<layer>`` below 1/``factor`` of its rolling median (NaN/Inf belongs to the non-finite rule)."""

    name, stat = "layer_collapse", vocab.ADAM_V_NORM
    rises = False
    settings_kind = LayerCollapseSettings

    def describe(self, layer: str, value: float, j: int) -> str:
        median = format_number(float(self.median[j]))
        fall = f"{format_times(self.median[j] / value)} below" if value > 0 else "down from"
        return (
            f"layer {layer}: its {self.stat_words} collapsed to {format_number(value)}, {fall} its rolling median "
            f"{median} (limit: the median / {self.factor:g})"
        )


SPEC = RuleSpec(
    "layer_collapse",
    LayerCollapseSettings,
    LayerCollapseRule.each_stat,
    doc="a layer's Adam second moment norm (or first, `stats`) below its own rolling median / `factor`: it collapses, "
    "and Adam's step on that layer grows (per-layer statistics)",
)
