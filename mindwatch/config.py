"""The ``monitor_config`` schema: YAML in, a typed and validated config out.

Example::

    from mindwatch.config import load_config

    cfg = load_config("monitor.yaml")          # a path, a YAML string or a dict
    cfg.interval, cfg.step_interval, cfg.flush_secs

The example in the seed article loads unchanged; every key below is documented in
the README's configuration table. Errors name the key path and what is allowed::

    ConfigError: monitor_config.interval: Input should be greater than 0 (got -1)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

#: Metric names the collectors produce (the metric-name contract in ARCHITECTURE.md).
BUILTIN_METRICS: tuple[str, ...] = (
    "loss",
    "lr",
    "grad_norm",
    "loss_scale",
    "overflow",
    "step_time",
    "data_time",
    "samples_per_second",
    "tokens_per_second",
    "host_rss_gb",
    "device_mem_gb",
    "device_mem_peak_gb",
    "attention_entropy",
)

#: Names users write in configs (the seed's ``memory_usage``, ``global_rank``) and what they switch on.
METRIC_ALIASES: dict[str, tuple[str, ...]] = {
    "memory_usage": ("host_rss_gb", "device_mem_gb", "device_mem_peak_gb"),
    "memory": ("host_rss_gb", "device_mem_gb", "device_mem_peak_gb"),
    "global_rank": (),  # the rank is recorded with every step anyway
    "rank": (),
    "throughput": ("samples_per_second", "tokens_per_second"),
    "global_norm": ("grad_norm",),
    "learning_rate": ("lr",),
}

#: What ``metrics`` means when the config does not list any.
DEFAULT_METRICS: tuple[str, ...] = tuple(m for m in BUILTIN_METRICS if m != "attention_entropy")


class ConfigError(ValueError):
    """A ``monitor_config`` that cannot be used; the message names the key path."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


class Bound(_Section):
    """An explicit threshold: ``{above: 50}`` or ``{below: 1000}``."""

    above: float | None = None
    below: float | None = None

    @model_validator(mode="after")
    def _one_side(self) -> Bound:
        if (self.above is None) == (self.below is None):
            raise ValueError("give exactly one of 'above' or 'below'")
        return self


class CallbackParams(_Section):
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    #: ``{metric: limit}``; a bare number is an upper bound, except for throughput
    #: metrics where it is a lower bound. ``{metric: {above: x}}`` / ``{below: y}`` is explicit.
    warn_on_value: dict[str, Union[float, Bound]] = Field(default_factory=dict)
    #: Console summaries on every rank instead of rank 0 only.
    log_all_ranks: bool = False

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, v: Any) -> Any:
        return v.upper() if isinstance(v, str) else v


class CallbackSection(_Section):
    type: Literal["MindSporeTransformersMonitor", "MonitorCallback"] = "MonitorCallback"
    params: CallbackParams = Field(default_factory=CallbackParams)


class AttentionEntropy(_Section):
    #: Compute the entropy every N steps (it needs a device sync, so not every step).
    every: int = Field(default=50, ge=1)
    #: fnmatch patterns on cell names whose *output* is the attention probabilities;
    #: empty means: every ``Softmax`` cell inside a cell whose name contains "attn" or "attention".
    cells: list[str] = Field(default_factory=list)


