"""The same monitor config through both front doors: ``Model.train`` with ``MonitorCallback``, and a loop of your own
with ``start_run``. A tiny linear regression with a NaN in one batch; each door's run is checked against what the
config asks for and what numpy says the training did, not against the other door's run."""

from __future__ import annotations

import math
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

BATCH, FEATURES, STEPS, LR = 4, 3, 6, 0.1
NAN_STEP = 4  # the batch whose inputs hold a NaN: its loss and gradients are NaN
FAIL_STEP = 2  # where the failing trainings raise

#: What every step of this training records with the default metrics on CPU: its place (epoch, the batch's index in
#: it), loss, gradient norm and learning rate, its times, samples per second (the batch's first dimension; with no
#: ``seq_length`` the tokens of a step are unknown, so no tokens per second, TFLOPS nor MFU) and the host's memory;
#: ``accuracy`` is the user's own, from ``log``.
RECORDED = {
    "epoch",
    "batch",
    "loss",
    "grad_norm",
    "lr",
    "step_time",
    "data_time",
    "samples_per_second",
    "host_rss_gb",
    "accuracy",
}


def batches() -> list[dict[str, np.ndarray]]:
    """Six batches of four samples: inputs, targets, and the samples' ids (10 x step + row)."""
    rng = np.random.default_rng(3)
    out = []
    for step in range(1, STEPS + 1):
        x = rng.normal(size=(BATCH, FEATURES)).astype(np.float32)
        if step == NAN_STEP:
            x[1, 2] = np.nan
        y = rng.normal(size=(BATCH, 1)).astype(np.float32)
        ids = (10 * step + np.arange(BATCH)).astype(np.int32)
        out.append({"x": x, "y": y, "ids": ids})
    return out


def dataset() -> ds.Dataset:
    columns = {k: np.concatenate([b[k] for b in batches()]) for k in ("x", "y", "ids")}
    return ds.NumpySlicesDataset(columns, shuffle=False).batch(BATCH)


def expected_steps() -> list[tuple[float, float]]:
    """Loss and gradient norm of each step before the NaN, by hand: plain SGD on a zero-initialised linear model."""
    w, b = np.zeros((FEATURES, 1)), 0.0
    out = []
    for batch in batches()[: NAN_STEP - 1]:
        x, y = batch["x"].astype(np.float64), batch["y"].astype(np.float64)
        err = x @ w + b - y
        dw, db = 2 * x.T @ err / len(x), 2 * err.mean()
        out.append((float((err**2).mean()), math.sqrt(float((dw**2).sum()) + db**2)))
        w, b = w - LR * dw, b - LR * db
    return out


class Regression(nn.Cell):
    """The loss of a linear model; the ids column reaches it, as ``callback.sample_ids`` says, and is ignored."""

    def __init__(self) -> None:
        super().__init__()
        self.dense = nn.Dense(FEATURES, 1, weight_init="zeros", bias_init="zeros")
        self.loss = nn.MSELoss()

    def construct(self, x, y, ids=None):
        return self.loss(self.dense(x), y)


class Raises(Callback):
    """A user's callback that fails at ``FAIL_STEP``."""

    def on_train_step_end(self, run_context: Any) -> None:
        if run_context.original_args().cur_step_num == FAIL_STEP:
            raise RuntimeError("the data source broke")


class LogsAccuracy(Callback):
    """A user's callback that records a metric of its own through the monitor at step 2."""

    def __init__(self, monitor: mw.MonitorCallback) -> None:
        self.monitor = monitor

    def on_train_step_end(self, run_context: Any) -> None:
        if run_context.original_args().cur_step_num == 2:
            self.monitor.log(2, accuracy=0.5)


def by_model_train(config: dict[str, Any], *, fail: bool = False) -> Path:
    net = Regression()
    cell = mw.TrainOneStepWithGradNorm(net, nn.SGD(net.trainable_params(), learning_rate=LR))
    monitor = mw.MonitorCallback(config)
    callbacks = [monitor, LogsAccuracy(monitor), *([Raises()] if fail else [])]
    try:
        Model(cell).train(1, dataset(), callbacks=callbacks, dataset_sink_mode=False)
    except RuntimeError:
        assert fail
    assert monitor.run_dir is not None
    return monitor.run_dir


