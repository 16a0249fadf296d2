"""The stall watchdog on a real training whose data pipeline hangs mid-run, and its timeout rules."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mindspore import dataset as ds
from mindspore import nn
from mindspore.train import Model

import mindwatch
from mindwatch.demo.train import set_mode
from mindwatch.mindspore import MonitorCallback
from mindwatch.monitor.watchdog import StallLimits, Watchdog
from mindwatch.sinks.alertlog import AlertLog
from mindwatch.store.writer import RunWriter

STALL_AT, TIMEOUT = 25, 1.5
NAMED_WITHIN = 2 * TIMEOUT  # a stall is named within twice its limit: a loaded machine wakes the watchdog late
STALL_SECS = NAMED_WITHIN + 1.0  # the hang outlasts that, so the stall is seen while it lasts


def wait_for_the_disk_that_never_answers() -> None:
    """Stands in for a hung read (NFS, a dead data server)."""
    time.sleep(STALL_SECS)


def batches():
    rng = np.random.default_rng(0)
    for i in range(400):  # after the hang, enough steps to see 'running' again
        if i == STALL_AT:
            wait_for_the_disk_that_never_answers()
        x = rng.normal(size=(8, 4)).astype(np.float32)
        yield x, x.sum(axis=1, keepdims=True)


class StatusSpy:
    """Reads status.rank0.json every 50 ms, as a dashboard would; keeps the sequence of distinct states."""

    def __init__(self, run_dir_of) -> None:
        self.states: list[str] = []
        self._stop = threading.Event()
        self._run_dir_of = run_dir_of
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            stopping = self._stop.wait(0.05)
            self._look()
            if stopping:
                return

    def _look(self) -> None:
        run_dir = self._run_dir_of()
        if run_dir is None:
            return
        try:
            state = json.loads((Path(run_dir) / "status.rank0.json").read_text())["state"]
        except (OSError, ValueError, KeyError):
            return
        if not self.states or self.states[-1] != state:
            self.states.append(state)

    def stop(self) -> list[str]:
        self._stop.set()
        self.thread.join()
        return self.states


@pytest.mark.slow  # a training of 10 s or more: `-m "not slow"` stays a quick loop
def test_a_hung_data_pipeline_is_a_stall_with_stacks_then_resumed(tmp_path: Path) -> None:
    set_mode("graph")
    ms.set_seed(0)
    net = nn.Dense(4, 1)
    model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), learning_rate=0.01))
    mon = MonitorCallback({"save_dir": str(tmp_path), "alerts": {"stall_timeout": TIMEOUT}})
    spy = StatusSpy(lambda: mon.run_dir)
    data = ds.GeneratorDataset(batches, ["x", "y"], shuffle=False)
    model.train(1, data, callbacks=[mon], dataset_sink_mode=False)
    states = spy.stop()

    run = mindwatch.open_run(mon.run_dir)
    stall, resumed = [a for a in run.alerts if a["rule"] in ("stall", "resumed")]  # data_wait etc. may fire too
    assert (stall["rule"], resumed["rule"]) == ("stall", "resumed")
    assert stall["severity"] == "error" and stall["threshold"] == TIMEOUT
    assert TIMEOUT <= stall["value"] < NAMED_WITHIN
    assert stall["step"] == STALL_AT  # the last step that ended before the hang
    dump = Path(stall["stacks"])
    assert dump.parent == run.path / "stacks"
    text = dump.read_text()
    assert "wait_for_the_disk_that_never_answers" in text and "batches" in text  # the generator, named
    assert (dump.parent / (dump.stem + ".faulthandler.txt")).read_text().strip()
    assert [p.name for p in dump.parent.iterdir() if not p.stat().st_size] == []  # the GIL guard's file went at the end
    # the gap runs from the last step before the hang to the first after it: longer than the idle time the stall was
    # seen at, and no longer than the hang (the steps before it may have eaten into it, from batches prefetched)
    assert resumed["severity"] == "info" and stall["value"] < resumed["value"] < STALL_SECS + NAMED_WITHIN
    assert states[:3] == ["running", "stalled", "running"] and states[-1] == "finished"
    assert run.state == "finished"


def wait_for_the_data_server_to_come_up() -> None:
    """Stands in for a first batch that takes far too long (a dead data server, a stuck collective)."""
    time.sleep(STALL_SECS)


def late_first_batch():
    wait_for_the_data_server_to_come_up()
    rng = np.random.default_rng(0)
    for _ in range(40):
        x = rng.normal(size=(8, 4)).astype(np.float32)
        yield x, x.sum(axis=1, keepdims=True)


def test_a_hang_before_the_first_step_is_a_stall_too(tmp_path: Path) -> None:
    set_mode("graph")
    net = nn.Dense(4, 1)
    model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), learning_rate=0.01))
    mon = MonitorCallback({"save_dir": str(tmp_path), "alerts": {"stall_timeout": 60, "first_step_timeout": TIMEOUT}})
    spy = StatusSpy(lambda: mon.run_dir)
    data = ds.GeneratorDataset(late_first_batch, ["x", "y"], shuffle=False)
    model.train(1, data, callbacks=[mon], dataset_sink_mode=False)
    states = spy.stop()

    run = mindwatch.open_run(mon.run_dir)
    stall, resumed = [a for a in run.alerts if a["rule"] in ("stall", "resumed")]
    assert stall["step"] is None and stall["threshold"] == TIMEOUT and TIMEOUT <= stall["value"] < NAMED_WITHIN
    assert "since training began" in stall["message"]
    assert "wait_for_the_data_server_to_come_up" in Path(stall["stacks"]).read_text()  # the generator, named
    assert resumed["rule"] == "resumed" and resumed["value"] >= STALL_SECS - 0.5
    assert states[:2] == ["running", "stalled"] and states[-1] == "finished" and run.state == "finished"
    assert run.series("loss").step.tolist() == list(range(1, 41))


def test_timeout_is_derived_from_the_step_rhythm_with_a_floor(tmp_path: Path) -> None:
    dog = Watchdog(lambda a: None, tmp_path, limits=StallLimits(floor=5.0, factor=10.0))
    assert dog.timeout == 5.0  # nothing seen yet: the floor
    dog.write([{"step": i, "t": 100.0 + 2.0 * i} for i in range(20)])  # 2 s between steps
    assert dog.timeout == 20.0
    dog.write([{"step": 20 + i, "t": 140.0 + 0.01 * i} for i in range(200)])  # fast steps now: the floor again
    assert dog.timeout == 5.0
    assert Watchdog(lambda a: None, tmp_path, limits=StallLimits(timeout=3.0)).timeout == 3.0


def test_watchdog_is_armed_by_the_first_step_and_alerts_once_per_stall(tmp_path: Path) -> None:
    writer = RunWriter(tmp_path / "run", 0)
    log = AlertLog(writer)
    alerts: list[dict] = []

    def emit(alert: dict) -> None:
        alerts.append(alert)
        log.alert(alert)

    dog = Watchdog(emit, tmp_path / "run" / "stacks", limits=StallLimits(timeout=1.0), gil_guard=False)
    dog.check(1000.0)  # compiling, first batch: no beat yet, no stall
    assert alerts == []
    dog.last_beat, dog.step = 0.0, 7
    dog.check(0.5)
    assert alerts == []
    dog.check(1.2)
    dog.check(5.0)  # still stalled: no second alert
    assert [a["rule"] for a in alerts] == ["stall"] and writer.state == "stalled"
    status = json.loads(writer.layout.status(0).read_text())
    assert status["state"] == "stalled"
    dog.last_beat, dog.step = 6.0, 8
    dog.check(6.1)
    assert [a["rule"] for a in alerts] == ["stall", "resumed"] and writer.state == "running"
    assert alerts[1]["step"] == 8


def test_a_stall_dump_the_disk_cannot_hold_leaves_no_empty_file(tmp_path: Path) -> None:
    stacks = tmp_path / "run" / "stacks"
    code = f"""
import resource, signal, time
from pathlib import Path
from mindwatch.monitor.watchdog import StallLimits, Watchdog

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a file may be made but not written to: a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
alerts = []
dog = Watchdog(alerts.append, Path({str(stacks)!r}), limits=StallLimits(timeout=0.5), poll_secs=0.05).start()
dog.last_beat = time.perf_counter()  # one step ended, then none
deadline = time.monotonic() + 30
while not alerts and time.monotonic() < deadline:
    time.sleep(0.05)
dog.stop()
print("ALERT", alerts[0]["rule"], alerts[0].get("stacks"))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "ALERT stall None" in r.stdout, r.stdout + r.stderr  # the stall is told, without a dump
    assert "cannot write the stack dump" in r.stderr
    assert [(p.name, p.stat().st_size) for p in stacks.iterdir()] == []  # no dump cut short, no armed GIL file
