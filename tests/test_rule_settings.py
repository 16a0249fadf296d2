"""A rule takes its validated settings: built from a config or from keywords, one set of defaults and limits."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from mindwatch.alerts.registry import build_rules
from mindwatch.alerts.rules.data_wait import DataWaitRule
from mindwatch.alerts.rules.divergence import DivergenceRule
from mindwatch.alerts.rules.spike import SpikeRule
from mindwatch.config import ConfigError, load_config


def test_keywords_are_checked_like_the_config_checks_them() -> None:
    with pytest.raises(ValidationError, match="factor"):
        SpikeRule("loss", factor=0.5)  # alerts.spike.factor must be above 1
    with pytest.raises(ConfigError, match="factor"):
        load_config({"alerts": {"spike": {"factor": 0.5}}})
    with pytest.raises(ValidationError, match="windw"):
        DivergenceRule(windw=30)  # a misspelt setting is an error, not a silent default


def test_a_rule_without_settings_has_the_defaults_of_a_config_without_them() -> None:
    from_config = {type(r): r for r in build_rules(load_config({}))}
    plain = DataWaitRule()
    configured = from_config[DataWaitRule]
    assert (plain.limit, plain.warmup, plain.count) == (configured.limit, configured.warmup, configured.count) == (0.5, 5, 5)


def test_the_config_s_values_reach_the_rule() -> None:
    cfg = load_config({"alerts": {"divergence": {"window": 30, "min_rise": 0.5, "actions": ["checkpoint"]}}})
    (rule,) = [r for r in build_rules(cfg) if isinstance(r, DivergenceRule)]
    assert (rule.values.maxlen, rule.min_rise, rule.actions) == (30, 0.5, ["checkpoint"])
