"""MindFormers' own ``monitor_config`` (its ``TrainingStateMonitor``'s keys), read as the mindwatch settings it asks for.

Example::

    from mindwatch.mindformers_config import read_mindformers_keys

    read = read_mindformers_keys({"step_interval": 2, "local_norm_format": "log", "project": "llama"})
    read.section     # {"project": "llama", "layers": {"every": 2, "enabled": True}}: what mindwatch validates
    read.summary()   # "mindwatch: monitor_config holds MindFormers' TrainingStateMonitor keys, read as: step_interval: 2 -> ..."

:func:`mindwatch.config.load_config` reads every section through it: a section holding none of the keys only
MindFormers has comes back as it is. Where mindwatch's own key for a setting is given too, it wins, key by key. The
keys are MindFormers 1.9's (``MonitorConfig`` in ``mindformers/tools/register/template.py``), their meaning its
``TrainingStateMonitor``'s (``mindformers/core/callback/callback.py``); docs/configuration.md has the table. Pure
Python, no MindFormers needed; runs on the thread that loads the config.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Union

from pydantic import ConfigDict, Field, ValidationError

from mindwatch.schema import Section

#: Whose keys these are, in every message about them.
OWNER = "MindFormers' TrainingStateMonitor"

Format = Literal["log", "tensorboard"]
#: Where MindFormers shows a statistic: ``log``, ``tensorboard``, both in a list, or null (not at all).
Formats = Union[Format, list[Format], None]

#: The note of a key whose value asks for nothing (its default, null, false): listed together in the summary.
IDLE = "nothing asked for"
#: What a per-layer statistic needs in mindwatch, said once for the three keys that ask for one.
_LAYERS_NEED = "measured by a train cell with layer_stats=True, docs/layers.md"


class HealthCheckpoint(Section):
    """``monitor_config.health_checkpoint`` (MindFormers 1.9): where its global norm threshold now lives."""

    model_config = ConfigDict(extra="allow")

    global_norm_spike_threshold: float | None = Field(default=None, gt=0)


class TrainingStateMonitorKeys(Section):
    """MindFormers 1.9's ``monitor_config``, validated as its ``TrainingStateMonitor`` validates it."""

    #: MindFormers' default is off (it adds no TrainingStateMonitor); a section handed to mindwatch asks for
    #: monitoring, so absent reads as on.
    monitor_on: bool | None = None
    dump_path: str | None = None
    target: list[str] | None = None
    invert: bool = False
    step_interval: int = Field(default=1, ge=1)
    local_loss_format: Formats = None
    local_norm_format: Formats = None
    device_local_norm_format: Formats = None
    device_local_loss_format: Formats = None
    optimizer_state_format: Formats = None
    weight_state_format: Formats = None
    max_attention_logit_format: Formats = None
    throughput_baseline: float | None = Field(default=None, gt=0)
    print_struct: bool = False
    check_for_global_norm: bool = False
    global_norm_spike_threshold: float = Field(default=3.0, gt=0)
    global_norm_spike_count_threshold: int = Field(default=10, ge=1)
    stable_rank_config: dict[str, Any] | None = None
    health_checkpoint: HealthCheckpoint | None = None


#: Every key of MindFormers' ``monitor_config`` (1.9).
MINDFORMERS_KEYS: tuple[str, ...] = tuple(TrainingStateMonitorKeys.model_fields)
#: The one key both have: in a section holding MindFormers' keys it is MindFormers' (its statistics' cadence).
SHARED_KEYS: frozenset[str] = frozenset({"step_interval"})


class MindFormersKeyError(ValueError):
    """A MindFormers key with a value its TrainingStateMonitor would refuse; the message names the key and the owner."""


@dataclass(frozen=True)
class Reading:
    """What one of MindFormers' keys became: mindwatch settings (dotted paths), and what it means in words."""

    key: str
    value: Any
    settings: dict[str, Any] = field(default_factory=dict)
    note: str = ""
    #: It asks for something mindwatch does not do: said as a warning of its own too.
    unmet: bool = False

    def text(self, theirs: set[str]) -> str:
        """``key: value -> path: value (note)``; a path the user's own config gives is said to win."""
        got = [
            f"{p}: {_shown(v)}" if p not in theirs else f"{p} (mindwatch's own key given: it wins)"
            for p, v in self.settings.items()
        ]
        into = " -> " + ", ".join(got) if got else (" -> not applied" if self.unmet else "")
        return f"{self.key}: {_shown(self.value)}{into}" + (f" ({self.note})" if self.note else "")

    def warning(self) -> str:
        return f"monitor_config.{self.key} is {OWNER} setting, not applied: {self.note}"


