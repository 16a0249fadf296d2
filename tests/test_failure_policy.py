"""A fault of mindwatch's own in a step hook never ends the training it watches, through either front door.

The fault is injected as a bug would be: one function of the per-step recording (the step's timing,
``StepTimer.add``) raises at chosen steps. Every step still trains, with the losses of the same training without
mindwatch; the warning comes once with its traceback, then as a count; ``strict: true`` raises it; after
``max_failed_steps`` failing steps in a row the rank records nothing more (one ``monitor_failed`` alert), and its
liveness goes on. And the training thread never touches a record once it handed it to the worker.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import mindspore as ms
import numpy as np
import pytest
from mindspore import dataset as ds
from mindspore import nn
from mindspore.train import Callback, Model

import mindwatch
import mindwatch.mindspore as mw
from mindwatch.demo.train import set_mode
from mindwatch.mindspore.timing import StepTimer
from mindwatch.monitor.worker import Monitor

BATCH, FEATURES, LR = 4, 3, 0.05


def batches(steps: int, nan_at: int | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(7)
    out = []
    for step in range(1, steps + 1):
        x = rng.normal(size=(BATCH, FEATURES)).astype(np.float32)
        if step == nan_at:
            x[0, 0] = np.nan
        out.append((x, rng.normal(size=(BATCH, 1)).astype(np.float32)))
    return out


def dataset(steps: int, nan_at: int | None = None) -> ds.Dataset:
    data = batches(steps, nan_at)
    columns = {"x": np.concatenate([x for x, _ in data]), "y": np.concatenate([y for _, y in data])}
    return ds.NumpySlicesDataset(columns, shuffle=False).batch(BATCH)


class Regression(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.dense = nn.Dense(FEATURES, 1, weight_init="zeros", bias_init="zeros")
        self.loss = nn.MSELoss()

    def construct(self, x, y):
        return self.loss(self.dense(x), y)


class Losses(Callback):
    """The user's own view of the training: every step's loss, from the train cell's outputs; optionally paced."""

    def __init__(self, pace: float = 0.0) -> None:
        self.losses: list[float] = []
        self.pace = pace

    def on_train_step_end(self, run_context: Any) -> None:
        out = run_context.original_args().net_outputs
        self.losses.append(float((out[0] if isinstance(out, (tuple, list)) else out).asnumpy()))
        time.sleep(self.pace)


def by_model_train(config: dict[str, Any] | None, steps: int, *, pace: float = 0.0, nan_at: int | None = None):
    net = Regression()
    cell = mw.TrainOneStepWithGradNorm(net, nn.SGD(net.trainable_params(), learning_rate=LR))
    losses = Losses(pace)
    monitor = mw.MonitorCallback(config) if config is not None else None
    callbacks = [monitor, losses] if monitor is not None else [losses]
    Model(cell).train(1, dataset(steps, nan_at), callbacks=callbacks, dataset_sink_mode=False)
    return losses.losses, monitor.run_dir if monitor is not None else None


def by_a_loop(config: dict[str, Any] | None, steps: int, *, pace: float = 0.0, nan_at: int | None = None):
    net = Regression()
    optimizer = nn.SGD(net.trainable_params(), learning_rate=LR)
    grad_fn = ms.value_and_grad(net, None, optimizer.parameters)
    losses: list[float] = []
    data = dataset(steps, nan_at).create_tuple_iterator()
    if config is None:
        for x, y in data:
            loss, grads = grad_fn(x, y)
            optimizer(grads)
            losses.append(float(loss.asnumpy()))
        return losses, None
    with mw.start_run(config, network=net, optimizer=optimizer, total_steps=steps) as run:
        for x, y in run.batches(data):
            loss, grads = grad_fn(x, y)
            optimizer(grads)
            run.step(loss=loss, grads=grads)
            losses.append(float(loss.asnumpy()))
            time.sleep(pace)
            if run.should_stop:
                break
    return losses, run.run_dir


DOORS = {"model_train": by_model_train, "loop": by_a_loop}


def fault_at(monkeypatch: pytest.MonkeyPatch, steps: set[int] | range) -> None:
    """A bug of mindwatch's own: the step's timing raises at ``steps``."""
    original = StepTimer.add

    def add(self: StepTimer, rec: dict[str, Any], n: int, now: float) -> None:
        if rec["step"] in steps:
            raise RuntimeError(f"injected fault at step {rec['step']}")
        original(self, rec, n, now)

    monkeypatch.setattr(StepTimer, "add", add)


def recorded_steps(run_dir: Path) -> list[int]:
    return mindwatch.open_run(run_dir).series("loss").step.tolist()


