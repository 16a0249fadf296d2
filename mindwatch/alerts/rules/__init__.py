"""The alert rules, one module a rule; each module's ``SPEC`` plugs it into the config and the engine
(:mod:`mindwatch.alerts.registry`). :data:`SPECS` lists them: a new rule module is added there.

Example::

    from mindwatch.alerts.rules import SpikeRule

    rule = SpikeRule("loss", factor=3.0, count=3)
    rule.check({"step": 120, "loss": 9.1})      # [] or [alert]
"""

from mindwatch.alerts.rules import (
    data_wait,
    divergence,
    early_stopping,
    expert_collapse,
    layer_collapse,
    layer_frozen,
    layer_spike,
    layer_update_large,
    layer_vanishing,
    memory,
    nonfinite,
    overfitting,
    rank_collapse,
    router_imbalance,
    spike,
    stall,
    threshold,
    throughput_drop,
)
from mindwatch.alerts.rules.base import RollingMedian, Rule, RuleBase, RuleContext, RuleSpec, Streak, value_of
from mindwatch.alerts.rules.data_wait import DataWaitRule
from mindwatch.alerts.rules.divergence import DivergenceRule
from mindwatch.alerts.rules.memory import MemoryRule
from mindwatch.alerts.rules.nonfinite import NonFiniteRule
from mindwatch.alerts.rules.spike import SpikeRule
from mindwatch.alerts.rules.threshold import THROUGHPUT_METRICS, ThresholdRule, threshold_rules
from mindwatch.alerts.rules.throughput_drop import ThroughputDropRule

#: Every rule's spec, by key: what the config's ``alerts:`` sections and the engine are built from.
SPECS: tuple[RuleSpec, ...] = tuple(
    sorted(
        (
            data_wait.SPEC,
            divergence.SPEC,
            early_stopping.SPEC,
            expert_collapse.SPEC,
            layer_collapse.SPEC,
            layer_frozen.SPEC,
            layer_spike.SPEC,
            layer_update_large.SPEC,
            layer_vanishing.SPEC,
            memory.SPEC,
            nonfinite.SPEC,
            overfitting.SPEC,
            rank_collapse.SPEC,
            router_imbalance.SPEC,
            spike.SPEC,
            stall.SPEC,
            threshold.SPEC,
            throughput_drop.SPEC,
        ),
        key=lambda s: s.key,
    )
)

__all__ = [
    "SPECS",
    "THROUGHPUT_METRICS",
    "DataWaitRule",
    "DivergenceRule",
    "MemoryRule",
    "NonFiniteRule",
    "RollingMedian",
    "Rule",
    "RuleBase",
    "RuleContext",
    "RuleSpec",
    "SpikeRule",
    "Streak",
    "ThresholdRule",
    "ThroughputDropRule",
    "threshold_rules",
    "value_of",
]
