"""Alert rules over the recorded steps, run on the Monitor's worker thread (never on the training thread).

Example::

    from mindwatch.alerts.rules import RuleEngine, build_rules

    engine = RuleEngine(build_rules(config, rank=0), emit=monitor.alert, control=control, cooldown_secs=300)
    Monitor([writer, engine, ...])        # the engine is a sink: it sees every record batch

Each rule looks at one record at a time and returns the alerts it raises (usually none).
The engine applies the per-rule cooldown, files the requested actions on the
:class:`~mindwatch.monitor.control.Control` and emits the alert to every sink.

Rules (defaults in :mod:`mindwatch.config`, documented in docs/alerts.md):

- :class:`ThresholdRule`: ``warn_on_value`` limits (a bare number is an upper bound, a lower bound for throughput);
- :class:`NonFiniteRule`: NaN/Inf in loss or grad_norm (grad_norm is ignored on loss-scale overflow steps);
- :class:`SpikeRule`: value > factor x rolling median, ``count`` records in a row, after a warm-up;
- :class:`DivergenceRule`: a significant rising trend of the loss over a window;
- :class:`ThroughputDropRule`: throughput below a fraction of its rolling median while the loss looks normal;
- :class:`DataWaitRule`: the wait for data is more than a share of the step time;
- :class:`MemoryRule`: host or device memory above a fraction of the total.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from mindwatch.alerts.alert import Alert, Cooldown, make_alert
from mindwatch.monitor.control import Control
from mindwatch.store.jsonl import decode_value
from mindwatch.system import host_memory_total_gb

if TYPE_CHECKING:
    from mindwatch.config import MonitorConfig

log = logging.getLogger("mindwatch")

Record = dict[str, Any]

#: Metrics where more is better: a bare ``warn_on_value`` limit on them is a lower bound.
THROUGHPUT_METRICS = frozenset({"samples_per_second", "tokens_per_second"})


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


class _Base:
    name = "rule"
    severity = "warning"

    def __init__(self, rank: int, actions: Sequence[str]) -> None:
        self.rank = rank
        self.actions = list(actions)

    def _alert(self, rec: Record, message: str, **kw: Any) -> Alert:
        kw.setdefault("severity", self.severity)
        kw.setdefault("t", rec.get("t"))  # the anomalous step's wall time
        return make_alert(self.name, step=rec.get("step"), rank=self.rank, message=message, actions=self.actions, **kw)


class ThresholdRule(_Base):
    """``warn_on_value``: fires when ``metric`` is above ``above`` or below ``below``."""

    name = "threshold"

    def __init__(self, metric: str, *, above: float | None = None, below: float | None = None, rank: int = 0, actions=()) -> None:
        super().__init__(rank, actions)
        if (above is None) == (below is None):
            raise ValueError("ThresholdRule needs exactly one of above= or below=")
        self.metric, self.above, self.below = metric, above, below

    def check(self, rec: Record) -> list[Alert]:
        v = value_of(rec, self.metric)
        if v is None or not math.isfinite(v):
            return []  # NaN/Inf belongs to the non-finite rule
        if self.above is not None and v > self.above:
            side, limit = "above", self.above
        elif self.below is not None and v < self.below:
            side, limit = "below", self.below
        else:
            return []
        message = f"{self.metric} {v:.4g} is {side} the limit {limit:.4g}"
        return [self._alert(rec, message, metric=self.metric, value=v, threshold=limit)]


def threshold_rules(warn_on_value: dict[str, Any], *, rank: int = 0, actions: Sequence[str] = ()) -> list[ThresholdRule]:
    """Rules for ``callback.params.warn_on_value``: ``{loss: 50, tokens_per_second: 1000, x: {below: 2}}``."""
    rules = []
    for metric, limit in warn_on_value.items():
        above = getattr(limit, "above", None) if not isinstance(limit, dict) else limit.get("above")
        below = getattr(limit, "below", None) if not isinstance(limit, dict) else limit.get("below")
        if isinstance(limit, (int, float)):
            above, below = (None, float(limit)) if metric in THROUGHPUT_METRICS else (float(limit), None)
        rules.append(ThresholdRule(metric, above=above, below=below, rank=rank, actions=actions))
    return rules


class NonFiniteRule(_Base):
    """NaN or Inf in ``metrics``. On a loss-scale overflow step an infinite grad_norm is expected and ignored."""

    name = "nonfinite"
    severity = "error"

    def __init__(self, metrics: Iterable[str] = ("loss", "grad_norm"), *, rank: int = 0, actions=()) -> None:
        super().__init__(rank, actions)
        self.metrics = tuple(metrics)

    def check(self, rec: Record) -> list[Alert]:
        for metric in self.metrics:
            v = value_of(rec, metric)
            if v is None or math.isfinite(v):
                continue
            if metric != "loss" and rec.get("overflow"):
                continue  # the loss-scale cell skipped this update on purpose
            return [self._alert(rec, f"{metric} is {v} at step {rec.get('step')}", metric=metric, value=v)]
        return []


class SpikeRule(_Base):
    """``metric`` above ``factor`` x its rolling median for ``count`` recorded steps in a row, after ``warmup`` values."""

    name = "spike"

    def __init__(
        self, metric: str, *, factor: float = 3.0, window: int = 50, warmup: int = 20, count: int = 3, rank: int = 0, actions=()
    ) -> None:
        super().__init__(rank, actions)
        self.metric, self.factor, self.count = metric, factor, count
        self.streak = Streak(window, warmup, count)

    def check(self, rec: Record) -> list[Alert]:
        v = value_of(rec, self.metric)
        if v is None or not math.isfinite(v):
            return []
        median = self.streak.feed(v, lambda v, m: m > 0 and v > self.factor * m)
        if median is None:
            return []
        in_a_row = f" for {self.count} recorded steps in a row" if self.count > 1 else ""
        msg = f"{self.metric} spiked to {v:.4g}, above {self.factor:g} x its rolling median {median:.4g}{in_a_row}"
        return [self._alert(rec, msg, metric=self.metric, value=v, threshold=self.factor * median)]


class DivergenceRule(_Base):
    """The loss rising over the last ``window`` recorded steps, beyond the noise.

    A least-squares line through the window must rise by more than ``min_rise`` x the
    window's median, and its slope must be ``min_t`` standard errors above zero.
    """

    name = "divergence"

    def __init__(
        self, metric: str = "loss", *, window: int = 50, min_rise: float = 0.2, min_t: float = 4.0, rank: int = 0, actions=()
    ) -> None:
        super().__init__(rank, actions)
        self.metric, self.min_rise, self.min_t = metric, min_rise, min_t
        self.values: deque[float] = deque(maxlen=window)
        n = window
        self._xm = (n - 1) / 2
        self._sxx = sum((i - self._xm) ** 2 for i in range(n))

    def check(self, rec: Record) -> list[Alert]:
        v = value_of(rec, self.metric)
        if v is None or not math.isfinite(v):
            return []
        ys = self.values
        ys.append(v)
        n = ys.maxlen or 0
        if len(ys) < n:
            return []
        ym = sum(ys) / n
        xm, sxx = self._xm, self._sxx
        slope = sum((i - xm) * (y - ym) for i, y in enumerate(ys)) / sxx
        if slope <= 0:
            return []
        rise = slope * (n - 1)
        level = abs(sorted(ys)[n // 2]) or 1e-12
        if rise < self.min_rise * level:
            return []
        ssr = sum((y - (ym + slope * (i - xm))) ** 2 for i, y in enumerate(ys))
        se = math.sqrt(ssr / (n - 2) / sxx) if ssr > 0 else 0.0
        t = slope / se if se > 0 else math.inf
        if t < self.min_t:
            return []
        pct = 100 * rise / level
        msg = f"{self.metric} is diverging: up {rise:.4g} ({pct:.0f} %) over the last {n} recorded steps (t = {t:.1f})"
        return [self._alert(rec, msg, metric=self.metric, value=v, threshold=ym - slope * xm + self.min_rise * level)]


class ThroughputDropRule(_Base):
    """Throughput below ``fraction`` x its rolling median for ``count`` records while the loss looks normal
    (finite and not spiking): the accelerator is likely waiting ("fake training")."""

    name = "throughput_drop"

    def __init__(
        self,
        metric: str = "samples_per_second",
        *,
        fraction: float = 0.5,
        window: int = 50,
        warmup: int = 20,
        count: int = 3,
        loss_factor: float = 3.0,
        rank: int = 0,
        actions=(),
    ) -> None:
        super().__init__(rank, actions)
        self.metric, self.fraction, self.loss_factor = metric, fraction, loss_factor
        self.streak = Streak(window, warmup, count)
        self.loss = RollingMedian(window)

    def check(self, rec: Record) -> list[Alert]:
        v = value_of(rec, self.metric)
        if v is None or not math.isfinite(v):
            return []
        loss = value_of(rec, "loss")
        loss_normal = loss is None or (
            math.isfinite(loss) and (len(self.loss) == 0 or loss <= self.loss_factor * abs(self.loss.median))
        )
        median = self.streak.feed(v, lambda v, m: v < self.fraction * m and loss_normal)
        if loss is not None:
            self.loss.add(loss)
        if median is None:
            return []
        share = _data_share(rec)
        why = f"; {100 * share:.0f} % of the step is spent waiting for data" if share is not None else ""
        msg = (
            f"{self.metric} fell to {v:.4g}, below {self.fraction:g} x its rolling median {median:.4g}, "
            f"while the loss looks normal{why}"
        )
        return [self._alert(rec, msg, metric=self.metric, value=v, threshold=self.fraction * median)]


def _data_share(rec: Record) -> float | None:
    dt, st = value_of(rec, "data_time"), value_of(rec, "step_time")
    if dt is None or st is None or not st > 0 or not math.isfinite(dt):
        return None
    return dt / st


class DataWaitRule(_Base):
    """``data_time / step_time`` above ``limit`` for ``count`` records in a row: the input pipeline is the bottleneck."""

    name = "data_wait"

    def __init__(self, *, limit: float = 0.5, warmup: int = 5, count: int = 5, rank: int = 0, actions=()) -> None:
        super().__init__(rank, actions)
        self.limit, self.warmup, self.count = limit, warmup, count
        self.seen = 0
        self.run = 0

    def check(self, rec: Record) -> list[Alert]:
        share = _data_share(rec)
        if share is None:
            return []
        self.seen += 1
        if self.seen <= self.warmup:
            return []
        if share <= self.limit:
            self.run = 0
            return []
        self.run += 1
        if self.run != self.count:
            return []
        msg = (
            f"the step waits for data {100 * share:.0f} % of its time (limit {100 * self.limit:.0f} %): "
            "the input pipeline, not the model, is the bottleneck (more workers, prefetch, faster storage)"
        )
        return [self._alert(rec, msg, metric="data_time", value=share, threshold=self.limit)]


class MemoryRule(_Base):
    """Host (``host_rss_gb``) or device (``device_mem_gb``) memory above ``fraction`` of the total."""

    name = "memory"

    def __init__(
        self,
        *,
        fraction: float = 0.9,
        host_total_gb: float | None = None,
        device_total_gb: float | None = None,
        rank: int = 0,
        actions=(),
    ) -> None:
        super().__init__(rank, actions)
        self.fraction = fraction
        self.totals = {"host_rss_gb": host_total_gb, "device_mem_gb": device_total_gb}

    def check(self, rec: Record) -> list[Alert]:
        out = []
        for metric, total in self.totals.items():
            v = value_of(rec, metric)
            if v is None or not total or not math.isfinite(v) or v <= self.fraction * total:
                continue
            where = "host" if metric == "host_rss_gb" else "device"
            msg = f"{where} memory at {v:.2f} GB of {total:.2f} GB ({100 * v / total:.0f} %, limit {100 * self.fraction:.0f} %)"
            out.append(self._alert(rec, msg, metric=metric, value=v, threshold=self.fraction * total))
        return out


def build_rules(
    config: MonitorConfig, *, rank: int = 0, device_total_gb: float | None = None, nonfinite_checked: Iterable[str] = ()
) -> list[Rule]:
    """The rules ``config`` switches on (``alerts:`` and ``callback.params.warn_on_value``).

    ``nonfinite_checked``: metrics the training loop checks for NaN/Inf itself (the MindSpore
    callback does for loss and grad_norm when the rule has actions, to act on the same step).
    """
    a = config.alerts
    if not a.enabled:
        return []
    rules: list[Rule] = []
    if a.thresholds.enabled:
        rules += threshold_rules(config.callback.params.warn_on_value, rank=rank, actions=a.thresholds.actions)
    left = [m for m in a.nonfinite.metrics if m not in set(nonfinite_checked)]
    if a.nonfinite.enabled and left:
        rules.append(NonFiniteRule(left, rank=rank, actions=a.nonfinite.actions))
    if a.spike.enabled:
        s = a.spike
        rules += [
            SpikeRule(m, factor=s.factor, window=s.window, warmup=s.warmup, count=s.count, rank=rank, actions=s.actions)
            for m in s.metrics
        ]
    if a.divergence.enabled:
        d = a.divergence
        rules.append(DivergenceRule(d.metric, window=d.window, min_rise=d.min_rise, min_t=d.min_t, rank=rank, actions=d.actions))
    if a.throughput_drop.enabled:
        t = a.throughput_drop
        rules.append(
            ThroughputDropRule(
                t.metric, fraction=t.fraction, window=t.window, warmup=t.warmup, count=t.count, rank=rank, actions=t.actions
            )
        )
    if a.data_wait.enabled:
        w = a.data_wait
        rules.append(DataWaitRule(limit=w.limit, warmup=w.warmup, count=w.count, rank=rank, actions=w.actions))
    if a.memory.enabled:
        m = a.memory
        rules.append(
            MemoryRule(
                fraction=m.fraction,
                host_total_gb=host_memory_total_gb(),
                device_total_gb=m.device_total_gb or device_total_gb,
                rank=rank,
                actions=m.actions,
            )
        )
    return rules


class RuleEngine:
    """Sink that runs ``rules`` over every record, with a cooldown per (rule, metric).

    An alert that passes the cooldown gets ``suppressed`` (how many were held back since the
    last one), its actions are filed on ``control``, and it goes to ``emit`` (``Monitor.alert``).
    A rule that raises is disabled with a warning; monitoring goes on.
    """

    def __init__(
        self,
        rules: Sequence[Rule],
        emit: Callable[[Alert], None],
        *,
        control: Control | None = None,
        cooldown_secs: float = 300.0,
    ) -> None:
        self.rules = list(rules)
        self.emit = emit
        self.control = control
        self.cooldown = Cooldown(cooldown_secs)
        self.fired = 0

    def write(self, records: list[Record]) -> None:
        for rec in records:
            for rule in list(self.rules):
                try:
                    alerts = rule.check(rec)
                except Exception as e:  # a broken rule must not stop the others
                    self.rules.remove(rule)
                    log.warning("mindwatch: alert rule %s failed (%r) and is switched off; training continues", rule.name, e)
                    continue
                for alert in alerts:
                    self.fire(alert)

    def fire(self, alert: Alert) -> bool:
        """Emit ``alert`` unless its (rule, metric) is cooling down; returns whether it went out."""
        key = (alert.get("rule"), alert.get("metric"))
        if not self.cooldown.allow(key):
            return False
        held = self.cooldown.take_suppressed(key)
        if held:
            alert["suppressed"] = held
        if self.control is not None and alert.get("actions"):
            self.control.request(alert)
        self.fired += 1
        self.emit(alert)
        return True

    def flush(self) -> None:
        pass

    def close(self, state: str, error: str | None = None, reason: str | None = None) -> None:
        pass