def warnings_of(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "mindwatch" and text in r.getMessage()]


@pytest.mark.parametrize("mode", ["graph", "pynative"])
@pytest.mark.parametrize("door", sorted(DOORS))
def test_a_fault_in_the_step_recording_is_one_warning_and_every_step_trains(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, door: str, mode: str
) -> None:
    set_mode(mode)
    steps = 12
    reference, _ = DOORS[door](None, steps)  # the same training without mindwatch
    fault_at(monkeypatch, {5, 6})
    with caplog.at_level(logging.WARNING, logger="mindwatch"):
        losses, run_dir = DOORS[door]({"save_dir": str(tmp_path), "interval": 1}, steps)
    assert len(losses) == steps, "every step trained"
    np.testing.assert_allclose(losses, reference, rtol=1e-6)
    assert recorded_steps(run_dir) == [s for s in range(1, steps + 1) if s not in (5, 6)]
    run = mindwatch.open_run(run_dir)
    assert run.state == "finished"
    first = warnings_of(caplog, "could not record step 5")
    assert len(first) == 1 and first[0].exc_info is not None, "once, with its traceback"
    assert "injected fault at step 5" in first[0].getMessage() and "recorder.py" in first[0].getMessage()
    assert not warnings_of(caplog, "could not record step 6"), "the second is counted, not said again"
    counted = warnings_of(caplog, "more step could not be recorded")
    assert len(counted) == 1 and "2 in all" in counted[0].getMessage() and "step 6" in counted[0].getMessage()
    assert not [a for a in run.alerts if a["rule"] == "monitor_failed"], "2 in a row is under max_failed_steps"


@pytest.mark.parametrize("door", sorted(DOORS))
def test_strict_raises_a_fault_of_mindwatchs_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, door: str) -> None:
    set_mode("pynative")
    fault_at(monkeypatch, {3})
    with pytest.raises(RuntimeError, match="injected fault at step 3"):
        DOORS[door]({"save_dir": str(tmp_path), "strict": True}, 6)


@pytest.mark.parametrize("door", sorted(DOORS))
def test_max_failed_steps_in_a_row_stop_the_recording_with_one_alert_and_the_rank_stays_alive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, door: str
) -> None:
    """From step 4 on every step's recording fails; after 3 in a row (step 6) the rank records nothing more. The
    steps go on for over twice the stall limit after that: a rank that stopped beating would raise a stall."""
    set_mode("pynative")
    steps = 26
    reference, _ = DOORS[door](None, steps)
    fault_at(monkeypatch, range(4, steps + 1))
    config = {"save_dir": str(tmp_path), "max_failed_steps": 3, "alerts": {"stall_timeout": 2.0}}
    losses, run_dir = DOORS[door](config, steps, pace=0.25)
    np.testing.assert_allclose(losses, reference, rtol=1e-6)
    run = mindwatch.open_run(run_dir)
    assert recorded_steps(run_dir) == [1, 2, 3]
    failed = [a for a in run.alerts if a["rule"] == "monitor_failed"]
    assert len(failed) == 1, failed
    assert failed[0]["step"] == 6 and failed[0]["severity"] == "error" and failed[0]["rank"] == 0
    assert "injected fault at step 6" in failed[0]["error"] and "mindspore/recorder.py" in failed[0]["where"]
    assert not [a for a in run.alerts if a["rule"] == "stall"], "the beat went on"
    assert run.state == "finished"


@pytest.mark.parametrize("door", sorted(DOORS))
def test_the_training_thread_never_touches_a_record_it_handed_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, door: str
) -> None:
    """Every record handed to the worker is emptied at once (the worker gets a copy): a write after the hand-over
    would show in it, and a read would miss the step's values, such as the NaN that must stop the run on its step."""
    set_mode("pynative")
    handed: list[dict[str, Any]] = []
    original = Monitor.record

    def record(self: Monitor, rec: dict[str, Any]) -> None:
        original(self, dict(rec))
        rec.clear()
        handed.append(rec)

    monkeypatch.setattr(Monitor, "record", record)
    config = {"save_dir": str(tmp_path), "alerts": {"nonfinite": {"actions": ["stop"]}}}
    _, run_dir = DOORS[door](config, 12, nan_at=7)
    run = mindwatch.open_run(run_dir)
    assert run.state == "stopped" and run.last_step == 7, "the NaN stopped the run on its step"
    assert recorded_steps(run_dir) == list(range(1, 8))
    assert len(handed) >= 7 and all(rec == {} for rec in handed), [rec for rec in handed if rec]
