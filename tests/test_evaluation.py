"""Evaluation recorded as ``eval/<name>``: ``Model.fit``'s evaluations (what MindSpore hands its callbacks as
``eval_results``) and a loop's ``run.eval``; the evaluation's time is no step's.

The reference is MindSpore's own: a callback of the test reads ``eval_results`` at each ``on_eval_end``, and the
training's step count (``cur_step_num``) at the train step before it.
"""

from __future__ import annotations

import json
import logging
import math
import re
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


def test_a_loop_records_its_own_evaluation_and_keeps_a_matrix_as_a_table(
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
                    run.eval(
                        loss=float(i),
                        accuracy=ms.Tensor(np.float32(0.5)),
                        confusion=np.eye(2),
                        label=object(),
                        eval_time=0.25,
                        epoch=i // 3,
                        samples=64,
                    )
        with pytest.raises(TypeError, match=r"run.eval\(eval_time=\.\.\.\) takes a number, got 'soon'"):
            run.eval(loss=1.0, eval_time="soon")  # said at once, nothing recorded
        run.eval(step=2, loss=float("nan"))
    recorded = mindwatch.open_run(run.run_dir)
    assert recorded.series("eval/loss").step.tolist() == [2, 3, 6]
    assert recorded.series("eval/loss").value.tolist()[1:] == [3.0, 6.0] and math.isnan(recorded.series("eval/loss").value[0])
    assert recorded.series("eval/accuracy").value.tolist() == [0.5, 0.5]
    assert recorded.series("eval_time").value.tolist() == [0.25, 0.25]
    assert recorded.series("eval_samples").value.tolist() == [64, 64]
    assert recorded.series("epoch").value.tolist()[-2:] == [1, 2]  # the last train step's, then the evaluation's
    assert "eval/confusion" not in recorded.metrics and "eval/label" not in recorded.metrics
    assert "the evaluation's 'label' is not a number (object): not recorded" in caplog.text
    tables = [json.loads(line) for line in (run.run_dir / "evaluations.rank0.jsonl").read_text().splitlines()]
    assert [(t["step"], t["epoch"], t["tables"]) for t in tables] == [
        (3, 1, {"confusion": np.eye(2).tolist()}),
        (6, 2, {"confusion": np.eye(2).tolist()}),
    ]
    nan = [a for a in recorded.alerts if a["rule"] == "nonfinite"]
    assert [(a["step"], a["metric"]) for a in nan] == [(2, "eval/loss")], nan


# -- judged: over-fitting, early stopping, the best weights kept ---------------------------------------------------
OVERFIT_EPOCHS, OVERFIT_BATCH = 40, 8


def overfitting_model(seed: int = 0) -> tuple[nn.Cell, Model, ds.Dataset, ds.Dataset]:
    """A wide network on 32 noisy samples, evaluated on 256 clean ones: its eval loss falls, then rises as it learns
    the noise (the minimum near epoch 15, here)."""
    ms.set_seed(seed)
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(FEATURES, 1)).astype(np.float32)
    xt = rng.normal(size=(32, FEATURES)).astype(np.float32)
    yt = (xt @ w + rng.normal(size=(32, 1))).astype(np.float32)
    xv = rng.normal(size=(256, FEATURES)).astype(np.float32)
    net = nn.SequentialCell(nn.Dense(FEATURES, 256), nn.ReLU(), nn.Dense(256, 256), nn.ReLU(), nn.Dense(256, 1))
    model = Model(net, nn.MSELoss(), nn.Adam(net.trainable_params(), 1e-3), metrics={"mae": nn.MAE()})
    train = ds.NumpySlicesDataset((xt, yt), ["x", "y"], shuffle=False).batch(OVERFIT_BATCH)
    valid = ds.NumpySlicesDataset((xv, (xv @ w).astype(np.float32)), ["x", "y"], shuffle=False).batch(64)
    return net, model, train, valid


def first_stop(values: list[float], patience: int) -> int | None:
    """The evaluation (0-based) at which ``patience`` evaluations in a row did not go below the best (min_delta 0)."""
    best, waited = math.inf, 0
    for i, v in enumerate(values):
        if v < best:
            best, waited = v, 0
        else:
            waited += 1
            if waited == patience:
                return i
    return None


def first_overfitting(evals: list[tuple[int, float]], losses: dict[int, float], patience: int) -> int | None:
    """The evaluation (0-based) the documented over-fitting rule fires at, from the recorded values: ``patience``
    evaluations without a new best, and the mean train loss since the best below the mean between the evaluation
    before the best and the best."""
    best, best_i, waited = math.inf, -1, 0
    for i, (step, v) in enumerate(evals):
        if v < best:
            best, best_i, waited = v, i, 0
            continue
        waited += 1
        if waited < patience:
            continue
        lo = evals[best_i - 1][0] if best_i > 0 else 0
        before = [x for s, x in losses.items() if lo < s <= evals[best_i][0]]
        since = [x for s, x in losses.items() if evals[best_i][0] < s <= step]
        if before and since and np.mean(since) < np.mean(before):
            return i
    return None


