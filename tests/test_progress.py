"""Progress and ETA on real MindSpore trainings (CPU): the console line, meta.json, the runs list and tail."""

from __future__ import annotations

import io
import logging
import re
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import dense_training
from mindspore.train import Callback
from rich.console import Console
from starlette.testclient import TestClient

import mindwatch
from mindwatch.analysis.progress import Progress, StepRate, steps_per_second
from mindwatch.analysis.summary import list_run as listing
from mindwatch.config import load_config
from mindwatch.mindspore import MonitorCallback
from mindwatch.serve.app import create_app
from mindwatch.session import RunSession
from mindwatch.terminal.runs import print_runs
from mindwatch.terminal.tail import tail

_LINE = re.compile(r"mindwatch step (\d+)/([\d,]+) \((\d+) %\)(?: \| ETA ([^|]+?))? \|")


def seconds(text: str) -> float:
    """``1h 02m 03s``, ``1m 45s`` or ``4.3 s`` in seconds (the formats a person reads)."""
    m = re.fullmatch(r"(?:(\d+)h )?(?:(\d+)m )?([\d.]+) ?s", text.strip())
    assert m, text
    h, mins, s = m.groups()
    return int(h or 0) * 3600 + int(mins or 0) * 60 + float(s)


class Pace(Callback):
    """The training thread itself takes ``secs`` more each step: a steady pace no prefetched batch can hide (a data
    source's sleep is hidden while the batches it queued during the first step's compile are used up)."""

    def __init__(self, secs: float) -> None:
        self.secs = secs

    def on_train_step_end(self, run_context) -> None:
        time.sleep(self.secs)


