"""An exploding or spiking layer: its gradient norm (or its optimizer's moments) above ``factor`` x its own rolling
median.

Example::

    alerts: {layer_spike: {factor: 10, window: 20, warmup: 5, stats: [grad_norm, adam_v_norm]}}
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from mindwatch import metrics as vocab
from mindwatch.alerts.rules.base import LayerMedianRule, LayerMedianSettings, RuleSpec
from mindwatch.units import format_number, format_times

#: The per-layer statistics a spike is judged on: the gradient norm and the optimizer's moments.
SPIKING_STATS = (vocab.GRAD_NORM, vocab.ADAM_M_NORM, vocab.ADAM_V_NORM)
if TYPE_CHECKING:
    SpikingStat = str
else:  # the names as a Literal: the error lists them
    SpikingStat = Literal[SPIKING_STATS]


class LayerSpikeSettings(LayerMedianSettings):
    #: Which per-layer statistics are watched (the moments' only with an Adam-family optimizer).
    stats: list[SpikingStat] = Field(default_factory=lambda: list(SPIKING_STATS))


class LayerSpikeRule(LayerMedianRule):
    """``<stat>/<layer>`` above ``factor`` x its rolling median (NaN/Inf belongs to the non-finite rule)."""

    name, stat = "layer_spike", vocab.GRAD_NORM
    settings_kind = LayerSpikeSettings

    def describe(self, layer: str, value: float, j: int) -> str:
        median = self.median[j]
        times = format_times(value / median, f"its rolling median {format_number(float(median))}")
        return f"layer {layer}: its {self.stat_words} spiked to {format_number(value)}, {times} (limit {self.factor:g} x)"


SPEC = RuleSpec(
    "layer_spike",
    LayerSpikeSettings,
    LayerSpikeRule.each_stat,
    doc="a layer's gradient norm (or its Adam moments' norm, `stats`) above `factor` x its own rolling median: it "
    "explodes (per-layer statistics)",
)
