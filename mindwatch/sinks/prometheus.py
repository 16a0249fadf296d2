"""An opt-in Prometheus ``/metrics`` endpoint inside each training process.

Example::

    # monitor_config:
    #   prometheus: {enabled: true, port: 9400}      # host: 127.0.0.1 unless you change it
    # each rank serves http://127.0.0.1:<9400 + local rank>/metrics:
    #   mindwatch_loss{project="gpt",rank="0",run="run_20261129_074500"} 2.31
    #   mindwatch_step{...} 120
    #   mindwatch_last_step_timestamp_seconds{...} 1.7643930001e+09

One gauge per metric, named ``mindwatch_<metric>`` with the run directory's metric names
(``mindwatch_grad_norm``, ``mindwatch_tokens_per_second``...); each family of :mod:`mindwatch.metrics`
is one gauge with a ``layer`` label (``attention_max_logit/<layer>`` becomes
``mindwatch_attention_max_logit{layer="<layer>"}``), but the MoE routing, whose series would multiply with the layers
and experts: the worst MoE layer's newest imbalance and dropped share are one series each
(``mindwatch_moe_imbalance_max``, ``mindwatch_moe_dropped_max``), and neither the expert load (``expert_load/...``) nor
the router's entropy is exported (the run directory holds them); an evaluation's results are gauges of their own, the newest
evaluation's (``eval/loss`` becomes ``mindwatch_eval_loss``, ``eval/accuracy`` ``mindwatch_eval_accuracy``, with
``mindwatch_eval_time`` and ``mindwatch_eval_samples``), plus ``mindwatch_step``,
``mindwatch_last_step_timestamp_seconds``, ``mindwatch_host_memory_total_gb``, and the counters
``mindwatch_nonfinite_values_total{metric}`` and ``mindwatch_alerts_total{rule,severity}``.
Every series carries ``project``, ``run`` and ``rank``. The gauges are set on the Monitor's
worker thread; the endpoint is prometheus_client's own server on a daemon thread, with a
registry of its own (never the process-global one). ``deploy/prometheus/alerts.yml`` and
``deploy/grafana/mindwatch.json`` are written against these names; docs/prometheus.md says
how to scrape them.
"""

from __future__ import annotations

import logging
import math
import re
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from mindwatch import metrics as vocab
from mindwatch.store.jsonl import metric_values
from mindwatch.store.sink import BaseSink
from mindwatch.system import host_memory_total_gb

log = logging.getLogger("mindwatch")

PREFIX = "mindwatch_"
LABELS = ("project", "run", "rank")
_INVALID = re.compile(r"[^a-zA-Z0-9_]")
#: The MoE families exported as one series, the largest of the MoE layers' newest values: ``mindwatch_<family>_max``.
_WORST_LAYER = (vocab.MOE_IMBALANCE, vocab.MOE_DROPPED)
#: The families not exported at all: the rest of the MoE routing (a series per expert, or per MoE layer).
_NOT_EXPORTED = tuple(m.name for m in vocab.MOE_FAMILIES if m.name not in _WORST_LAYER)


def metric_name(name: str) -> tuple[str, dict[str, str]]:
    """The Prometheus name (and extra labels) for a run-directory metric name."""
    member = vocab.family_of(name)  # "<family>/<layer>": one gauge, the layer as a label
    if member is not None:
        return PREFIX + member[0], {"layer": member[1]}
    sane = _INVALID.sub("_", name)
    return PREFIX + (sane if not sane[:1].isdigit() else "_" + sane), {}


def _help(key: str, name: str, extra: dict[str, str]) -> str:
    if vocab.is_eval(key):
        return f"mindwatch evaluation result {key!r}: the newest evaluation's (one value per evaluation)."
    return f"mindwatch metric {key if not extra else name[len(PREFIX) :]!r}."


def _worst_help(family: str) -> str:
    return f"mindwatch metric {family!r}: the largest of the MoE layers' newest values (the worst layer's)."


def _largest(values: Any) -> float:
    """The largest value; NaN when any is NaN (a layer that broke is the worst one, not one left out)."""
    found = list(values)
    return math.nan if any(math.isnan(v) for v in found) else max(found)