class StopAt(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_step_end(self, run_context) -> None:
        if run_context.original_args().cur_step_num >= self.step:
            run_context.request_stop()


@pytest.mark.slow  # a training of 10 s or more: `-m "not slow"` stays a quick loop
def test_the_console_line_shows_steps_out_of_planned_and_an_eta_near_the_real_remaining_time(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    steps, epochs = 30, 2
    model, data = dense_training(steps)
    mon = MonitorCallback({"save_dir": str(tmp_path), "interval": 0.3})
    with caplog.at_level(logging.INFO, "mindwatch"):
        model.train(epochs, data, callbacks=[mon, Pace(0.12)], dataset_sink_mode=False)
    run = mindwatch.open_run(mon.run_dir)
    total = steps * epochs
    assert run.meta["total_steps"] == total and run.last_step == total
    ended = float(run.series("loss").t[-1])  # the last step's end, as recorded

    lines = [(r.created, _LINE.search(r.getMessage())) for r in caplog.records if "mindwatch step" in r.getMessage()]
    parsed = [(t, m) for t, m in lines if m]
    assert len(parsed) == len(lines) >= 5, [r.getMessage() for r in caplog.records]
    for _t, m in parsed:
        step = int(m.group(1))
        assert m.group(2) == "60" and int(m.group(3)) == 100 * step // total
    t_half, half = min(parsed, key=lambda p: abs(int(p[1].group(1)) - total / 2))
    assert abs(int(half.group(1)) - total / 2) <= 8
    eta, real = seconds(half.group(4)), ended - t_half
    # within 40 %: the pace of a loaded machine changes between the halves (24 % off seen beside the suite's other
    # workers); the step, total and percentage above are exact
    assert abs(eta - real) <= 0.4 * real, (half.group(0), real)
    last = parsed[-1][1]
    assert last.group(1) == "60" and last.group(3) == "100" and last.group(4) is None  # the run ended: no ETA

    # the same run where else a person looks: the runs table, tail, the dashboard's run info
    out = io.StringIO()
    print_runs(tmp_path, console=Console(file=out, width=200))
    row = next(x for x in out.getvalue().splitlines() if mon.run_dir.name in x)
    assert "60/60 (100 %)" in row and "finished" in row
    out = io.StringIO()
    tail(mon.run_dir, once=True, console=Console(file=out, width=200))
    assert "finished  step 60/60 (100 %)" in out.getvalue() and "ETA" not in out.getvalue()
    with TestClient(create_app(tmp_path)) as c:
        info = c.get("/api/run", params={"run": f"{mon.run_dir.parent.name}/{mon.run_dir.name}"}).json()
    assert info["progress"]["total_steps"] == 60 and info["progress"]["fraction"] == 1.0
    assert info["progress"]["eta_secs"] is None and info["progress"]["steps_per_second"] > 0


def test_a_running_run_lists_its_progress_and_eta(tmp_path: Path) -> None:
    session = RunSession.start(load_config({"save_dir": str(tmp_path), "flush_secs": 0.1, "interval": 1000}))
    session.plan(200)
    t0 = session.meta["started_at"]
    for step in range(1, 51):
        session.monitor.record({"step": step, "t": t0 + step * 0.1, "loss": 1.0})  # 10 steps/s since the start
    deadline = time.time() + 10
    while time.time() < deadline and listing(session.run_dir).last_step != 50:
        time.sleep(0.05)
    try:
        out = io.StringIO()
        print_runs(tmp_path, console=Console(file=out, width=200))
        row = next(x for x in out.getvalue().splitlines() if session.run_dir.name in x)
        # 150 steps left at 10 steps/s
        assert re.search(r"running .*50/200 \(25 %\) │ 15\.0 s │", row), row
        assert listing(session.run_dir).to_dict()["total_steps"] == 200
    finally:
        session.close("finished")


def test_a_resumed_training_plans_the_epochs_it_runs(tmp_path: Path) -> None:
    model, data = dense_training(10, 0.0)
    mon = MonitorCallback({"save_dir": str(tmp_path)})
    model.train(3, data, callbacks=[mon], dataset_sink_mode=False, initial_epoch=1)  # epochs 2 and 3
    run = mindwatch.open_run(mon.run_dir)
    # global steps: epoch 1 was steps 1-10, this call records 11-30 and plans to end at 30
    assert run.series("loss").step[0] == 11 and run.meta["total_steps"] == 30 == run.last_step


def test_sink_mode_on_cpu_plans_whole_epochs(tmp_path: Path) -> None:
    # the CPU runs sink mode as plain steps over the whole dataset; MindSpore still reports batch_num = sink_size
    model, data = dense_training(10, 0.0)
    mon = MonitorCallback({"save_dir": str(tmp_path)})
    model.train(2, data, callbacks=[mon], dataset_sink_mode=True, sink_size=5)
    run = mindwatch.open_run(mon.run_dir)
    assert run.meta["total_steps"] == run.last_step == 20


def test_an_endless_dataset_says_the_total_is_unknown(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    model, data = dense_training(10, 0.0)
    mon = MonitorCallback({"save_dir": str(tmp_path), "interval": 0.01})
    with caplog.at_level(logging.INFO, "mindwatch"):
        model.train(1, data.repeat(), callbacks=[mon, StopAt(25)], dataset_sink_mode=False)
    run = mindwatch.open_run(mon.run_dir)
    assert run.meta["total_steps"] is None and run.last_step == 25
    summary = [r.getMessage() for r in caplog.records if r.getMessage().startswith("mindwatch step")]
    assert summary and all(re.match(r"mindwatch step \d+ \(total unknown\) \| loss", s) for s in summary), summary
    assert "ETA" not in caplog.text


def test_progress_reads_as_a_person_writes_it() -> None:
    assert Progress(185, 1500, 5.0).text() == "step 185/1,500 (12 %) | ETA 4m 23s"  # 1,315 steps at 5/s
    assert Progress(1500, 1500, 3.0).text() == "step 1,500/1,500 (100 %)"
    assert Progress(1499, 1500).steps_text() == "1,499/1,500 (99 %)"  # rounds down: 100 % only at the end
    assert Progress(185, None, 3.0).text() == "step 185 (total unknown)"
    assert Progress(1600, 1500, 3.0).text() == "step 1,600 (total unknown)"  # past the plan: the plan was wrong
    assert Progress(185, 1500, 9.25).text(running=False) == "step 185/1,500 (12 %)"


def test_the_rate_is_measured_over_the_last_minute() -> None:
    # 100 steps at 1 step/s, then 400 at 4 steps/s (100 s): only the new rate counts
    t = np.concatenate([np.arange(100.0), 100 + np.arange(1, 401) / 4.0])
    s = np.arange(1, 501)
    assert steps_per_second(s.tolist(), t.tolist()) == pytest.approx(4.0)
    rate = StepRate()
    for step, when in zip(s.tolist(), t.tolist(), strict=True):
        rate.add(step, when)
    assert rate.value == pytest.approx(4.0)
    assert steps_per_second([1], [0.0]) is None


def test_a_step_that_compiles_a_second_graph_is_left_out_of_the_eta() -> None:
    # 300 planned steps of 0.05 s; step 21 compiles a second graph for 10 s (an eval graph, a new shape)
    durations = [0.05] * 300
    durations[20] = 10.0
    t = np.cumsum(durations)
    s = np.arange(1, 301)
    at = 100  # the page asks at step 100
    rate = steps_per_second(s[:at].tolist(), t[:at].tolist())
    eta = Progress(at, 300, rate).eta_secs
    others = [d for i, d in enumerate(durations[:at]) if i != 20]
    expected = (300 - at) * float(np.mean(others))  # the bound: the other steps' pace
    assert eta is not None and abs(eta - expected) <= 0.1 * expected, (eta, expected)


def test_slow_steps_that_recur_still_count_in_the_rate() -> None:
    # every 10th step saves a checkpoint for 1 s: that is the pace, not a compile
    durations = [1.0 if i % 10 == 9 else 0.05 for i in range(200)]
    t = np.cumsum(durations)
    s = np.arange(1, 201)
    assert steps_per_second(s.tolist(), t.tolist()) == pytest.approx(200 / t[-1], rel=0.05)
