"""Every alert rule mindwatch knows, listed in :data:`mindwatch.alerts.rules.SPECS`: one module a rule, each with a ``SPEC``.

Example::

    from mindwatch.alerts.registry import build_rules, rule_specs

    [spec.key for spec in rule_specs()]        # ['data_wait', 'divergence', 'memory', ...]
    rules = build_rules(config, rank=0)        # the rules ``config`` switches on, for the RuleEngine

Adding a rule is one module in ``mindwatch/alerts/rules/`` that defines ``SPEC`` (its settings
become ``monitor_config.alerts.<key>``), its line in ``SPECS``, and its test; see docs/alerts.md, "Adding a rule".
The config is typed by what is read of it (:class:`Configured`), so this module does not import the config
(which imports it for the rule sections).
"""

from __future__ import annotations

from typing import Any, Protocol

from mindwatch.alerts.rules import SPECS
from mindwatch.alerts.rules.base import Rule, RuleContext, RuleSpec


class Configured(Protocol):
    """What the rules read of a config (a :class:`mindwatch.config.MonitorConfig`)."""

    @property
    def alerts(self) -> Any: ...

    @property
    def callback(self) -> Any: ...


def rule_specs() -> tuple[RuleSpec, ...]:
    """The ``SPEC`` of every rule, by key."""
    return SPECS


def build_rules(
    config: Configured, *, rank: int = 0, device_total_gb: float | None = None, checks_in_step: bool = False
) -> list[Rule]:
    """The rules ``config`` switches on (``alerts:`` and ``callback.params.warn_on_value``).

    ``checks_in_step``: the training thread checks what must act on the very step (the MindSpore adapter does, for
    loss and grad_norm when the non-finite rule has actions: :func:`~mindwatch.alerts.rules.nonfinite.checked_in_step`).
    """
    alerts = config.alerts
    if not alerts.enabled:
        return []
    ctx = RuleContext(
        config.callback.params.warn_on_value, rank, device_total_gb, checks_in_step, getattr(config, "evaluation", None)
    )
    out: list[Rule] = []
    for spec in rule_specs():
        settings = getattr(alerts, spec.key)
        if spec.build is not None and settings.enabled:
            out.extend(spec.build(settings, ctx))
    return out


def configured_actions(config: Configured) -> set[str]:
    """Every action any alert rule of ``config`` may request."""
    alerts = config.alerts
    if not alerts.enabled:
        return set()
    skip = getattr(config, "skip_steps", None)  # its settings are monitor_config.skip_steps
    skipping = set(skip.actions) if skip is not None and skip.enabled else set()
    return skipping | {act for spec in rule_specs() if (s := getattr(alerts, spec.key)).enabled for act in s.actions}
