"""The ``monitor_config`` schema: YAML in, a typed and validated config out.

Example::

    from mindwatch.config import load_config

    cfg = load_config("monitor.yaml")          # a path, a YAML string or a dict
    cfg.interval, cfg.step_interval, cfg.flush_secs

A config in the article's format (``backend``, ``callback.type: MindSporeTransformersMonitor``,
``callback.params.warn_on_value``) loads unchanged. MindFormers' own ``monitor_config`` (its TrainingStateMonitor's
keys: ``monitor_on``, ``local_norm_format``, ...) is read as the mindwatch settings it asks for
(:mod:`mindwatch.mindformers_config`), mindwatch's own keys winning, and one INFO line says what became what.
Every key below is documented in docs/configuration.md. Errors name the key path and what is allowed::

    ConfigError: monitor_config.interval: Input should be greater than 0 (got -1)
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, Field, ValidationError, create_model, field_validator, model_validator

from mindwatch import metrics as vocab
from mindwatch.alerts.hang import HangSettings
from mindwatch.alerts.registry import rule_specs
from mindwatch.alerts.rules.early_stopping import early_stopping_given
from mindwatch.alerts.skip import SkipStepsSettings
from mindwatch.alerts.straggler import StragglerSettings
from mindwatch.mindformers_config import MINDFORMERS_KEYS, OWNER, MindFormersKeyError, ReadSection, read_mindformers_keys
from mindwatch.schema import Section, Severity

log = logging.getLogger("mindwatch")

#: Names ``monitor_config.metrics`` accepts (the vocabulary's switches and aliases).
BUILTIN_METRICS: frozenset[str] = vocab.config_names()
#: What ``metrics`` means when the config does not list any.
DEFAULT_METRICS: tuple[str, ...] = vocab.default_switches()


class ConfigError(ValueError):
    """A ``monitor_config`` that cannot be used; the message names the key path."""


class Bound(Section):
    """An explicit threshold: ``{above: 50}`` or ``{below: 1000}``."""

    above: float | None = None
    below: float | None = None

    @model_validator(mode="after")
    def _one_side(self) -> Bound:
        if (self.above is None) == (self.below is None):
            raise ValueError("give exactly one of 'above' or 'below'")
        return self


class CallbackParams(Section):
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


class CallbackSection(Section):
    type: Literal["MindSporeTransformersMonitor", "MonitorCallback"] = "MonitorCallback"
    params: CallbackParams = Field(default_factory=CallbackParams)
    #: The dataset column that holds each sample's id: anomaly alerts name the ids of their step's batch.
    sample_ids: str | None = Field(default=None, min_length=1)


class AttentionEntropy(Section):
    #: Compute the entropy every N steps (it needs a device sync, so not every step).
    every: int = Field(default=50, ge=1)
    #: fnmatch patterns on cell names whose *output* is the attention probabilities;
    #: empty means: every ``Softmax`` cell inside a cell whose name contains "attn" or "attention".
    cells: list[str] = Field(default_factory=list)


class MoeSection(Section):
    """A mixture of experts' routing (docs/layers.md): recorded when the model holds ``RouterStats`` cells."""

    #: Measure the routing every N steps (the counts are taken in the graph on those steps only).
    every: int = Field(default=10, ge=1)


class LayersSection(Section):
    """Per-layer health (docs/layers.md): recorded when the train cell has ``layer_stats=True``."""

    enabled: bool = True
    #: Measure weights and updates every N steps (the gradient norms come with them); 1: every step.
    every: int = Field(default=10, ge=1)
    #: Merge layers: a name depth (``2``: ``blocks.0``) or fnmatch patterns (a layer matching one is named
    #: by the pattern); null: every cell that owns parameters is a layer.
    group: Union[int, list[str], None] = None
    #: Histograms of each layer's weights and gradients every N steps (32 bins); null: none.
    histogram_every: int | None = Field(default=100, ge=1)
    #: The stable rank of every weight matrix every N steps (``stable_rank/<parameter>``, docs/layers.md); null: none.
    stable_rank_every: int | None = Field(default=100, ge=1)

    @field_validator("group")
    @classmethod
    def _positive_depth(cls, v: Any) -> Any:
        if isinstance(v, int) and v < 1:
            raise ValueError("a group depth must be at least 1")
        return v


