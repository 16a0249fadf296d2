"""Alert delivery: every sink with ``alert()`` gets each alert on the worker thread; alerts.jsonl and the console line."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import mindwatch
from mindwatch.alerts.alert import format_alert, make_alert, severity_at_least
from mindwatch.config import load_config
from mindwatch.monitor.worker import Monitor
from mindwatch.session import RunSession
from mindwatch.sinks.alertlog import AlertLog
from mindwatch.store.writer import RunWriter

CONTRACT = ("t", "step", "rank", "rule", "metric", "value", "threshold", "severity", "message", "actions")


class NoAlerts:
    """A sink without ``alert()``: it is skipped, not called."""

    def write(self, records) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self, state, error=None, reason=None) -> None:
        pass


class Counting(NoAlerts):
    """A sink that counts alerts (as the Prometheus and TensorBoard sinks do), noting the thread."""

    def __init__(self) -> None:
        self.alerts: list[dict] = []
        self.threads: set[str] = set()

    def alert(self, alert: dict) -> None:
        self.alerts.append(alert)
        self.threads.add(threading.current_thread().name)


def test_every_sink_with_alert_gets_every_alert_on_the_worker_thread(tmp_path: Path) -> None:
    a, b = Counting(), Counting()
    mon = Monitor([RunWriter(tmp_path, 0), a, b], batch_secs=0.01).start()
    raised = [make_alert("spike", step=i, rank=0, message=f"n{i}") for i in range(50)]
    threads = [threading.Thread(target=lambda a=al: mon.alert(a)) for al in raised]  # from many threads
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    mon.alert(make_alert("late", step=99, rank=0, message="raised just before close"))
    mon.close("finished")
    assert sorted(x["step"] for x in a.alerts) == [*range(50), 99]
    assert a.alerts == b.alerts
    assert a.threads <= {"mindwatch-monitor", "MainThread"}  # the worker (or close's final drain)


def test_alert_log_writes_the_contract_and_a_console_line(tmp_path: Path, caplog) -> None:
    writer = RunWriter(tmp_path, 0)
    sink = AlertLog(writer)
    alert = make_alert(
        "nonfinite", step=12, rank=0, metric="loss", value=float("nan"), message="loss is nan", severity="error", actions=["stop"]
    )
    with caplog.at_level(logging.INFO, "mindwatch"):
        sink.alert(alert)
        sink.alert(make_alert("resumed", step=13, rank=0, message="back", severity="info"))
    run = mindwatch.open_run(tmp_path)
    assert [tuple(a) for a in run.alerts][0][: len(CONTRACT)] == CONTRACT
    assert run.alerts[0]["value"] == "nan"  # non-finite values follow the JSONL convention
    (err, info) = caplog.records
    assert (
        err.levelno == logging.ERROR
        and err.getMessage() == "mindwatch ALERT [nonfinite] rank 0 step 12: loss is nan (actions: stop)"
    )
    assert info.levelno == logging.INFO
    assert format_alert(alert) == err.getMessage()


def test_severity_order() -> None:
    warn = make_alert("x", step=1, rank=0, message="m")
    assert severity_at_least(warn, "info") and severity_at_least(warn, "warning") and not severity_at_least(warn, "error")


def test_a_session_routes_rule_alerts_to_file_console_and_every_alert_sink(tmp_path: Path, caplog) -> None:
    counter = Counting()
    cfg = load_config({"save_dir": str(tmp_path), "callback": {"params": {"warn_on_value": {"loss": 5.0}}}})
    session = RunSession.start(cfg, extra_sinks=[counter, NoAlerts()])
    for step in range(1, 11):
        session.monitor.record({"step": step, "t": time.time(), "loss": 6.0 if step == 4 else 1.0})
    session.close("finished")
    run = mindwatch.open_run(session.run_dir)
    assert [(a["rule"], a["step"], a["threshold"]) for a in run.alerts] == [("threshold", 4, 5.0)]
    assert counter.alerts == run.alerts
    assert "failed" not in caplog.text  # the sink without alert() was not called
