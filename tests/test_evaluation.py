"""Evaluation recorded as ``eval/<name>``: ``Model.fit``'s evaluations (what MindSpore hands its callbacks as
``eval_results``) and a loop's ``run.eval``; the evaluation's time is no step's.

The reference is MindSpore's own: a callback of the test reads ``eval_results`` at each ``on_eval_end``, and the
training's step count (``cur_step_num``) at the train step before it.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mindspore import dataset as ds
from mindspore import nn
from mindspore.train import Callback, Model

import mindwatch
import mindwatch.mindspore as mw
from mindwatch.demo.train import set_mode
from mindwatch.demo.tutorial_step import jit_train_step
from mindwatch.mindspore import MonitorCallback

FEATURES, BATCH, STEPS_PER_EPOCH, EPOCHS, EVAL_PAUSE = 8, 16, 20, 3, 0.05


class Slow:
    """A validation set whose batches take ``EVAL_PAUSE`` s each to load: an evaluation of 8 batches takes 0.4 s."""

    def __init__(self, rows: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.x = rng.normal(size=(rows, FEATURES)).astype(np.float32)
        self.y = self.x.sum(axis=1, keepdims=True).astype(np.float32)

    def __getitem__(self, i: int):
        if i % BATCH == 0:
            time.sleep(EVAL_PAUSE)
        return self.x[i], self.y[i]

    def __len__(self) -> int:
        return len(self.x)


class EvalResults(Callback):
    """Independent of mindwatch: the training's step at each evaluation and what MindSpore handed over."""

    def __init__(self) -> None:
        self.at: list[int] = []
        self.results: list[dict] = []
        self.trained = 0

    def on_train_step_end(self, run_context) -> None:
        self.trained = run_context.original_args().cur_step_num

    def on_eval_begin(self, run_context) -> None:  # MindSpore counts the evaluation's steps from 0 in cur_step_num
        self.at.append(self.trained)

    def on_eval_end(self, run_context) -> None:
        self.results.append(dict(run_context.original_args().eval_results))


def test_model_fit_records_each_evaluation_at_its_step_and_its_time_is_no_steps(tmp_path: Path) -> None:
    set_mode("graph")
    ms.set_seed(0)
    net = nn.SequentialCell(nn.Dense(FEATURES, 16), nn.ReLU(), nn.Dense(16, 1))
    model = Model(net, nn.MSELoss(), nn.Momentum(net.trainable_params(), 0.01, 0.9), metrics={"mse": nn.MSE(), "mae": nn.MAE()})
    train = ds.GeneratorDataset(Slow(STEPS_PER_EPOCH * BATCH, 0), ["x", "y"], shuffle=False).batch(BATCH)
    valid = ds.GeneratorDataset(Slow(8 * BATCH, 1), ["x", "y"], shuffle=False).batch(BATCH)
    seen = EvalResults()
    monitor = MonitorCallback({"save_dir": str(tmp_path), "project": "p", "interval": 60})
    model.fit(EPOCHS, train, valid, valid_frequency=1, callbacks=[monitor, seen], dataset_sink_mode=False)
    run = mindwatch.open_run(monitor.run_dir)

    assert seen.at == [STEPS_PER_EPOCH * e for e in range(1, EPOCHS + 1)]  # after each epoch's last step
    for name in ("mse", "mae", "eval_loss"):
        s = run.series(f"eval/{name}")
        assert s.step.tolist() == seen.at, f"one point per evaluation: eval/{name}"
        assert s.value.tolist() == pytest.approx([float(r[name]) for r in seen.results], rel=1e-6), name
    took = run.series("eval_time")
    assert took.step.tolist() == seen.at and (took.value >= 8 * EVAL_PAUSE * 0.9).all(), took.value
    # the step after an evaluation is timed without it: far below the evaluation's own time
    step_time = dict(zip(run.series("step_time").step.tolist(), run.series("step_time").value.tolist(), strict=True))
    for at, secs in zip(seen.at[:-1], took.value.tolist(), strict=False):
        assert step_time[at + 1] < secs / 2, (at + 1, step_time[at + 1], secs)
    assert run.state == "finished" and run.series("loss").step.tolist() == list(range(1, STEPS_PER_EPOCH * EPOCHS + 1))


def test_a_loop_records_its_own_evaluation_and_leaves_out_what_is_not_a_number(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    set_mode("pynative")
    ms.set_seed(0)
    net = nn.SequentialCell(nn.Dense(FEATURES, 1))
    opt = nn.SGD(net.trainable_params(), learning_rate=0.01)
    step = jit_train_step(nn.WithLossCell(net, nn.MSELoss()), opt)
    rng = np.random.default_rng(0)
    with mw.start_run({"save_dir": str(tmp_path), "project": "p"}, network=net, optimizer=opt) as run:
        for i in range(1, 7):
            x = ms.Tensor(rng.normal(size=(BATCH, FEATURES)).astype(np.float32))
            loss, grads = step(x, ms.Tensor(x.asnumpy().sum(axis=1, keepdims=True)))
            run.step(loss=loss, grads=grads)
            if i % 3 == 0:
                with caplog.at_level(logging.WARNING, logger="mindwatch"):
                    run.eval(loss=float(i), accuracy=ms.Tensor(np.float32(0.5)), confusion=np.eye(2), eval_time=0.25)
        with pytest.raises(TypeError, match=r"eval_time=\.\.\.\) takes the evaluation's seconds as a number, got 'soon'"):
            run.eval(loss=1.0, eval_time="soon")  # said at once, nothing recorded
        run.eval(step=2, loss=float("nan"))
    recorded = mindwatch.open_run(run.run_dir)
    assert recorded.series("eval/loss").step.tolist() == [2, 3, 6]
    assert recorded.series("eval/loss").value.tolist()[1:] == [3.0, 6.0] and math.isnan(recorded.series("eval/loss").value[0])
    assert recorded.series("eval/accuracy").value.tolist() == [0.5, 0.5]
    assert recorded.series("eval_time").value.tolist() == [0.25, 0.25]
    assert "eval/confusion" not in recorded.metrics
    assert "the evaluation's 'confusion' is not a number (ndarray): not recorded" in caplog.text