def test_model_fit_stops_early_warns_of_overfitting_and_puts_the_best_weights_back(tmp_path: Path) -> None:
    """Its eval loss falls, then rises: ``overfitting`` warns at the evaluation the documented rule gives from the
    recorded values; ``early_stopping`` stops at the end of the epoch whose evaluation decided it; the final weights
    are, bit for bit, those ``ModelCheckpoint`` saved at the best epoch, as is ``checkpoints/best.ckpt``."""
    from mindspore.train import CheckpointConfig, ModelCheckpoint

    set_mode("graph")
    net, model, train, valid = overfitting_model()
    per_epoch = train.get_dataset_size()
    seen = EvalResults()
    config = {
        "save_dir": str(tmp_path),
        "project": "p",
        "interval": 60,
        "evaluation": {"keep_best": True},
        "alerts": {"early_stopping": {"patience": 5, "restore_best": True}},
    }
    monitor = MonitorCallback(config)
    every_epoch = CheckpointConfig(save_checkpoint_steps=per_epoch, keep_checkpoint_max=100)
    saved = ModelCheckpoint(prefix="e", directory=str(tmp_path / "ckpt"), config=every_epoch)
    model.fit(OVERFIT_EPOCHS, train, valid, valid_frequency=1, callbacks=[monitor, seen, saved], dataset_sink_mode=False)
    run = mindwatch.open_run(monitor.run_dir)

    losses = [float(r["eval_loss"]) for r in seen.results]
    stop = first_stop(losses, 5)
    assert stop is not None and stop < OVERFIT_EPOCHS - 1, f"the eval loss must rise again: {losses}"
    assert len(seen.results) == stop + 1, "no evaluation after the one that decided"
    assert run.series("loss").step.tolist()[-1] == (stop + 1) * per_epoch, "no training step after that epoch"
    best = int(np.argmin(losses))
    assert run.state == "stopped"
    assert run.statuses[0]["reason"] == (
        f"stopped by mindwatch: early stopping: eval/eval_loss has not improved for 5 evaluations "
        f"(best {mindwatch.units.format_number(losses[best])} at step {(best + 1) * per_epoch}, epoch {best + 1})"
    )
    recorded = run.series("eval/eval_loss")
    assert recorded.value.tolist() == pytest.approx(losses, rel=1e-6)

    train_losses = dict(zip(run.series("loss").step.tolist(), run.series("loss").value.tolist(), strict=True))
    at = first_overfitting(list(zip(recorded.step.tolist(), recorded.value.tolist(), strict=True)), train_losses, 3)
    warned = [a for a in run.alerts if a["rule"] == "overfitting"]
    assert at is not None and [a["step"] for a in warned] == [int(recorded.step[at])], warned
    assert warned[0]["best_step"] == (best + 1) * per_epoch and warned[0]["best_epoch"] == best + 1

    best_file = tmp_path / "ckpt" / f"e-{best + 1}_{per_epoch}.ckpt"
    reference = ms.load_checkpoint(str(best_file))
    kept = ms.load_checkpoint(str(run.path / "checkpoints" / "best.ckpt"))
    for p in net.trainable_params():
        assert np.array_equal(p.asnumpy(), reference[p.name].asnumpy()), f"{p.name}: not the best epoch's weights"
        assert np.array_equal(kept[p.name].asnumpy(), reference[p.name].asnumpy()), f"best.ckpt's {p.name}"
    assert run.meta["evaluation"]["best_copy_bytes"] > sum(p.asnumpy().nbytes for p in net.trainable_params())


def test_memory_is_sampled_into_the_step_not_into_the_evaluation_after_it(tmp_path: Path) -> None:
    """The worker's samplers add to the newest step's record: an evaluation's record at the same step is not a step."""
    from mindwatch.monitor.worker import Monitor
    from mindwatch.store.writer import RunWriter

    writer = RunWriter(tmp_path, 0)
    mon = Monitor([writer], samplers=[lambda: {"host_rss_gb": 1.5}])  # not started: one drain, by close
    mon.record({"step": 5, "t": 1.0, "rank": 0, "loss": 0.7, "step_time": 0.01})
    mon.record({"step": 5, "t": 1.1, "rank": 0, "eval/loss": 0.9})
    mon.start().close()
    lines = [json.loads(line) for line in (tmp_path / "metrics.rank0.jsonl").read_text().splitlines()]
    assert [("host_rss_gb" in r, "eval/loss" in r) for r in lines] == [(True, False), (False, True)]