class ThroughputSection(Section):
    """TFLOPS per device and MFU (docs/configuration.md#tflops-and-mfu): what a step costs and what the device can do."""

    #: The model FLOPs of one training step on one device (forward and backward); null: 6 x trainable parameters
    #: x tokens per step (models fed token ids; no TFLOPS for other models unless this is given).
    flops_per_step: float | None = Field(default=None, gt=0)
    #: The device's peak TFLOPS (dense bf16/fp16), for MFU; null: the peak of the device's name in the table of
    #: known devices (mindwatch/device_peaks.py), and no MFU where it is not in there (a CPU).
    peak_tflops: float | None = Field(default=None, gt=0)
    #: Samples per second of one device training alone: each rank's ``throughput_linearity`` is its own samples per
    #: second over it (1: the job scales linearly); null: not recorded.
    baseline: float | None = Field(default=None, gt=0)


class DynamicBatchSection(Section):
    """``dynamic_batch``: what the ``shrink_batch`` and ``grow_batch`` actions do to a ``DynamicBatch`` (docs/alerts.md)."""

    #: ``shrink_batch`` multiplies the batch size by this, ``grow_batch`` divides it by it (within the DynamicBatch's min, max).
    factor: float = Field(default=0.5, gt=0, lt=1)
    #: How the learning rate follows a new batch size, from the step the batch changes: not at all, in proportion,
    #: or by the square root of the ratio.
    scale_lr: Literal["none", "linear", "sqrt"] = "none"
    #: GRAPH mode: ``once``, mindwatch makes the train cell's batch axis dynamic (one graph for every size; each step
    #: costs more, ``bench batch``); ``per_size``, the cell stays static and compiles once for each size it meets.
    compile: Literal["once", "per_size"] = "once"


class PrometheusSection(Section):
    """An opt-in ``/metrics`` endpoint in each training process (see docs/prometheus.md)."""

    enabled: bool = False
    #: Rank with local rank L serves on ``port + L`` (``LOCAL_RANK``, or ``DEVICE_ID`` under msrun).
    port: int = Field(default=9400, ge=1, le=65535)
    #: Loopback by default; ``0.0.0.0`` lets a Prometheus on another machine scrape it.
    host: str = Field(default="127.0.0.1", min_length=1)


class _AlertsSettings(Section):
    """Alert rules, the stall watchdog and the actions they request (docs/alerts.md).

    Each rule's own section (``alerts.spike``, ...) comes from its module in
    :mod:`mindwatch.alerts.rules` (see :class:`AlertsSection`).
    """

    enabled: bool = True

    @model_validator(mode="before")
    @classmethod
    def _early_stopping_on_when_given(cls, data: Any) -> Any:
        return early_stopping_given(data)

    #: The same rule (and metric) does not fire again within this many seconds.
    cooldown_secs: float = Field(default=300.0, ge=0)
    #: Seconds without a step end before the run counts as stalled; null: derived from the step time.
    stall_timeout: float | None = Field(default=None, gt=0)
    #: The derived stall timeout is ``max(stall_floor, stall_factor x median seconds between records)``.
    stall_floor: float = Field(default=60.0, gt=0)
    stall_factor: float = Field(default=10.0, gt=1)
    #: Seconds from the start of training to the first step end (compilation and the first batch
    #: included) before the run counts as stalled; null: no limit before the first step.
    first_step_timeout: float | None = Field(default=1800.0, gt=0)
    #: ``lr_backoff`` multiplies the learning rate by this.
    lr_backoff_factor: float = Field(default=0.5, gt=0, lt=1)

    if TYPE_CHECKING:  # the rule sections are added from the registry below

        def __getattr__(self, key: str) -> Any: ...