@dataclass(frozen=True)
class ReadSection:
    """A ``monitor_config`` section with MindFormers' keys read: ``section`` is what mindwatch validates."""

    section: dict[str, Any]
    readings: tuple[Reading, ...] = ()
    #: The dotted mindwatch paths the user's own keys gave (they win over a reading's).
    theirs: frozenset[str] = frozenset()

    def summary(self) -> str | None:
        """The one line that says what was read into what; None when the section held no MindFormers key."""
        if not self.readings:
            return None
        said = [r.text(set(self.theirs)) for r in self.readings if r.note != IDLE]
        idle = [r.key for r in self.readings if r.note == IDLE]
        said += [f"{IDLE}: {', '.join(idle)}"] if idle else []
        return f"mindwatch: monitor_config holds {OWNER} keys, read as: {'; '.join(said)}"

    def warnings(self) -> list[str]:
        """One line for each key that asks for something mindwatch does not do."""
        return [r.warning() for r in self.readings if r.unmet]


def holds_mindformers_keys(section: Mapping[str, Any]) -> bool:
    """Whether ``section`` holds a key only MindFormers' ``monitor_config`` has."""
    return any(k in MINDFORMERS_KEYS and k not in SHARED_KEYS for k in section)


def read_mindformers_keys(section: Mapping[str, Any]) -> ReadSection:
    """``section`` with MindFormers' keys replaced by the mindwatch settings they ask for (the user's own win).

    Raises :class:`MindFormersKeyError` naming each MindFormers key whose value MindFormers would refuse.
    """
    if not holds_mindformers_keys(section):
        return ReadSection(dict(section))
    given = {k: v for k, v in section.items() if k in MINDFORMERS_KEYS}
    ours = copy.deepcopy({k: v for k, v in section.items() if k not in MINDFORMERS_KEYS})
    try:
        keys = TrainingStateMonitorKeys.model_validate(given)
    except ValidationError as e:
        raise MindFormersKeyError("\n  ".join(_refusals(e))) from None
    readings = tuple(_readings(keys))
    paths = {p for r in readings for p in r.settings}
    theirs = frozenset(p for p in paths if _holds(ours, p))
    for r in readings:
        for path, value in r.settings.items():
            if path not in theirs:
                _put(ours, path, value)
    return ReadSection(ours, readings, theirs)


def _readings(keys: TrainingStateMonitorKeys) -> list[Reading]:
    """One reading per key the section gave, in MindFormers' order."""
    given = [k for k in MINDFORMERS_KEYS if k in keys.model_fields_set]
    if keys.monitor_on is False:
        off = "monitor_on is false: MindFormers monitors none of it, and mindwatch reads none of it"
        return [_monitor_on(keys)] + [Reading(k, getattr(keys, k), note=off) for k in given if k != "monitor_on"]
    out: list[Reading] = []
    for k in given:
        read = _READERS[k](keys)
        out += read if isinstance(read, list) else [read]
    return out


def _monitor_on(keys: TrainingStateMonitorKeys) -> Reading:
    if keys.monitor_on is False:
        note = "MindFormers' TrainingStateMonitor off: mindwatch records what its own keys say"
    else:
        note = "the keys below are read"
    return Reading("monitor_on", keys.monitor_on, note=note)


def _step_interval(keys: TrainingStateMonitorKeys) -> Reading:
    n = keys.step_interval
    note = f"MindFormers' statistics every {n} steps: mindwatch measures the layers at the same steps and the first"
    return Reading("step_interval", n, {"layers.every": n}, note)