def test_a_loops_early_stop_lands_at_its_evaluation_and_a_primary_never_recorded_is_said(tmp_path: Path) -> None:
    """A loop that evaluates every 2 steps with scripted results: ``patience: 2`` stops it at the second evaluation
    that does not beat the best (``run.should_stop`` right after ``run.eval``); a configured primary that no
    evaluation records is an error alert at the first evaluation, and nothing stops."""
    set_mode("pynative")
    ms.set_seed(0)
    net = nn.SequentialCell(nn.Dense(FEATURES, 1))
    opt = nn.SGD(net.trainable_params(), learning_rate=0.01)
    step = jit_train_step(nn.WithLossCell(net, nn.MSELoss()), opt)
    x = ms.Tensor(np.ones((BATCH, FEATURES), np.float32))
    scripted = [0.9, 0.7, 0.8, 0.7, 0.75, 0.6]  # the 4th and 5th do not beat 0.7: the stop is at the 5th (step 10)
    stop = first_stop(scripted, 2)
    for primary, expected in ((None, stop), ("f1", None)):
        config = {"save_dir": str(tmp_path / str(primary)), "project": "p", "alerts": {"early_stopping": {"patience": 2}}}
        if primary:
            config["evaluation"] = {"primary": primary}
        stopped_after = None
        with mw.start_run(config, network=net, optimizer=opt) as run:
            for i in range(1, 2 * len(scripted) + 1):
                loss, grads = step(x, ms.Tensor(np.ones((BATCH, 1), np.float32)))
                run.step(loss=loss, grads=grads)
                if i % 2 == 0:
                    run.eval(loss=scripted[i // 2 - 1])
                if run.should_stop:
                    stopped_after = i
                    break
        recorded = mindwatch.open_run(run.run_dir)
        if expected is None:
            assert stopped_after is None and recorded.state == "finished"
            (said,) = [a for a in recorded.alerts if a["rule"] == "evaluation"]
            assert said["severity"] == "error" and "evaluation.primary is eval/f1" in said["message"]
            assert "it recorded eval/loss" in said["message"]
        else:
            assert stopped_after == 2 * (expected + 1), "the loop stops at the evaluation that decided"
            assert recorded.state == "stopped" and recorded.series("loss").step.tolist()[-1] == stopped_after
            assert recorded.statuses[0]["reason"] == (
                "stopped by mindwatch: early stopping: eval/loss has not improved for 2 evaluations (best 0.7 at step 4)"
            )


@pytest.mark.parametrize(
    ("section", "said"),
    [
        ({"evaluation": {"mode": "lowest"}}, "evaluation.mode is 'lowest': use min (a loss) or max (an accuracy)"),
        ({"alerts": {"early_stopping": {"patience": 0}}}, "alerts.early_stopping.patience"),
        ({"alerts": {"overfitting": {"min_delta": -1}}}, "alerts.overfitting.min_delta"),
    ],
)
def test_bad_evaluation_settings_are_said_when_the_config_loads(section: dict, said: str) -> None:
    from mindwatch.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=re.escape(said)):
        load_config(section)


def test_early_stopping_is_off_unless_given_and_on_when_given() -> None:
    from mindwatch.config import load_config

    assert not load_config({}).alerts.early_stopping.enabled
    given = load_config({"alerts": {"early_stopping": {"patience": 3}}}).alerts.early_stopping
    assert given.enabled and given.actions == ["stop"] and given.patience == 3
    assert not load_config({"alerts": {"early_stopping": {"enabled": False}}}).alerts.early_stopping.enabled


def test_a_fault_of_ours_in_an_evaluation_is_said_and_the_loop_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``run.eval`` follows the failure policy: a bug in mindwatch's evaluation is a warning, the training goes on."""
    from mindwatch.mindspore.evaluation import Evaluations

    def broken(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        raise RuntimeError("a bug of mindwatch's own")

    monkeypatch.setattr(Evaluations, "_record", broken)
    set_mode("pynative")
    net = nn.SequentialCell(nn.Dense(FEATURES, 1))
    opt = nn.SGD(net.trainable_params(), learning_rate=0.01)
    step = jit_train_step(nn.WithLossCell(net, nn.MSELoss()), opt)
    x = ms.Tensor(np.ones((BATCH, FEATURES), np.float32))
    with caplog.at_level(logging.WARNING, logger="mindwatch"), mw.start_run({"save_dir": str(tmp_path)}) as run:
        for i in range(1, 5):
            loss, grads = step(x, ms.Tensor(np.ones((BATCH, 1), np.float32)))
            run.step(loss=loss, grads=grads)
            run.eval(loss=float(i))
    recorded = mindwatch.open_run(run.run_dir)
    assert recorded.state == "finished" and recorded.series("loss").step.tolist() == [1, 2, 3, 4]
    assert "a bug of mindwatch's own" in caplog.text and "run.eval" in caplog.text
