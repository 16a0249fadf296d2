"""monitor_config: the seed article's YAML loads unchanged; bad configs name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from mindwatch.config import ConfigError, MonitorConfig, load_config

SEED_YAML = """
monitor_config:
  enable: true
  backend: local
  project: bert-large-wwm-pretrain
  interval: 30
  save_dir: ./monitor_output
  tensorboard: true
  metrics:
    - loss
    - lr
    - tokens_per_second
    - memory_usage
    - global_rank
  callback:
    type: MindSporeTransformersMonitor
    params:
      log_level: INFO
      warn_on_value:
        loss: 50.0
        tokens_per_second: 1000
  tags:
    dataset: wiki-zh-v3
    model_size: 340M
"""


def test_seed_yaml_loads_unchanged_and_means_what_the_article_says(tmp_path: Path) -> None:
    path = tmp_path / "train.yaml"
    path.write_text(SEED_YAML)
    for source in (path, str(path), SEED_YAML):
        cfg = load_config(source)
        assert cfg.enable is True
        assert cfg.project == "bert-large-wwm-pretrain"
        assert cfg.interval == 30.0  # seconds between console summaries
        assert cfg.save_dir == Path("./monitor_output")
        assert cfg.tensorboard_enabled
        assert cfg.callback.type == "MindSporeTransformersMonitor"
        assert cfg.log_level == "INFO"
        assert cfg.callback.params.warn_on_value == {"loss": 50.0, "tokens_per_second": 1000.0}
        assert cfg.tags == {"dataset": "wiki-zh-v3", "model_size": "340M"}
        # memory_usage switches on the memory collectors; global_rank is recorded anyway
        assert {"loss", "lr", "tokens_per_second", "host_rss_gb", "device_mem_gb"} <= cfg.enabled_metrics
        assert "grad_norm" not in cfg.enabled_metrics


def test_defaults_and_our_additions() -> None:
    cfg = load_config({"step_interval": 5, "flush_secs": 0.5, "run_name": "exp1"})
    assert (cfg.step_interval, cfg.flush_secs, cfg.run_name) == (5, 0.5, "exp1")
    assert load_config(None).flush_secs == 2.0
    assert "attention_entropy" not in load_config({}).enabled_metrics
    assert isinstance(load_config(cfg), MonitorConfig)


@pytest.mark.parametrize(
    ("config", "names"),
    [
        ({"intervall": 30}, ["monitor_config.intervall", "unknown key", "interval"]),
        ({"callback": {"params": {"log_levle": "INFO"}}}, ["monitor_config.callback.params.log_levle", "log_level"]),
        ({"interval": "soon"}, ["monitor_config.interval", "'soon'"]),
        ({"interval": -1}, ["monitor_config.interval", "greater than 0"]),
        ({"step_interval": 0}, ["monitor_config.step_interval"]),
        ({"flush_secs": 0}, ["monitor_config.flush_secs"]),
        ({"backend": "wandb"}, ["monitor_config.backend", "not supported"]),
        ({"backend": "mlflow"}, ["monitor_config.backend", "'local'", "'tensorboard'"]),
        ({"metrics": ["loss", "losss"]}, ["monitor_config.metrics", "'losss'", "allowed"]),
        ({"callback": {"type": "LossMonitor"}}, ["monitor_config.callback.type", "MindSporeTransformersMonitor"]),
        ({"callback": {"params": {"log_level": "LOUD"}}}, ["monitor_config.callback.params.log_level", "'LOUD'"]),
        ({"callback": {"params": {"warn_on_value": {"loss": "high"}}}}, ["monitor_config.callback.params.warn_on_value.loss"]),
        ({"callback": {"params": {"warn_on_value": {"loss": {"above": 1, "below": 0}}}}}, ["warn_on_value.loss", "exactly one"]),
        ({"enable": "maybe"}, ["monitor_config.enable"]),
        ({"project": ""}, ["monitor_config.project"]),
    ],
)
def test_bad_configs_name_the_key(config: dict, names: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(config)
    for name in names:
        assert name in str(err.value)


def test_bad_sources(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config("monitor_config: {enable: [\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config("- just\n- a list\n")