if TYPE_CHECKING:
    AlertsSection = _AlertsSettings
else:
    #: ``alerts``: the settings above plus one section per registered rule, named by its key.
    AlertsSection = create_model(
        "AlertsSection",
        __base__=_AlertsSettings,
        __doc__=_AlertsSettings.__doc__,
        **{spec.key: (spec.settings, Field(default_factory=spec.settings)) for spec in rule_specs()},
    )


class EvaluationSettings(Section):
    """``evaluation``: what a training is judged by."""

    #: The metric the rules judge (``eval/loss``; a bare ``loss`` means ``eval/loss``); default: ``eval/loss`` when
    #: recorded, else ``Model.fit``'s ``eval/eval_loss``, else the first metric of the first evaluation by name.
    primary: str | None = Field(default=None, min_length=1)
    #: ``min`` (a loss) or ``max`` (an accuracy); default: ``max`` for a name that reads as a score, else ``min``.
    mode: Literal["min", "max"] | None = None
    #: In a multi-rank run, the value the rules judge: rank 0's (``zero``), or the ranks' mean (``mean``: ranks that
    #: each evaluate a shard).
    ranks: Literal["zero", "mean"] = "zero"
    #: The loss is a token cross-entropy: record ``perplexity`` = exp(loss) each step and ``eval/perplexity``.
    perplexity: bool = False
    #: Save ``checkpoints/best.ckpt`` at each new best evaluation (rank 0).
    keep_best: bool = False

    @model_validator(mode="before")
    @classmethod
    def _named_mode(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("mode") not in (None, "min", "max"):
            raise ValueError(f"evaluation.mode is {data['mode']!r}: use min (a loss) or max (an accuracy)")
        return data


class RewindSettings(Section):
    """``monitor_config.rewind``: snapshots of the training's state, and how a ``rewind`` action uses them (docs/alerts.md).

    Example::

        rewind: {every: 100, keep: 2, skip: 50, max: 3, then: stop}
    """

    #: A snapshot of the weights and the optimizer's state (in host memory) after every ``every``-th step.
    every: int = Field(default=100, ge=1)
    #: The newest ``keep`` snapshots are kept (memory: ``keep`` x the weights and the optimizer's state).
    keep: int = Field(default=2, ge=1)
    #: After a rewind, the next ``skip`` batches are passed over without updating the model.
    skip: int = Field(default=50, ge=0)
    #: Rewinds a run may do; a further request does ``then`` instead.
    max: int = Field(default=3, ge=1)
    then: Literal["stop", "checkpoint", "dump_stacks"] = "stop"


class ProfileSettings(Section):
    """``monitor_config.profile``: what the ``profile`` action records with MindSpore's profiler (docs/profiling.md).

    Example::

        profile: {steps: 5, max: 3, activities: [CPU], profiler_level: Level1, with_stack: false}
    """

    #: Steps a profile records, from the step after the boundary that took the request.
    steps: int = Field(default=5, ge=1, le=1000)
    #: Profiles a run may take; a further request is answered with why not.
    max: int = Field(default=3, ge=1)
    #: MindSpore's ``ProfilerActivity`` names (``CPU``, ``NPU``, ``GPU``); null: what the device has (CPU with its
    #: accelerator's).
    activities: list[Literal["CPU", "NPU", "GPU"]] | None = None
    #: MindSpore's ``ProfilerLevel`` (``LevelNone``, ``Level0``, ``Level1``, ``Level2``); null: MindSpore's default.
    profiler_level: Literal["LevelNone", "Level0", "Level1", "Level2"] | None = None
    #: Python call stacks in the trace (larger, slower to analyse).
    with_stack: bool = False


class CoordinationSettings(Section):
    """Coordinated actions (docs/distributed.md): every rank carries out an action at the same step."""

    #: Agree on a step with every rank (multi-rank runs); false: each rank acts alone on its own rules.
    enabled: bool = True
    #: Seconds between two looks at ``control/`` (rank 0: requests; every rank: decisions).
    poll_secs: float = Field(default=0.1, gt=0)
    #: How far ahead rank 0 schedules an action, in seconds of training (at least 3 x poll_secs).
    margin_secs: float = Field(default=1.0, gt=0)
    #: ... and in steps, at least.
    min_margin_steps: int = Field(default=2, ge=1)
    #: A request no decision covers after this many seconds (rank 0 gone) is carried out by its rank alone.
    decide_timeout: float = Field(default=10.0, gt=0)
    #: A loop of your own sums the cross-rank signal every N steps (one small AllReduce, ~0.6 ms on CPU): an action
    #: one rank asks for is carried out by every rank at the next such step. Our train cells sum it inside every step.
    loop_every: int = Field(default=10, ge=1)


class DistributedSection(Section):
    """Distributed training (docs/distributed.md): run-id agreement and the cross-rank rules on rank 0."""

    #: Seconds ranks > 0 wait for rank 0 to publish the run id at train begin.
    rendezvous_timeout: float = Field(default=300.0, gt=0)
    #: Rank 0 reads the other ranks' files at most this often (seconds).
    poll_secs: float = Field(default=1.0, gt=0)
    straggler: StragglerSettings = Field(default_factory=StragglerSettings)
    hang: HangSettings = Field(default_factory=HangSettings)
    coordination: CoordinationSettings = Field(default_factory=CoordinationSettings)
    #: When rank 0 sees a rank die: ``wait`` (alert only) or ``stop`` (the survivors end ``stopped``).
    on_rank_lost: Literal["wait", "stop"] = "wait"
    #: ``on_rank_lost: stop``: seconds a survivor waits for a step boundary before it ends its process.
    stop_grace: float = Field(default=3.0, gt=0)
    #: Seconds between rank 0's liveness checks of the ranks on its host (a signal 0 per pid).
    liveness_secs: float = Field(default=0.1, gt=0)
    #: A rank whose host stops answering on the lifeline (power, network: no packet comes back) is named lost within
    #: about this many seconds (TCP keep-alive probes; on any host, with or without a shared folder).
    lifeline_keepalive_secs: float = Field(default=30.0, ge=3)


#: What a notify channel can be told: alerts (at or above its ``min_severity``) and the end of the run.
NotifyEvent = Literal["alerts", "end"]

#: The services a webhook channel posts to (``type``); ``email`` is the other channel (:class:`EmailChannel`).
WebhookType = Literal["dingtalk", "feishu", "wecom", "slack", "webhook"]

#: Webhook types whose robots sign requests with a secret.
SIGNED_WEBHOOKS: tuple[WebhookType, ...] = ("dingtalk", "feishu")


def http_url(url: str) -> str:
    """``url`` when it is an http:// or https:// address (a webhook's, from the config or its ``url_env``)."""
    if not url.startswith(("http://", "https://")):
        raise ValueError("url must start with http:// or https://")
    return url


_ALL_EVENTS: tuple[NotifyEvent, ...] = ("alerts", "end")


class ChannelSettings(Section):
    """What every notify channel has; the one set of defaults (``mindwatch.sinks.channels`` builds a channel from its
    section, :class:`NotifyChannel` or :class:`EmailChannel`)."""

    #: Alerts below this severity are not sent; the end-of-run message always is (when in ``events``). ``info`` adds
    #: what each action did (``intervention``), a stall's end (``resumed``) and a person's requests other than stop.
    min_severity: Severity = "warning"
    events: list[NotifyEvent] = Field(default_factory=lambda: list(_ALL_EVENTS), min_length=1)
    #: Seconds per request, and retries after a failed one.
    timeout: float = Field(default=5.0, gt=0)
    retries: int = Field(default=2, ge=0)
    #: Alerts of one rule within this many seconds of the first are one message (one event on several layers or ranks,
    #: a machine-wide slowdown); 0: a message an alert.
    group_secs: float = Field(default=2.0, ge=0)


class NotifyChannel(ChannelSettings):
    """One webhook: ``{type: dingtalk, url_env: DINGTALK_URL, secret_env: DINGTALK_SECRET}``.

    The URL (it holds the service's token) and the secret may come from environment variables;
    neither is ever logged or written to ``meta.json``.
    """

    type: WebhookType
    url: str | None = None
    url_env: str | None = None
    #: The signing secret of a DingTalk ("加签") or Feishu/Lark ("签名校验") robot, or ``secret_env`` naming its variable.
    secret: str | None = None
    secret_env: str | None = None

    @model_validator(mode="after")
    def _one_url(self) -> NotifyChannel:
        if (self.url is None) == (self.url_env is None):
            raise ValueError("give exactly one of 'url' or 'url_env' (the name of an environment variable holding the URL)")
        if self.url is not None:
            http_url(self.url)
        if (self.secret is not None or self.secret_env is not None) and self.type not in SIGNED_WEBHOOKS:
            raise ValueError("'secret' / 'secret_env' are for types 'dingtalk' and 'feishu' (signed robots) only")
        return self


class EmailChannel(ChannelSettings):
    """Email through an SMTP server: ``{type: email, host: smtp.example.com, sender: mw@example.com, to: [ops@example.com]}``.

    The user name and password come from environment variables only (``username_env``, ``password_env``),
    so neither can reach ``meta.json``.
    """

    type: Literal["email"]
    host: str = Field(min_length=1)
    #: Default: 465 with ``ssl``, else 25.
    port: int | None = Field(default=None, ge=1, le=65535)
    sender: str
    to: list[str] = Field(min_length=1)
    #: ``auto``: STARTTLS when the server offers it; ``true``: required (the message is not sent without it).
    starttls: Union[Literal["auto"], bool] = "auto"
    #: TLS from the first byte (SMTPS, usually port 465) instead of STARTTLS.
    ssl: bool = False
    username_env: str | None = None
    password_env: str | None = None

    @field_validator("sender")
    @classmethod
    def _sender_address(cls, v: str) -> str:
        return _email_address(v)

    @field_validator("to")
    @classmethod
    def _to_addresses(cls, v: list[str]) -> list[str]:
        return [_email_address(a) for a in v]

    @property
    def smtp_port(self) -> int:
        """``port``, else SMTPS' 465 with ``ssl`` and SMTP's 25 without."""
        return self.port or (465 if self.ssl else 25)

    @model_validator(mode="after")
    def _tls_and_login(self) -> EmailChannel:
        if self.ssl and self.starttls is True:
            raise ValueError("'ssl: true' is TLS from the start; it cannot be combined with 'starttls: true'")
        if (self.username_env is None) != (self.password_env is None):
            raise ValueError("give both 'username_env' and 'password_env' (to log in), or neither")
        return self


def _email_address(v: str) -> str:
    """``v`` when it is one RFC 5322 address (``ops@localhost`` and ``Ops <ops@example.com>`` included)."""
    from email.headerregistry import HeaderRegistry

    try:
        header: Any = HeaderRegistry()("to", v)  # an AddressHeader
        ok = len(header.addresses) == 1 and not header.defects
        ok = ok and bool(header.addresses[0].username) and bool(header.addresses[0].domain)
    except (IndexError, ValueError):
        ok = False
    if not ok or "\n" in v or "\r" in v:
        raise ValueError(f"{v!r} is not an email address")
    return v


class MonitorConfig(Section):
    """The whole ``monitor_config`` section. See docs/configuration.md for each key."""

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
    #: Also write ``columns.rank<R>/`` (binary columns readers open long runs from) at every flush.
    column_files: bool = True
    save_dir: Path = Path("./monitor_output")
    tensorboard: bool = False
    metrics: list[str] = Field(default_factory=lambda: list(DEFAULT_METRICS))
    callback: CallbackSection = Field(default_factory=CallbackSection)
    tags: Union[list[str], dict[str, str]] = Field(default_factory=list)
    #: Override the batch size / sequence length read from the batch shapes.
    batch_size: int | None = Field(default=None, ge=1)
    seq_length: int | None = Field(default=None, ge=1)
    throughput: ThroughputSection = Field(default_factory=ThroughputSection)
    attention_entropy: AttentionEntropy = Field(default_factory=AttentionEntropy)
    layers: LayersSection = Field(default_factory=LayersSection)
    #: A mixture of experts' routing statistics (``RouterStats``): how often they are measured.
    moe: MoeSection = Field(default_factory=MoeSection)
    #: Records waiting for the writer; when full, new records are dropped and counted.
    queue_size: int = Field(default=10_000, ge=16)
    prometheus: PrometheusSection = Field(default_factory=PrometheusSection)
    alerts: AlertsSection = Field(default_factory=AlertsSection)
    #: Skip the update of a step whose grad_norm (or loss) is far above its rolling mean (docs/alerts.md).
    skip_steps: SkipStepsSettings = Field(default_factory=SkipStepsSettings)
    #: Snapshots of the training's state for the ``rewind`` action; on when given or when an action lists ``rewind``.
    rewind: RewindSettings = Field(default_factory=RewindSettings)
    #: What the ``profile`` action records (steps, how many a run, MindSpore's profiler settings).
    profile: ProfileSettings = Field(default_factory=ProfileSettings)
    #: What ``shrink_batch`` / ``grow_batch`` do to the batch size of a ``DynamicBatch`` (docs/alerts.md).
    dynamic_batch: DynamicBatchSection = Field(default_factory=DynamicBatchSection)
    #: What evaluations are judged by (``primary``, ``mode``), how ranks agree on one, ``perplexity``, ``keep_best``.
    evaluation: EvaluationSettings = Field(default_factory=EvaluationSettings)
    notify: list[Annotated[Union[NotifyChannel, EmailChannel], Field(discriminator="type")]] = Field(default_factory=list)
    #: The dashboard's address (``http://host:8080``, serving this ``save_dir``): notifications link to the run's page.
    dashboard_url: str | None = Field(default=None, pattern=r"^https?://")
    distributed: DistributedSection = Field(default_factory=DistributedSection)
    #: Rules for ``mindwatch check`` (CI gate), e.g. ``"final(loss) < 2.5"``; parsed when the config loads.
    checks: list[str] = Field(default_factory=list)
    #: A training that starts again with the same ``run_name`` (or ``MINDWATCH_RUN_ID``): ``allow`` continues
    #: that run directory (or creates it), ``must`` requires it, ``never`` makes a new one (``_2``). See docs/resume.md.
    resume: Literal["never", "allow", "must"] = "allow"
    #: Raise instead of warning and falling back: a run directory that cannot be created or written, and a fault of
    #: mindwatch's own in a step hook (for tests and development).
    strict: bool = False
    #: After this many failing steps in a row (a fault of mindwatch's own), a rank stops recording (``monitor_failed``).
    max_failed_steps: int = Field(default=20, ge=1)

    @field_validator("project", "run_name")
    @classmethod
    def _folder_name(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not v.strip():
            raise ValueError("must not be empty: it names a folder")
        if "\0" in v or "/" in v or "\\" in v or v in {".", ".."}:
            raise ValueError("must be a plain folder name: no NUL byte, no '/' or '\\', not '.' or '..'")
        return v

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
        allowed = BUILTIN_METRICS
        bad = [m for m in v if m not in allowed]
        if bad:
            raise ValueError(f"unknown metric {bad[0]!r}; allowed: {', '.join(sorted(allowed))}")
        return v

    @field_validator("checks")
    @classmethod
    def _parsable_checks(cls, v: list[str]) -> list[str]:
        from mindwatch.checks.language import RuleError, parse_rule  # the rule parser is pure Python, no numpy

        for rule in v:
            try:
                parse_rule(rule)
            except RuleError as e:
                raise ValueError(f"bad rule:\n{e.pointed()}") from None
        return v

    @property
    def enabled_metrics(self) -> frozenset[str]:
        """The built-in metric names switched on, with aliases expanded."""
        return vocab.expand(self.metrics)

    @property
    def log_level(self) -> str:
        return self.callback.params.log_level

    @property
    def tensorboard_enabled(self) -> bool:
        return self.tensorboard or self.backend == "tensorboard"

    def snapshot(self) -> dict[str, Any]:
        """The config as plain JSON data, for ``meta.json``."""
        data = self.model_dump(mode="json")
        data["notify"] = [_masked_channel(c) for c in data.get("notify", [])]  # webhook tokens and secrets stay out
        return data


def _masked_channel(channel: dict[str, Any]) -> dict[str, Any]:
    out = dict(channel)
    url = out.get("url")
    if url:
        scheme, _, rest = url.partition("://")
        out["url"] = f"{scheme}://{rest.split('/', 1)[0].rpartition('@')[2]}/***"
    if out.get("secret"):
        out["secret"] = "***"
    return out


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
                raise ConfigError(f"monitor_config file not found: {path.absolute()}")
            text = path.read_text(encoding="utf-8")
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"monitor_config is not valid YAML: {e}") from None
    read = _read_section(data)
    try:
        cfg = MonitorConfig.model_validate(read.section)
    except ValidationError as e:
        raise ConfigError(_explain(e, "monitor_config", mindformers=bool(read.readings))) from None
    if read.readings:  # said now, before any run starts: its logging is this config's
        setup_logging(cfg.log_level)
    for line in read.warnings():
        log.warning("mindwatch: %s", line)
    if said := read.summary():
        log.info(said)
    return cfg


def setup_logging(level: str) -> None:
    """Give the ``mindwatch`` logger a console handler unless the application configured one."""
    logger = logging.getLogger("mindwatch")
    logger.setLevel(level)
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)


