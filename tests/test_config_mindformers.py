"""MindFormers' own monitor_config (its TrainingStateMonitor's keys) loads as the mindwatch settings it asks for."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from test_docs import config_keys

from mindwatch.config import ConfigError, MonitorConfig, load_config
from mindwatch.mindformers_config import MINDFORMERS_KEYS

#: A MindFormers YAML's monitor_config as MindFormers' docs show it, beside the rest of its YAML.
MINDFORMERS_YAML = """
seed: 0
run_mode: train
monitor_config:
  monitor_on: True
  dump_path: './dump'
  target: ['.*']
  invert: False
  step_interval: 4
  local_loss_format: ['log', 'tensorboard']
  local_norm_format: ['log', 'tensorboard']
  device_local_norm_format: log
  optimizer_state_format: log
  weight_state_format: null
  throughput_baseline: 25.5
  print_struct: False
  check_for_global_norm: True
  global_norm_spike_threshold: 2.5
  global_norm_spike_count_threshold: 10
callbacks:
  - type: MFLossMonitor
"""


def test_a_mindformers_yaml_loads_into_the_settings_its_monitor_config_asks_for(tmp_path: Path, caplog) -> None:
    path = tmp_path / "llama_tiny.yaml"
    path.write_text(MINDFORMERS_YAML)
    with caplog.at_level(logging.INFO, logger="mindwatch"):
        cfg = load_config(path)
    assert cfg.layers.every == 4 and cfg.layers.enabled  # step_interval: the layers' cadence
    assert cfg.step_interval == 1  # not mindwatch's record-every-N
    assert cfg.throughput.baseline == 25.5
    limit = cfg.callback.params.warn_on_value["grad_norm"]
    assert (limit.above, limit.below) == (2.5, None)  # absolute, as MindFormers' check
    assert cfg.alerts.thresholds.actions == ["stop"]  # MindFormers ends the training there
    assert {"grad_norm", "local_grad_norm", "throughput_linearity"} <= cfg.enabled_metrics
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO and "TrainingStateMonitor" in r.getMessage()]
    assert len(said) == 1  # one line says what became what
    for fragment in (
        "step_interval: 4 -> layers.every: 4",
        'local_norm_format: ["log", "tensorboard"] -> layers.enabled: true',
        "throughput_baseline: 25.5 -> throughput.baseline: 25.5",
        'callback.params.warn_on_value.grad_norm: {"above": 2.5}, alerts.thresholds.actions: ["stop"]',
        "global_norm_spike_count_threshold: 10 (not used",
        "dump_path",
        "nothing asked for: target, invert, weight_state_format, print_struct",
    ):
        assert fragment in said[0], fragment
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]  # nothing asked for that is not done


def test_mindwatchs_own_key_wins_key_by_key(caplog) -> None:
    section = {
        "step_interval": 2,
        "local_norm_format": "log",
        "check_for_global_norm": True,
        "global_norm_spike_threshold": 8,
        "layers": {"every": 5},  # beats step_interval
        "alerts": {"thresholds": {"actions": []}},  # an alert, no stop
        "callback": {"params": {"warn_on_value": {"loss": 50}}},  # another limit: grad_norm's still added
        "project": "llama",
    }
    with caplog.at_level(logging.INFO, logger="mindwatch"):
        cfg = load_config(section)
    assert (cfg.layers.every, cfg.layers.enabled, cfg.project) == (5, True, "llama")
    assert cfg.alerts.thresholds.actions == []
    assert set(cfg.callback.params.warn_on_value) == {"loss", "grad_norm"}
    assert cfg.callback.params.warn_on_value["grad_norm"].above == 8
    assert "layers.every (mindwatch's own key given: it wins)" in caplog.text
    assert "alerts.thresholds.actions (mindwatch's own key given: it wins)" in caplog.text
    assert section["layers"] == {"every": 5}  # the caller's dict is left as it was


def test_monitor_on_false_reads_none_of_mindformers_keys() -> None:
    cfg = load_config({"monitor_on": False, "step_interval": 3, "local_norm_format": "log", "throughput_baseline": 9})
    assert cfg == MonitorConfig()  # mindwatch's own keys (none here): its defaults


def test_a_lone_step_interval_is_mindwatchs_record_every_n() -> None:
    cfg = load_config({"step_interval": 3})
    assert (cfg.step_interval, cfg.layers.every) == (3, 10)


def test_health_checkpoints_threshold_switches_the_global_norm_check_on() -> None:
    cfg = load_config({"health_checkpoint": {"global_norm_spike_threshold": 4.0}, "global_norm_spike_threshold": 1.0})
    assert cfg.callback.params.warn_on_value["grad_norm"].above == 4.0  # it replaces the top-level one (MindFormers 1.9)
    assert cfg.alerts.thresholds.actions == ["stop"]


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ({"target": ["layers.0"]}, "target"),
        ({"monitor_on": True, "invert": True}, "invert"),
        ({"print_struct": True}, "print_struct"),
        ({"max_attention_logit_format": "log"}, "max_attention_logit_format"),
        ({"stable_rank_config": {"format": "log"}}, "stable_rank_config"),
        ({"health_checkpoint": {"embedding_local_norm_threshold": 1.0}}, "health_checkpoint.embedding_local_norm_threshold"),
    ],
)
def test_a_key_mindwatch_cannot_apply_is_named_as_mindformers_setting(section: dict, key: str, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="mindwatch"):
        load_config(section)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert f"monitor_config.{key} is MindFormers' TrainingStateMonitor setting, not applied" in warnings[0]


@pytest.mark.parametrize(
    ("section", "names"),
    [
        ({"monitor_on": True, "step_interval": 0}, ["monitor_config.step_interval", "greater than or equal to 1"]),
        ({"local_norm_format": "csv"}, ["monitor_config.local_norm_format", "'log', 'tensorboard'", "'csv'"]),
        ({"optimizer_state_format": ["log", "screen"]}, ["monitor_config.optimizer_state_format", "'log', 'tensorboard'"]),
        ({"monitor_on": True, "target": "layers.0"}, ["monitor_config.target", "valid list"]),
        ({"throughput_baseline": -1}, ["monitor_config.throughput_baseline", "greater than 0"]),
        ({"check_for_global_norm": "sometimes"}, ["monitor_config.check_for_global_norm", "'sometimes'"]),
        ({"global_norm_spike_count_threshold": 0}, ["monitor_config.global_norm_spike_count_threshold"]),
        ({"health_checkpoint": {"global_norm_spike_threshold": 0}}, ["health_checkpoint.global_norm_spike_threshold"]),
    ],
)
def test_a_bad_value_of_a_mindformers_key_names_it_as_mindformers(section: dict, names: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(section)
    for name in [*names, "(MindFormers' TrainingStateMonitor setting)"]:
        assert name in str(err.value)


def test_a_key_neither_has_lists_both_sets_of_keys() -> None:
    with pytest.raises(ConfigError) as err:
        load_config({"monitor_on": True, "local_norm_fromat": "log"})
    assert "monitor_config.local_norm_fromat: unknown key" in str(err.value)
    assert "nor is it MindFormers' TrainingStateMonitor key (monitor_on, dump_path" in str(err.value)


def test_a_missing_config_file_is_named_by_its_absolute_path(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as err:
        load_config("configs/monitor.yaml")
    assert str(err.value) == f"monitor_config file not found: {tmp_path / 'configs' / 'monitor.yaml'}"


def _mindformers_table() -> list[list[str]]:
    text = (REPO / "docs" / "configuration.md").read_text()
    section = text.split("\n## MindFormers' own `monitor_config`\n", 1)[1].split("\n## ", 1)[0]
    return [[c.strip() for c in line.strip("|").split(" | ")] for line in section.splitlines() if line.startswith("| **")]


def test_the_docs_table_names_every_mindformers_key_and_only_existing_mindwatch_keys() -> None:
    rows = _mindformers_table()
    named = [k for row in rows for k in re.findall(r"\*\*(\w+)\*\*", row[0])]
    assert sorted(named) == sorted(MINDFORMERS_KEYS)
    ours = {path for path, _ in config_keys(MonitorConfig)}
    dotted = {k for row in rows for k in re.findall(r"`([a-z_]+\.[a-z_.]+)", row[2])}
    unknown = [k for k in dotted if not any(k == o or k.startswith(f"{o}.") for o in ours)]  # warn_on_value.<metric>
    assert dotted and unknown == []


def test_what_became_what_is_said_in_a_process_that_configured_no_logging(tmp_path) -> None:
    """The line is said when the config loads, before any run sets up mindwatch's logging."""
    code = "from mindwatch.config import load_config\nload_config({'step_interval': 2, 'local_norm_format': 'log'})\n"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "INFO mindwatch: monitor_config holds MindFormers' TrainingStateMonitor keys" in out.stderr
    assert "step_interval: 2 -> layers.every: 2" in out.stderr