def _layer_stat(key: str, what: str) -> Callable[[TrainingStateMonitorKeys], Reading]:
    def read(keys: TrainingStateMonitorKeys) -> Reading:
        value = getattr(keys, key)
        if not value:
            return Reading(key, value, note=IDLE)
        return Reading(key, value, {"layers.enabled": True}, f"{what}, {_LAYERS_NEED}")

    return read


def _noted(key: str, note: str) -> Callable[[TrainingStateMonitorKeys], Reading]:
    """A key with nothing to set: mindwatch records what it asks for anyway, or has no use for it."""

    def read(keys: TrainingStateMonitorKeys) -> Reading:
        value = getattr(keys, key)
        return Reading(key, value, note=note if value else IDLE)

    return read


def _not_applied(key: str, asks: Callable[[Any], bool], note: str) -> Callable[[TrainingStateMonitorKeys], Reading]:
    """A key mindwatch has no counterpart for: a warning when its value asks for something."""

    def read(keys: TrainingStateMonitorKeys) -> Reading:
        value = getattr(keys, key)
        return Reading(key, value, note=note, unmet=True) if asks(value) else Reading(key, value, note=IDLE)

    return read


def _throughput_baseline(keys: TrainingStateMonitorKeys) -> Reading:
    b = keys.throughput_baseline
    if b is None:
        return Reading("throughput_baseline", b, note=IDLE)
    note = "each rank's samples per second over it is throughput_linearity, as MindFormers computes it"
    return Reading("throughput_baseline", b, {"throughput.baseline": b}, note)


def _health_limit(keys: TrainingStateMonitorKeys) -> float | None:
    """MindFormers 1.9's place for the limit: it replaces the top-level one and switches the check on."""
    return keys.health_checkpoint.global_norm_spike_threshold if keys.health_checkpoint else None


def _global_norm_check(key: str, value: Any, limit: float) -> Reading:
    """The check MindFormers' ``abnormal_global_norm_check`` makes: an absolute limit (not a ratio), every step."""
    settings = {"callback.params.warn_on_value.grad_norm": {"above": limit}, "alerts.thresholds.actions": ["stop"]}
    note = (
        f"MindFormers ends the training at the first step whose global norm is at or above {limit:g}: a thresholds "
        "alert with stop, whose actions every warn_on_value limit shares"
    )
    return Reading(key, value, settings, note)


def _check_for_global_norm(keys: TrainingStateMonitorKeys) -> Reading:
    on = keys.check_for_global_norm
    if _health_limit(keys) is not None:
        return Reading("check_for_global_norm", on, note="health_checkpoint.global_norm_spike_threshold switches it on")
    if not on:
        return Reading("check_for_global_norm", on, note=IDLE)
    return _global_norm_check("check_for_global_norm", on, keys.global_norm_spike_threshold)


def _global_norm_spike_threshold(keys: TrainingStateMonitorKeys) -> Reading:
    value = keys.global_norm_spike_threshold
    if _health_limit(keys) is not None:
        return Reading("global_norm_spike_threshold", value, note="not used: health_checkpoint's replaces it")
    if not keys.check_for_global_norm:
        return Reading("global_norm_spike_threshold", value, note="not used: check_for_global_norm is off")
    return Reading("global_norm_spike_threshold", value, note="check_for_global_norm's limit")


def _health_checkpoint(keys: TrainingStateMonitorKeys) -> list[Reading]:
    health = keys.health_checkpoint
    if health is None:
        return [Reading("health_checkpoint", None, note=IDLE)]
    out = []
    if health.global_norm_spike_threshold is not None:
        limit = health.global_norm_spike_threshold
        out.append(_global_norm_check("health_checkpoint.global_norm_spike_threshold", limit, limit))
    unmet = "mindwatch does not judge a checkpoint's health (MindFormers' CheckpointMonitor does)"
    out += [Reading(f"health_checkpoint.{k}", v, note=unmet, unmet=True) for k, v in sorted((health.model_extra or {}).items())]
    return out or [Reading("health_checkpoint", {}, note=IDLE)]


def _stable_rank(keys: TrainingStateMonitorKeys) -> Reading:
    value = keys.stable_rank_config
    if value and value.get("format"):
        return Reading("stable_rank_config", value, note="mindwatch records no stable rank", unmet=True)
    return Reading("stable_rank_config", value, note=IDLE)