class PrometheusSink(BaseSink):
    """Serves one rank's newest values on ``http://<host>:<port>/metrics``.

    Example::

        sink = PrometheusSink(project="gpt", run="run_1", rank=0, port=9400)
        Monitor([writer, sink]).start()
        sink.url        # 'http://127.0.0.1:9400/metrics', or None when the port was taken

    A port that cannot be bound is a warning, not an error: training goes on without the endpoint.
    The endpoint stops with the run (``close``), so a finished run's series go stale in Prometheus.
    """

    def __init__(self, *, project: str, run: str, rank: int, port: int, host: str = "127.0.0.1") -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._labels = {"project": project, "run": run, "rank": str(rank)}
        self._gauges: dict[str, Gauge] = {}
        self._children: dict[str, Any] = {}
        self._skipped: set[str] = set()
        self._owners: dict[tuple[str, ...], str] = {}
        reg = self.registry
        # step and its timestamp get a series at the first step, not before: a 0 would read as "stalled since 1970"
        self._step = Gauge(f"{PREFIX}step", "Last recorded training step.", LABELS, registry=reg)
        self._last_t = Gauge(
            f"{PREFIX}last_step_timestamp_seconds", "Wall time (Unix seconds) of the last recorded step.", LABELS, registry=reg
        )
        Gauge(
            f"{PREFIX}host_memory_total_gb", "Memory this process may use (machine or cgroup limit), GB.", LABELS, registry=reg
        ).labels(**self._labels).set(host_memory_total_gb())
        self._nonfinite = Counter(
            f"{PREFIX}nonfinite_values", "Recorded values that were NaN or infinite.", [*LABELS, "metric"], registry=reg
        )
        for metric in vocab.TRAINING_SIGNALS:  # present from the start, so increase() sees the first NaN
            self._nonfinite.labels(**self._labels, metric=metric)
        self._alerts = Counter(
            f"{PREFIX}alerts", "Alerts raised by mindwatch's rules.", [*LABELS, "rule", "severity"], registry=reg
        )
        self._worst = {
            family: Gauge(f"{PREFIX}{family}_max", _worst_help(family), LABELS, registry=reg) for family in _WORST_LAYER
        }
        self._newest: dict[str, dict[str, float]] = {family: {} for family in _WORST_LAYER}  # family -> layer -> value
        own = ["step", "last_step_timestamp_seconds", "host_memory_total_gb", "nonfinite_values", "alerts"]
        own += [f"{family}_max" for family in _WORST_LAYER]
        self._reserved = {PREFIX + n + suffix for n in own for suffix in ("", "_total", "_created")}
        self.url: str | None = None
        self._server: Any = None
        try:
            self._server, _thread = start_http_server(port, addr=host, registry=reg)
        except OSError as e:
            log.warning(
                "mindwatch: cannot serve Prometheus metrics on %s:%d (%s); training continues without the endpoint. "
                "Set prometheus.port to a free port (each rank uses port + local rank).",
                host,
                port,
                e,
            )
            return
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{self._server.server_port}/metrics"
        log.info("mindwatch: Prometheus metrics at %s", self.url)

    # -- sink interface (worker thread) -----------------------------------
    def write(self, records: list[dict[str, Any]]) -> None:
        moe: set[str] = set()  # the worst-layer families these records hold
        for rec in records:
            for key, v in metric_values(rec):
                child = self._children.get(key)
                if child is None and (member := vocab.family_of(key)) is not None and member[0] in self._newest:
                    self._newest[member[0]][member[1]] = v
                    moe.add(member[0])
                    continue
                child = child or self._child(key)
                if child is None:
                    continue
                child.set(v)
                if not math.isfinite(v):
                    self._nonfinite.labels(**self._labels, metric=key).inc()
        for family in moe:
            self._worst[family].labels(**self._labels).set(_largest(self._newest[family].values()))
        last = next((rec for rec in reversed(records) if not vocab.is_evaluation(rec)), None)
        if last is None:  # only evaluations: no step was recorded (their time is no step's, the stall rule's clock)
            return
        step, t = last.get("step"), last.get("t")
        if isinstance(step, int):
            self._step.labels(**self._labels).set(step)
        if isinstance(t, (int, float)):
            self._last_t.labels(**self._labels).set(t)

    def alert(self, alert: dict[str, Any]) -> None:
        self._alerts.labels(
            **self._labels, rule=str(alert.get("rule", "unknown")), severity=str(alert.get("severity", "warning"))
        ).inc()

    def flush(self) -> None:
        pass

    def close(self, state: str, error: str | None = None, reason: str | None = None) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # -- internals ----------------------------------------------------------
    def _child(self, key: str) -> Any:
        if key in self._skipped:
            return None
        member = vocab.family_of(key)
        if member is not None and member[0] in _NOT_EXPORTED:
            self._skipped.add(key)
            return None
        name, extra = metric_name(key)
        owner = self._owners.setdefault((name, *extra.values()), key)
        if name in self._reserved or owner != key:  # e.g. 'val/acc' after 'val_acc': both would be mindwatch_val_acc
            self._skipped.add(key)
            clash = "one of mindwatch's own series" if name in self._reserved else f"metric {owner!r}"
            log.warning("mindwatch: metric %r is not exported to Prometheus: %s would clash with %s", key, name, clash)
            return None
        gauge = self._gauges.get(name)
        if gauge is None:
            gauge = self._gauges[name] = Gauge(
                name,
                _help(key, name, extra),
                [*LABELS, *extra],
                registry=self.registry,
            )
        child = self._children[key] = gauge.labels(**self._labels, **extra)
        return child