def _read_section(data: Any) -> ReadSection:
    """The ``monitor_config`` mapping in ``data`` (a whole YAML may hold it under that key), MindFormers' keys read."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"monitor_config must be a mapping of keys to values, got {type(data).__name__}")
    if "monitor_config" in data:
        data = data["monitor_config"] or {}
        if not isinstance(data, dict):
            raise ConfigError("monitor_config must be a mapping of keys to values")
    try:
        return read_mindformers_keys(data)
    except MindFormersKeyError as e:
        raise ConfigError(f"invalid monitor_config:\n  {e}") from None


def _explain(err: ValidationError, prefix: str, *, mindformers: bool = False) -> str:
    """``mindformers``: the section held MindFormers' keys, so an unknown top-level key is neither's."""
    lines = []
    for item in err.errors():
        path = ".".join([prefix, *(str(p) for p in item["loc"] if not _is_union_tag(p))])
        if item["type"] == "extra_forbidden":
            neither = f"; nor is it {OWNER} key ({', '.join(MINDFORMERS_KEYS)})" if mindformers and len(item["loc"]) == 1 else ""
            lines.append(f"{path}: unknown key; {_allowed_here(item['loc'])}{neither}")
        else:
            got = item.get("input")
            shown = f" (got {got!r})" if not isinstance(got, dict | list) else ""
            lines.append(f"{path}: {item['msg']}{shown}")
    return "invalid monitor_config:\n  " + "\n  ".join(dict.fromkeys(lines))


def _is_union_tag(p: Any) -> bool:
    # pydantic puts the tried union member ('float', 'Bound') into the location
    tags = {"float", "Bound", "list[str]", "dict[str,str]", "email", "dingtalk", "feishu", "wecom", "slack", "webhook"}
    return isinstance(p, str) and (p in tags or p.startswith("function-"))


def _allowed_here(loc: tuple[Any, ...]) -> str:
    model: Any = MonitorConfig
    for p in loc[:-1]:
        if _is_union_tag(p):
            continue
        field = getattr(model, "model_fields", {}).get(p) if isinstance(p, str) else None
        if field is None:
            return "see docs/configuration.md for the allowed keys"
        ann = field.annotation
        model = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
        if model is None:
            return "see docs/configuration.md for the allowed keys"
    return "allowed keys here: " + ", ".join(model.model_fields)