def by_a_loop(config: dict[str, Any], *, fail: bool = False) -> Path:
    net = Regression()
    optimizer = nn.SGD(net.trainable_params(), learning_rate=LR)
    grad_fn = ms.value_and_grad(net, None, optimizer.parameters)
    try:
        with mw.start_run(config, network=net, optimizer=optimizer, total_steps=STEPS) as run:
            for step, (x, y, ids) in enumerate(run.batches(dataset().create_tuple_iterator()), start=1):
                loss, grads = grad_fn(x, y)
                optimizer(grads)
                run.step(loss=loss, grads=grads, sample_ids=ids)
                if step == 2:
                    run.log(accuracy=0.5)
                if fail and step == FAIL_STEP:
                    raise RuntimeError("the data source broke")
                if run.should_stop:
                    break
    except RuntimeError:
        assert fail
    assert run.run_dir is not None
    return run.run_dir


DOORS = {"model_train": by_model_train, "loop": by_a_loop}


def config(save_dir: Path) -> dict[str, Any]:
    return {
        "save_dir": str(save_dir),
        "interval": 1,
        "alerts": {"nonfinite": {"actions": ["stop"]}},
        "callback": {"sample_ids": "ids"},  # the loop passes them to run.step itself
    }


@pytest.mark.parametrize("door", sorted(DOORS))
def test_one_config_records_the_same_run_through_either_front_door(tmp_path: Path, door: str) -> None:
    set_mode("pynative")
    run_dir = DOORS[door](config(tmp_path))
    run = mindwatch.open_run(run_dir)

    # the layout: one rank's files, nothing else (the watchdog's stacks/ folder may be there, but holds no dump)
    assert sorted(p.name for p in run_dir.iterdir() if p.name != "stacks") == [
        "alerts.jsonl",
        "columns.rank0",
        "meta.json",
        "metrics.rank0.jsonl",
        "status.rank0.json",
    ]
    assert list(run_dir.glob("stacks/*")) == []
    assert run.meta["total_steps"] == STEPS and run.ranks == [0]

    # what was recorded: every step up to the NaN, with the values the training had
    assert set(run.metrics) == RECORDED
    assert run.series("loss").step.tolist() == list(range(1, NAN_STEP + 1))
    for metric in RECORDED - {"accuracy", "host_rss_gb"}:  # memory is sampled on the worker, by time
        assert run.series(metric).step.tolist() == list(range(1, NAN_STEP + 1)), metric
    assert run.series("epoch").value.tolist() == [1] * NAN_STEP
    assert run.series("batch").value.tolist() == list(range(NAN_STEP))
    losses, norms = run.series("loss").value, run.series("grad_norm").value
    for step, (loss, norm) in enumerate(expected_steps(), start=1):
        assert losses[step - 1] == pytest.approx(loss, rel=1e-5) and norms[step - 1] == pytest.approx(norm, rel=1e-5), step
    assert math.isnan(losses[NAN_STEP - 1]) and math.isnan(norms[NAN_STEP - 1])
    assert run.series("lr").value.tolist() == pytest.approx([LR] * NAN_STEP)
    accuracy = run.series("accuracy")
    assert accuracy.step.tolist() == [2] and accuracy.value.tolist() == [0.5]

    # the same NaN, the same alert, naming the batch behind it; the stop it asked for, on that very step
    nonfinite = [a for a in run.alerts if a["rule"] == "nonfinite"]
    assert [(a["step"], a["metric"], a["actions"], a["sample_ids"]) for a in nonfinite] == [
        (NAN_STEP, "grad_norm", ["stop"], [10 * NAN_STEP + i for i in range(BATCH)])  # the norm: the same on every rank
    ]
    done = [a for a in run.alerts if a["rule"] == "intervention"]
    assert [(a["step"], a["actions"], a["cause"]) for a in done] == [(NAN_STEP, ["stop"], "nonfinite")]
    assert {a["rule"] for a in run.alerts} == {"nonfinite", "intervention"}
    assert run.state == "stopped" and run.last_step == NAN_STEP
    assert run.statuses[0]["reason"] == f"stopped by mindwatch: {nonfinite[0]['message']}"


@pytest.mark.parametrize("door", sorted(DOORS))
def test_an_exception_in_the_training_ends_the_run_failed_through_either_front_door(tmp_path: Path, door: str) -> None:
    set_mode("pynative")
    run = mindwatch.open_run(DOORS[door](config(tmp_path), fail=True))
    assert run.state == "failed" and run.last_step == FAIL_STEP
    assert run.statuses[0]["error"] == "RuntimeError: the data source broke"
    assert run.statuses[0].get("reason") is None