class MonitorConfig(_Section):
    """The whole ``monitor_config`` section. See the README for each key."""

    enable: bool = True
    #: ``local`` writes the run directory; ``tensorboard`` also writes event files.
    backend: Literal["local", "tensorboard"] = "local"
    project: str = Field(default="default", min_length=1)
    run_name: str | None = None
    #: Seconds between console summary lines.
    interval: float = Field(default=30.0, gt=0)
    #: Record every N-th step.
    step_interval: int = Field(default=1, ge=1)
    #: Seconds between fsyncs of the run files (and heartbeats); bounds what a power loss can take.
    flush_secs: float = Field(default=2.0, gt=0)
    save_dir: Path = Path("./monitor_output")
    tensorboard: bool = False
    metrics: list[str] = Field(default_factory=lambda: list(DEFAULT_METRICS))
    callback: CallbackSection = Field(default_factory=CallbackSection)
    tags: Union[list[str], dict[str, str]] = Field(default_factory=list)
    #: Override the batch size / sequence length read from the batch shapes.
    batch_size: int | None = Field(default=None, ge=1)
    seq_length: int | None = Field(default=None, ge=1)
    attention_entropy: AttentionEntropy = Field(default_factory=AttentionEntropy)
    #: Records waiting for the writer; when full, new records are dropped and counted.
    queue_size: int = Field(default=10_000, ge=16)

    @field_validator("backend", mode="before")
    @classmethod
    def _known_backend(cls, v: Any) -> Any:
        if v == "wandb":
            raise ValueError(
                "backend 'wandb' is not supported (it needs an account and the internet); use 'local' or 'tensorboard'"
            )
        return v

    @field_validator("metrics")
    @classmethod
    def _known_metrics(cls, v: list[str]) -> list[str]:
        allowed = set(BUILTIN_METRICS) | set(METRIC_ALIASES)
        bad = [m for m in v if m not in allowed]
        if bad:
            raise ValueError(f"unknown metric {bad[0]!r}; allowed: {', '.join(sorted(allowed))}")
        return v

    @property
    def enabled_metrics(self) -> frozenset[str]:
        """The built-in metric names switched on, with aliases expanded."""
        out: set[str] = set()
        for m in self.metrics:
            out.update(METRIC_ALIASES.get(m, (m,)))
        return frozenset(out)

    @property
    def log_level(self) -> str:
        return self.callback.params.log_level

    @property
    def tensorboard_enabled(self) -> bool:
        return self.tensorboard or self.backend == "tensorboard"

    def snapshot(self) -> dict[str, Any]:
        """The config as plain JSON data, for ``meta.json``."""
        return self.model_dump(mode="json")


def load_config(source: MonitorConfig | dict[str, Any] | str | os.PathLike[str] | None = None) -> MonitorConfig:
    """Load a ``monitor_config`` from a config object, a dict, a YAML path or a YAML string.

    Example::

        cfg = load_config({"project": "gpt", "interval": 10})
        cfg = load_config("train.yaml")    # may hold a top-level ``monitor_config:`` key

    Raises :class:`ConfigError` naming the key path on any unknown key, wrong type or bad value.
    """
    if source is None:
        return MonitorConfig()
    if isinstance(source, MonitorConfig):
        return source
    data: Any
    if isinstance(source, dict):
        data = source
    else:
        text = str(source)
        path = Path(text)
        looks_like_path = isinstance(source, os.PathLike) or ("\n" not in text and text.endswith((".yaml", ".yml")))
        if looks_like_path:
            if not path.is_file():
                raise ConfigError(f"monitor_config file not found: {path}")
            text = path.read_text(encoding="utf-8")
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"monitor_config is not valid YAML: {e}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"monitor_config must be a mapping of keys to values, got {type(data).__name__}")
    prefix = "monitor_config"
    if "monitor_config" in data:
        data = data["monitor_config"] or {}
        if not isinstance(data, dict):
            raise ConfigError("monitor_config must be a mapping of keys to values")
    try:
        return MonitorConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_explain(e, prefix)) from None


def _explain(err: ValidationError, prefix: str) -> str:
    lines = []
    for item in err.errors():
        path = ".".join([prefix, *(str(p) for p in item["loc"] if not _is_union_tag(p))])
        if item["type"] == "extra_forbidden":
            lines.append(f"{path}: unknown key; {_allowed_here(item['loc'])}")
        else:
            got = item.get("input")
            shown = f" (got {got!r})" if not isinstance(got, dict | list) else ""
            lines.append(f"{path}: {item['msg']}{shown}")
    return "invalid monitor_config:\n  " + "\n  ".join(dict.fromkeys(lines))


def _is_union_tag(p: Any) -> bool:
    # pydantic puts the tried union member ('float', 'Bound') into the location
    return isinstance(p, str) and (p in {"float", "Bound", "list[str]", "dict[str,str]"} or p.startswith("function-"))


def _allowed_here(loc: tuple[Any, ...]) -> str:
    model: Any = MonitorConfig
    for p in loc[:-1]:
        if _is_union_tag(p):
            continue
        field = getattr(model, "model_fields", {}).get(p) if isinstance(p, str) else None
        if field is None:
            return "see the README for the allowed keys"
        ann = field.annotation
        model = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
        if model is None:
            return "see the README for the allowed keys"
    return "allowed keys here: " + ", ".join(model.model_fields)
