"""Every alert rule mindwatch knows, found in :mod:`mindwatch.alerts.rules`: one module a rule, each with a ``SPEC``.

Example::

    from mindwatch.alerts.registry import build_rules, rule_specs

    [spec.key for spec in rule_specs()]        # ['data_wait', 'divergence', 'memory', ...]
    rules = build_rules(config, rank=0)        # the rules ``config`` switches on, for the RuleEngine

Adding a rule is one module in ``mindwatch/alerts/rules/`` that defines ``SPEC`` (its settings
become ``monitor_config.alerts.<key>``) plus its test; see docs/alerts.md, "Adding a rule".
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable
from functools import cache
from typing import TYPE_CHECKING, Any

from mindwatch.alerts import rules as _rules_package
from mindwatch.alerts.rules.base import Rule, RuleContext, RuleSpec

if TYPE_CHECKING:
    from mindwatch.config import MonitorConfig


@cache
def rule_specs() -> tuple[RuleSpec, ...]:
    """The ``SPEC`` of every module in :mod:`mindwatch.alerts.rules`, by key."""
    specs = []
    for info in pkgutil.iter_modules(_rules_package.__path__):
        module = importlib.import_module(f"{_rules_package.__name__}.{info.name}")
        spec = getattr(module, "SPEC", None)
        if isinstance(spec, RuleSpec):
            specs.append(spec)
    return tuple(sorted(specs, key=lambda s: s.key))


def build_rules(
    config: MonitorConfig, *, rank: int = 0, device_total_gb: float | None = None, nonfinite_checked: Iterable[str] = ()
) -> list[Rule]:
    """The rules ``config`` switches on (``alerts:`` and ``callback.params.warn_on_value``).

    ``nonfinite_checked``: metrics the training loop checks for NaN/Inf itself (the MindSpore
    callback does for loss and grad_norm when the rule has actions, to act on the same step).
    """
    alerts = config.alerts
    if not alerts.enabled:
        return []
    ctx = RuleContext(config, rank, device_total_gb, frozenset(nonfinite_checked))
    out: list[Rule] = []
    for spec in rule_specs():
        settings = getattr(alerts, spec.key)
        if spec.build is not None and settings.enabled:
            out.extend(spec.build(settings, ctx))
    return out


def configured_actions(config: Any) -> set[str]:
    """Every action any alert rule of ``config`` may request."""
    alerts = config.alerts
    if not alerts.enabled:
        return set()
    return {act for spec in rule_specs() if (s := getattr(alerts, spec.key)).enabled for act in s.actions}
