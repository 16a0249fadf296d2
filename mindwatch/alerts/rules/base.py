"""What every alert rule shares: the :class:`Rule` protocol, :class:`RuleSpec` (how a rule plugs into the
config and the engine), and the rolling statistics rules are built from.

Example::

    class MyRule(RuleBase):
        name = "my_rule"

        def check(self, rec: Record) -> list[Alert]:
            v = value_of(rec, "loss")
            return [self._alert(rec, f"loss is {v}", metric="loss", value=v)] if v and v > 10 else []

    SPEC = RuleSpec("my_rule", MySettings, lambda s, ctx: [MyRule(ctx.rank, s.actions)], doc="loss above 10")

Rules run on the Monitor's worker thread, one record at a time (docs/architecture.md: threads).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

import numpy as np
from pydantic import Field

from mindwatch import metrics as vocab
from mindwatch.alerts.alert import Alert, make_alert
from mindwatch.schema import RuleSettings
from mindwatch.store.jsonl import decode_value
from mindwatch.store.layerfiles import LAYER_KEY, LayerRow
from mindwatch.units import format_number

Record = dict[str, Any]
#: The record keys that name a step's batch (``epoch``, its ``batch`` index in the epoch, its ``sample_ids``),
#: copied into every alert a rule raises on that record.
BATCH_KEYS: tuple[str, ...] = ("epoch", "batch", "sample_ids")


@dataclass(frozen=True)
class RuleContext:
    """What a rule's factory may read besides its own settings."""

    #: ``callback.params.warn_on_value``: metric -> a limit or a ``{above|below: x}`` bound.
    warn_on_value: Mapping[str, Any] = field(default_factory=dict)
    rank: int = 0
    #: Device memory total in GB, where the device reports it.
    device_total_gb: float | None = None
    #: The training thread runs the checks that must act on the very step (the MindSpore adapter: the non-finite
    #: rule's, ``nonfinite.checked_in_step``), so the worker's rules skip them.
    checks_in_step: bool = False
    #: ``monitor_config.evaluation``: the metric evaluations are judged by and its mode (an ``EvaluationSettings``).
    evaluation: Any = None


@dataclass(frozen=True)
class RuleSpec:
    """One alert rule as the rest of mindwatch sees it: its key under ``monitor_config.alerts``, its
    settings model (with the defaults), the factory that builds its rules, and its line in the docs.

    ``build`` is None for a rule another part runs (``stall``: the watchdog).
    """

    key: str
    settings: type[RuleSettings]
    build: Callable[[Any, RuleContext], Sequence[Rule]] | None
    doc: str


class Rule(Protocol):
    """Looks at each recorded step and returns the alerts it raises."""

    name: str

    def check(self, rec: Record) -> list[Alert]:
        """Alerts for this record (usually none)."""


def value_of(rec: Record, key: str) -> float | None:
    """A record's metric as a float (stored ``"nan"`` included), or None when absent."""
    raw = rec.get(key)
    if raw is None:
        return None
    if type(raw) is float:  # the common case, without the call
        return raw
    return decode_value(raw)


def data_share(rec: Record) -> float | None:
    """The share of the step spent waiting for data (``data_time / step_time``), or None."""
    dt, st = value_of(rec, "data_time"), value_of(rec, "step_time")
    if dt is None or st is None or not st > 0 or not math.isfinite(dt):
        return None
    return dt / st


class RollingMedian:
    """Median of the last ``window`` finite values (a sort of <= a few hundred floats: microseconds)."""

    def __init__(self, window: int) -> None:
        self.values: deque[float] = deque(maxlen=window)

    def add(self, v: float) -> None:
        if math.isfinite(v):
            self.values.append(v)

    def __len__(self) -> int:
        return len(self.values)

    @property
    def median(self) -> float:
        s = sorted(self.values)
        n = len(s)
        return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


