"""An exploding or spiking layer: its gradient norm (or its optimizer's moments) above ``factor`` x its own rolling
median.

Example::

    alerts: {layer_spike: {factor: 10, window: 20, warmup: 5, stats: [grad_norm, adam_v_norm]}}
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import Field

from mindwatch import metrics as vocab
from mindwatch.alerts.rules.base import LayerRule, RuleContext, RuleSpec, settings_from
from mindwatch.schema import RuleSettings
from mindwatch.units import format_number, format_times

#: The per-layer statistics a spike is judged on: the gradient norm and the optimizer's moments.
SPIKING_STATS = (vocab.GRAD_NORM, vocab.ADAM_M_NORM, vocab.ADAM_V_NORM)
if TYPE_CHECKING:
    SpikingStat = str
else:  # the names as a Literal: the error lists them
    SpikingStat = Literal[SPIKING_STATS]


class LayerSpikeSettings(RuleSettings):
    #: Which per-layer statistics are watched (the moments' only with an Adam-family optimizer).
    stats: list[SpikingStat] = Field(default_factory=lambda: list(SPIKING_STATS))
    #: A layer's statistic above ``factor`` x the median of its last ``window`` measured values.
    factor: float = Field(default=10.0, gt=1)
    window: int = Field(default=20, ge=3)
    #: Measured values of a layer before it is judged.
    warmup: int = Field(default=5, ge=1)
    count: int = Field(default=1, ge=1)


class LayerSpikeRule(LayerRule):
    """``<stat>/<layer>`` above ``factor`` x its rolling median (NaN/Inf belongs to the non-finite rule)."""

    name, stat = "layer_spike", "grad_norm"
    skip_overflow = True

    def __init__(
        self, settings: LayerSpikeSettings | None = None, *, rank: int = 0, stat: str = vocab.GRAD_NORM, **values: Any
    ) -> None:
        """``settings`` as ``alerts.layer_spike`` validated them; keywords (``LayerSpikeRule(factor=8)``) are
        validated the same way. ``stat``: the statistic this one watches (one of ``settings.stats``)."""
        s = settings_from(LayerSpikeSettings, settings, values)
        super().__init__(count=s.count, rank=rank, actions=s.actions)
        self.stat = stat
        self.factor, self.window, self.warmup = s.factor, s.window, s.warmup
        self.history = np.zeros((0, 0))
        self.seen = 0
        self.median = np.zeros(0)

    def judge(self, values: np.ndarray) -> np.ndarray:
        if self.history.shape[1] != len(values):
            self.history, self.seen = np.full((self.window, len(values)), np.nan), 0
        with np.errstate(invalid="ignore"):
            self.median = np.nanmedian(self.history, axis=0) if self.seen else np.full(len(values), np.nan)
            bad = (self.seen >= self.warmup) & np.isfinite(values) & (values > self.factor * self.median) & (self.median > 0)
        self.history[self.seen % self.window] = np.where(np.isfinite(values), values, np.nan)
        self.seen += 1
        return bad

    def threshold(self, j: int) -> float:
        return float(self.factor * self.median[j])

    def describe(self, layer: str, value: float, j: int) -> str:
        median = self.median[j]
        times = format_times(value / median, f"its rolling median {format_number(float(median))}")
        what = "gradient norm" if self.stat == vocab.GRAD_NORM else f"{self.stat.removesuffix('_norm')} norm"
        return f"layer {layer}: its {what} spiked to {format_number(value)}, {times} (limit {self.factor:g} x)"


def _build(s: LayerSpikeSettings, ctx: RuleContext) -> list[LayerSpikeRule]:
    return [LayerSpikeRule(s, rank=ctx.rank, stat=stat) for stat in s.stats]


SPEC = RuleSpec(
    "layer_spike",
    LayerSpikeSettings,
    _build,
    doc="a layer's gradient norm (or its Adam moments' norm, `stats`) above `factor` x its own rolling median: it "
    "explodes (per-layer statistics)",
)