_READERS: dict[str, Callable[[TrainingStateMonitorKeys], Reading | list[Reading]]] = {
    "monitor_on": _monitor_on,
    "dump_path": _noted(
        "dump_path",
        "not used: MindFormers' folder for its in-graph TensorDump; mindwatch reads the norms from the step's outputs",
    ),
    "target": _not_applied(
        "target",
        lambda v: bool(v) and v != [".*"],
        "the parameters (regular expressions) its local norms and optimizer states cover; mindwatch measures every "
        "layer and does not select (layers.group merges layers)",
    ),
    "invert": _not_applied("invert", bool, "inverts target, which mindwatch does not apply"),
    "step_interval": _step_interval,
    "local_loss_format": _noted(
        "local_loss_format", "recorded anyway: each rank's own loss is its `loss` (not each micro-batch's)"
    ),
    "local_norm_format": _layer_stat(
        "local_norm_format", "per-layer gradient norms grad_norm/<layer> (MindFormers: per parameter)"
    ),
    "device_local_norm_format": _noted(
        "device_local_norm_format",
        "recorded anyway: each rank's own gradient norm is local_grad_norm, in multi-rank runs while `metrics` has it "
        "(the default)",
    ),
    "device_local_loss_format": _noted("device_local_loss_format", "recorded anyway: each rank's own `loss`"),
    "optimizer_state_format": _layer_stat(
        "optimizer_state_format", "per-layer Adam moments adam_m_norm/<layer>, adam_v_norm/<layer> (Adam, AdamWeightDecay, Lamb)"
    ),
    "weight_state_format": _layer_stat(
        "weight_state_format", "per-layer weight norms weight_norm/<layer> (MindFormers: one norm of all weights)"
    ),
    "max_attention_logit_format": _not_applied(
        "max_attention_logit_format",
        bool,
        "mindwatch's attention_max_logit needs an AttentionStats cell in the model and `metrics: [attention_entropy]` "
        "(docs/layers.md); not switched on from here",
    ),
    "throughput_baseline": _throughput_baseline,
    "print_struct": _not_applied(
        "print_struct",
        bool,
        "MindFormers logs the trainable parameters' names and stops at the first step; mindwatch does not stop the "
        "training for it (its per-layer statistics name each layer)",
    ),
    "check_for_global_norm": _check_for_global_norm,
    "global_norm_spike_threshold": _global_norm_spike_threshold,
    "global_norm_spike_count_threshold": _noted(
        "global_norm_spike_count_threshold",
        "not used: MindFormers counts it only with its runner's use_skip_data_by_global_norm (skipped steps in a row "
        "before it stops); mindwatch's counterpart is skip_steps.max_consecutive",
    ),
    "stable_rank_config": _stable_rank,
    "health_checkpoint": _health_checkpoint,
}


_FORMATS = "should be 'log', 'tensorboard', a list of them, or null"


def _refusals(err: ValidationError) -> list[str]:
    """One line per MindFormers key with a bad value, naming it as MindFormers' setting."""
    lines: dict[str, str] = {}
    for item in err.errors():
        path = ".".join(str(p) for p in item["loc"] if not str(p).startswith(("literal[", "list[", "function-")))
        key = path.split(".", 1)[0]
        msg = _FORMATS if key.endswith("_format") else item["msg"]
        got = item.get("input")
        shown = f" (got {got!r})" if not isinstance(got, dict) else ""
        lines.setdefault(key if key.endswith("_format") else path, f"monitor_config.{path} ({OWNER} setting): {msg}{shown}")
    return list(lines.values())


def _holds(section: Mapping[str, Any], path: str) -> bool:
    """Whether ``section`` gives the dotted ``path`` (a part that is not a mapping counts as given: its own error comes)."""
    node: Any = section
    for part in path.split("."):
        if not isinstance(node, Mapping):
            return True
        if part not in node or node[part] is None:
            return False
        node = node[part]
    return True


def _put(section: dict[str, Any], path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    node = section
    for part in parents:
        if node.get(part) is None:
            node[part] = {}
        node = node[part]
    node[leaf] = value


def _shown(value: Any) -> str:
    return json.dumps(value, default=str)