class Streak:
    """A rolling median after a warm-up, and a count of anomalous values in a row.

    Example::

        streak = Streak(window=50, warmup=20, count=3)
        median = streak.feed(v, lambda v, median: v > 3 * median)   # the median when v completes 3 in a row, else None
    """

    def __init__(self, window: int, warmup: int, count: int) -> None:
        self.history = RollingMedian(window)
        self.warmup, self.count = warmup, count
        self.seen = 0
        self.run = 0

    def feed(self, v: float, anomalous: Callable[[float, float], bool]) -> float | None:
        fired = None
        if self.seen >= self.warmup and len(self.history):
            median = self.history.median
            if anomalous(v, median):
                self.run += 1
                if self.run == self.count:
                    fired = median
            else:
                self.run = 0
        self.seen += 1
        self.history.add(v)
        return fired


# -- evaluations: what the overfitting and early-stopping rules count --------------------------------------------
@dataclass(frozen=True)
class Evaluation:
    """One evaluation as the rules see it: the step and epoch it ran after, its primary metric's value."""

    step: int | None
    epoch: int | None
    value: float

    def where(self) -> str:
        return f"step {self.step}" + (f", epoch {self.epoch}" if self.epoch is not None else "")


class Progress:
    """The best evaluation so far and the evaluations in a row since that did not improve on it.

    Example::

        p = Progress("min", min_delta=0.0)
        p.add(Evaluation(10, 1, 0.9))    # True: the first is the best
        p.add(Evaluation(20, 2, 0.95))   # False; p.waited == 1, p.best.value == 0.9
    """

    def __init__(self, mode: Literal["min", "max"], min_delta: float = 0.0) -> None:
        self.mode, self.min_delta = mode, min_delta
        self.best: Evaluation | None = None
        #: Evaluations since the best that did not improve on it.
        self.waited = 0
        self.last: Evaluation | None = None

    def improves(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.best is None:
            return True
        if self.mode == "min":
            return value < self.best.value - self.min_delta
        return value > self.best.value + self.min_delta

    def add(self, ev: Evaluation) -> bool:
        """Count ``ev``; True when it is the new best."""
        self.last = ev
        if self.improves(ev.value):
            self.best, self.waited = ev, 0
            return True
        self.waited += 1
        return False


def not_improved(name: str, progress: Progress) -> str:
    """``eval/loss has not improved for 5 evaluations (best 0.55 at step 120, epoch 11)``."""
    best = progress.best
    since = f"{progress.waited} evaluation" + ("s" if progress.waited != 1 else "")
    if best is None:
        return f"{name} has no finite value in {since}"
    return f"{name} has not improved for {since} (best {format_number(best.value)} at {best.where()})"


def evaluation_of(rec: Record, name: str) -> Evaluation | None:
    """The evaluation ``rec`` records of ``name`` (None: it records none)."""
    value = value_of(rec, name)
    if value is None:
        return None
    epoch = rec.get("epoch")
    return Evaluation(rec.get("step"), int(epoch) if isinstance(epoch, int) else None, value)


SettingsT = TypeVar("SettingsT", bound=RuleSettings)


def settings_from(kind: type[SettingsT], settings: SettingsT | None, values: Mapping[str, Any]) -> SettingsT:
    """A rule's settings: ``settings`` as the config validated them, else ``values`` validated by ``kind``.

    Example::

        settings_from(SpikeSettings, None, {"factor": 4.0})    # the other fields: SpikeSettings' defaults

    A rule's defaults and limits are its settings class's, written once; ``SpikeRule("loss", factor=4)``
    in a test or a notebook is checked the same way as ``alerts.spike.factor: 4`` in a config.
    """
    if settings is not None and values:
        raise TypeError(f"pass {kind.__name__} or keywords, not both (got settings and {sorted(values)})")
    return settings if settings is not None else kind(**values)


class RuleBase:
    name = "rule"
    severity = "warning"

    def __init__(self, rank: int, actions: Sequence[str]) -> None:
        self.rank = rank
        self.actions = list(actions)

    def _alert(self, rec: Record, message: str, **kw: Any) -> Alert:
        kw.setdefault("severity", self.severity)
        kw.setdefault("t", rec.get("t"))  # the anomalous step's wall time
        kw.setdefault("actions", self.actions)
        for key in BATCH_KEYS:  # where the step's batch came from (docs/alerts.md: the batch behind an alert)
            if rec.get(key) is not None:
                kw.setdefault(key, rec[key])
        return make_alert(self.name, step=rec.get("step"), rank=self.rank, message=message, **kw)


_MOMENTS = frozenset(m.name for m in vocab.MOMENT_FAMILIES)


def _no_update(rec: Record) -> bool:
    """Whether the step applied no update on purpose (a loss-scale overflow, a skipped step, an lr of 0)."""
    return bool(rec.get(vocab.OVERFLOW) or rec.get(vocab.SKIPPED)) or rec.get(vocab.LR) == 0


class LayerRule(RuleBase):
    """Fires for a layer once its statistic ``stat`` was anomalous for ``count`` measured steps in a row."""

    name = "layer"
    stat = "grad_norm"
    #: Skip the steps that applied no update on purpose: a loss-scale overflow, ``skip_steps``' skip, an lr of 0 (a
    #: warm-up's first step). A frozen-weights rule judging them would cry wolf.
    skip_overflow = False

    def __init__(self, *, count: int = 1, rank: int = 0, actions: Sequence[str] = ()) -> None:
        super().__init__(rank, actions)
        self.count = count
        self.layers: tuple[str, ...] = ()
        self.run = np.zeros(0, np.int64)

    def judge(self, values: np.ndarray) -> np.ndarray:
        """A bool per layer: anomalous at this step."""
        raise NotImplementedError

    def threshold(self, j: int) -> float | None:
        """The limit layer ``j`` crossed, for the alert."""
        return None

    def describe(self, layer: str, value: float, j: int) -> str:
        raise NotImplementedError

    def check(self, rec: Record) -> list[Alert]:
        row = rec.get(LAYER_KEY)
        if not isinstance(row, LayerRow) or (self.skip_overflow and _no_update(rec)) or not row.has(self.stat):
            return []
        if row.local and self.stat == vocab.GRAD_NORM:  # one rank's batch, before the all-reduce: not the training's
            return []
        if not row.moments_settled and self.stat in _MOMENTS:  # v still grows from 0: no baseline yet
            return []
        return self.judge_layers(rec, row.layers, np.asarray(row.values(self.stat), np.float64))

    def judge_layers(self, rec: Record, layers: tuple[str, ...], values: np.ndarray) -> list[Alert]:
        """Judge ``values`` (one per layer of ``layers``) of ``rec``'s step: an alert for each layer whose anomaly has
        lasted ``count`` measured steps (once per streak)."""
        if layers != self.layers:  # the first row (or another model): start counting afresh
            self.layers, self.run = layers, np.zeros(len(layers), np.int64)
        bad = self.judge(values)
        self.run = np.where(bad, self.run + 1, 0)
        out = []
        for j in np.flatnonzero(self.run == self.count):  # once per streak
            layer, v = self.layers[j], float(values[j])
            out.append(
                self._alert(
                    rec,
                    self.describe(layer, v, j),
                    metric=f"{self.stat}/{layer}",
                    value=v,
                    threshold=self.threshold(j),
                    layer=layer,
                )
            )
        return out


class LayerFloorRule(LayerRule):
    """``<stat>/<layer>`` below ``floor`` for ``count`` measured steps in a row (loss-scale overflow steps skipped)."""

    skip_overflow = True
    #: What it means for the layer, in the alert: "its gradient vanished".
    meaning = "is below its floor"

    def __init__(self, *, floor: float, count: int = 3, rank: int = 0, actions: Sequence[str] = ()) -> None:
        super().__init__(count=count, rank=rank, actions=actions)
        self.floor = floor

    def judge(self, values: np.ndarray) -> np.ndarray:
        return values < self.floor

    def threshold(self, j: int) -> float:
        return self.floor

    def describe(self, layer: str, value: float, j: int) -> str:
        why = f"{self.stat} {value:.3g}, below {self.floor:g} for {self.count} measured steps"
        return f"layer {layer}: {self.meaning} ({why})"


class LayerMedianSettings(RuleSettings):
    """The settings of a rule that judges each layer against its own rolling median (``layer_spike``, ``layer_collapse``)."""

    #: The limit: ``factor`` x (a spike) or 1/``factor`` of (a collapse) the median of the last ``window`` measured values.
    factor: float = Field(default=10.0, gt=1)
    window: int = Field(default=20, ge=3)
    #: Measured values of a layer before it is judged.
    warmup: int = Field(default=5, ge=1)
    count: int = Field(default=1, ge=1)


class LayerMedianRule(LayerRule):
    """``<stat>/<layer>`` above ``factor`` x (``rises``) or below 1/``factor`` of its own rolling median: the median of
    the layer's last ``window`` measured values, once ``warmup`` of them are in. NaN/Inf belongs to the non-finite rule
    and stays out of the median; a layer whose median is 0 is not judged."""

    skip_overflow = True
    #: Whether the rule fires on a rise above the median (a spike) or on a fall below it (a collapse).
    rises = True
    #: The rule's settings: its key under ``monitor_config.alerts``, with the statistics it may watch.
    settings_kind: type[LayerMedianSettings] = LayerMedianSettings

    def __init__(
        self, settings: LayerMedianSettings | None = None, *, rank: int = 0, stat: str | None = None, **values: Any
    ) -> None:
        """``settings`` as the config validated them; keywords (``LayerSpikeRule(factor=8)``) are validated the same
        way. ``stat``: the statistic this one watches (one of ``settings.stats``; by default the class's ``stat``)."""
        s = settings_from(self.settings_kind, settings, values)
        super().__init__(count=s.count, rank=rank, actions=s.actions)
        self.stat = stat or self.stat
        self.factor, self.window, self.warmup = s.factor, s.window, s.warmup
        self.history = np.zeros((0, 0))
        self.seen = 0
        self.median = np.zeros(0)

    @property
    def stat_words(self) -> str:
        """The statistic in an alert's words: ``gradient norm``, ``adam_v norm``."""
        return "gradient norm" if self.stat == vocab.GRAD_NORM else f"{self.stat.removesuffix('_norm')} norm"

    def limits(self) -> np.ndarray:
        """Each layer's limit at this step, from the median of the values before it."""
        return self.factor * self.median if self.rises else self.median / self.factor

    def judge(self, values: np.ndarray) -> np.ndarray:
        if self.history.shape[1] != len(values):
            self.history, self.seen = np.full((self.window, len(values)), np.nan), 0
        with np.errstate(invalid="ignore"):
            self.median = np.nanmedian(self.history, axis=0) if self.seen else np.full(len(values), np.nan)
            beyond = values > self.limits() if self.rises else values < self.limits()
            bad = (self.seen >= self.warmup) & np.isfinite(values) & beyond & (self.median > 0)
        self.history[self.seen % self.window] = np.where(np.isfinite(values), values, np.nan)
        self.seen += 1
        return bad

    def threshold(self, j: int) -> float:
        return float(self.limits()[j])

    @classmethod
    def each_stat(cls, settings: Any, ctx: RuleContext) -> list[LayerMedianRule]:
        """The rule's factory (its ``RuleSpec.build``): one rule a statistic of ``settings.stats``."""
        return [cls(settings, rank=ctx.rank, stat=stat) for stat in settings.stats]
