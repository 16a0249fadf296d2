"""A mixture of experts whose router starves an expert or sends one most of the tokens.

Example::

    alerts: {expert_collapse: {floor: 0.1, ceiling: 0.5, count: 3}}

A MoE layer's ``expert_load/<layer>/<e>`` (``RouterStats``, every ``moe.every`` steps: docs/layers.md) is each expert's
share of the layer's routed token choices; balanced, each is 1/experts. An expert whose share stays below ``floor`` x
1/experts is dead weight (the router no longer sends it tokens, so it no longer learns), and one above ``ceiling`` takes
what the others should: both waste the layer's width and often come before loss spikes. A layer is judged on its
measured steps; ``count`` of them in a row with an expert out of bounds raise one warning naming the layer and those
experts, and it is raised again only after the layer recovers (a measured step with every expert in bounds).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from mindwatch import metrics as vocab
from mindwatch.alerts.alert import Alert
from mindwatch.alerts.rules.base import Record, RuleBase, RuleContext, RuleSpec, settings_from, value_of
from mindwatch.schema import RuleSettings
from mindwatch.units import format_number

_PREFIX = f"{vocab.EXPERT_LOAD}/"


class ExpertCollapseSettings(RuleSettings):
    #: An expert is starved below ``floor`` x 1/experts of the layer's routed choices (0.1 of 4 experts: 2.5 %).
    floor: float = Field(default=0.1, ge=0, lt=1)
    #: An expert takes too much above this share of the layer's routed choices.
    ceiling: float = Field(default=0.5, gt=0, le=1)
    #: Measured steps in a row with an expert out of bounds before it fires.
    count: int = Field(default=3, ge=1)


class ExpertCollapseRule(RuleBase):
    """A MoE layer with an expert below ``floor``/experts or above ``ceiling`` for ``count`` measured steps in a row."""

    name = "expert_collapse"

    def __init__(self, settings: ExpertCollapseSettings | None = None, *, rank: int = 0, **values: Any) -> None:
        s = settings_from(ExpertCollapseSettings, settings, values)
        super().__init__(rank, s.actions)
        self.settings = s
        #: Each layer's measured steps in a row with an expert out of bounds (past ``count``: fired, until it recovers).
        self._run: dict[str, int] = {}

    def check(self, rec: Record) -> list[Alert]:
        layers: dict[str, dict[int, float]] = {}
        for key in rec:
            if key.startswith(_PREFIX):
                layer, _, expert = key[len(_PREFIX) :].rpartition("/")
                v = value_of(rec, key)
                if layer and expert.isdigit() and v is not None:
                    layers.setdefault(layer, {})[int(expert)] = v
        out = []
        for layer, shares in layers.items():
            starved, flooded = self._out_of_bounds(shares)
            run = self._run.get(layer, 0) + 1 if starved or flooded else 0
            self._run[layer] = run
            if run == self.settings.count:
                out.append(self._collapse(rec, layer, shares, starved, flooded))
        return out

    def _out_of_bounds(self, shares: dict[int, float]) -> tuple[list[int], list[int]]:
        """The experts below the floor and those above the ceiling."""
        s = self.settings
        floor = s.floor / len(shares)
        starved = [e for e, v in sorted(shares.items()) if v < floor]
        flooded = [e for e, v in sorted(shares.items()) if v > s.ceiling]
        return starved, flooded

    def _collapse(self, rec: Record, layer: str, shares: dict[int, float], starved: list[int], flooded: list[int]) -> Alert:
        s, experts = self.settings, len(shares)
        pct = lambda e: f"expert {e} {format_number(100 * shares[e])} %"  # noqa: E731
        parts = []
        if starved:
            parts.append(
                f"{', '.join(pct(e) for e in starved)} (below {format_number(100 * s.floor / experts)} %: the router "
                f"starves {'it' if len(starved) == 1 else 'them'})"
            )
        if flooded:
            parts.append(f"{', '.join(pct(e) for e in flooded)} (above {format_number(100 * s.ceiling)} %)")
        msg = (
            f"MoE layer {layer}: its routing collapsed for {s.count} measured steps: {'; '.join(parts)} of the routed "
            f"tokens ({experts} experts, {format_number(100 / experts)} % each when balanced)"
        )
        worst = min(starved, key=shares.__getitem__) if starved else max(flooded, key=shares.__getitem__)
        return self._alert(
            rec,
            msg,
            metric=f"{vocab.EXPERT_LOAD}/{layer}",
            value=shares[worst],
            threshold=s.floor / experts if starved else s.ceiling,
            layer=layer,
            experts=sorted(starved + flooded),
        )


def _build(s: ExpertCollapseSettings, ctx: RuleContext) -> list[ExpertCollapseRule]:
    return [ExpertCollapseRule(s, rank=ctx.rank)]


SPEC = RuleSpec(
    "expert_collapse",
    ExpertCollapseSettings,
    _build,
    doc="a MoE layer's expert below `floor` x 1/experts of the routed tokens, or above `ceiling`, for `count` measured "
    "steps in a row (`expert_load/<layer>/<e>`): the router starves or floods an expert",
)
