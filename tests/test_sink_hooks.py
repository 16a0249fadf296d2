"""The Sink hooks: a BaseSink subclass hears of alerts, dropped records and the plan; a plain sink needs none of them."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from mindwatch.config import load_config
from mindwatch.monitor import BaseSink, Monitor
from mindwatch.session import RunSession


class Listener(BaseSink):
    """Overrides every hook and keeps what it heard."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.alerts: list[dict[str, Any]] = []
        self.dropped: list[int] = []
        self.total_steps: int | None = None

    def write(self, records: list[dict[str, Any]]) -> None:
        self.records.extend(records)

    def alert(self, alert: dict[str, Any]) -> None:
        self.alerts.append(alert)

    def records_dropped(self, count: int) -> None:
        self.dropped.append(count)

    def plan(self, total_steps: int | None) -> None:
        self.total_steps = total_steps


class Plain:
    """Only the three methods of the Sink protocol."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def write(self, records: list[dict[str, Any]]) -> None:
        self.records.extend(records)

    def flush(self) -> None:
        pass

    def close(self, state: str, error: str | None = None, reason: str | None = None) -> None:
        pass


def test_the_hooks_reach_a_base_sink_and_a_plain_sink_is_left_alone(caplog: pytest.LogCaptureFixture) -> None:
    listener, plain = Listener(), Plain()
    mon = Monitor([listener, plain], queue_size=4)  # not started: the fifth record on is dropped
    for i in range(6):
        mon.record({"step": i, "t": float(i)})
    mon.alert({"rule": "spike", "step": 3, "message": "loss spiked"})
    with caplog.at_level(logging.WARNING, logger="mindwatch"):
        mon.close("finished")
    assert [r["step"] for r in listener.records] == [r["step"] for r in plain.records] == [0, 1, 2, 3]
    assert listener.alerts == [{"rule": "spike", "step": 3, "message": "loss spiked"}]
    assert listener.dropped and listener.dropped[-1] == 2
    assert not [r for r in caplog.records if "failed" in r.getMessage()]  # no hook was asked of the plain sink


def test_the_plan_reaches_the_session_s_sinks(tmp_path: Path) -> None:
    listener = Listener()
    session = RunSession.start(load_config({"save_dir": str(tmp_path), "project": "p"}), extra_sinks=[listener])
    session.plan(120)
    session.close("finished")
    assert listener.total_steps == 120
