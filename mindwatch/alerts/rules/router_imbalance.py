"""A MoE layer whose routing turns lopsided: ``moe_imbalance/<layer>`` above ``factor`` x its own rolling median.

Example::

    alerts: {router_imbalance: {factor: 1.5, window: 20, warmup: 5}}

``moe_imbalance/<layer>`` is the largest expert's share of a layer's routed tokens x the experts (1: balanced; the
number of experts: one expert takes them all). Each layer settles where its router and its load-balancing put it; a
sudden rise above its own recent values means the router is piling tokens onto a few experts (a router spike, often
before a loss spike), whatever level the layer ran at. ``expert_collapse`` judges the shares against fixed bounds; this
rule judges the change.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from mindwatch import metrics as vocab
from mindwatch.alerts.alert import Alert
from mindwatch.alerts.rules.base import LayerMedianRule, LayerMedianSettings, Record, RuleContext, RuleSpec, value_of
from mindwatch.units import format_number, format_times

_PREFIX = f"{vocab.MOE_IMBALANCE}/"


class RouterImbalanceSettings(LayerMedianSettings):
    #: The limit: ``factor`` x the median of the layer's last ``window`` measured imbalances (at most the experts).
    factor: float = Field(default=1.5, gt=1)


class RouterImbalanceRule(LayerMedianRule):
    """``moe_imbalance/<layer>`` above ``factor`` x its rolling median for ``count`` measured steps in a row."""

    name, stat = "router_imbalance", vocab.MOE_IMBALANCE
    settings_kind = RouterImbalanceSettings

    def check(self, rec: Record) -> list[Alert]:
        """Each ``moe_imbalance/<layer>`` of the record (a MoE layer's is in the metrics, not in a layer row)."""
        found = {key[len(_PREFIX) :]: value_of(rec, key) for key in rec if key.startswith(_PREFIX)}
        layers = tuple(sorted(layer for layer, v in found.items() if v is not None))
        if not layers:
            return []
        return self.judge_layers(rec, layers, np.array([found[layer] for layer in layers], np.float64))

    def describe(self, layer: str, value: float, j: int) -> str:
        median = self.median[j]
        times = format_times(value / median, f"its rolling median {format_number(float(median))}")
        return (
            f"MoE layer {layer}: its routing turned lopsided: imbalance {format_number(value)} (the largest expert's "
            f"share x the experts; 1 is balanced), {times} (limit {self.factor:g} x)"
        )


def _build(s: RouterImbalanceSettings, ctx: RuleContext) -> list[RouterImbalanceRule]:
    return [RouterImbalanceRule(s, rank=ctx.rank)]


SPEC = RuleSpec(
    "router_imbalance",
    RouterImbalanceSettings,
    _build,
    doc="a MoE layer's `moe_imbalance/<layer>` (the largest expert's share x the experts) above `factor` x its own "
    "rolling median: the router piles tokens onto a few experts",
)
