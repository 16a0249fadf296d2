"""Interventions on real MindSpore trainings with real faults: NaN -> alert + stop on that step; lr_backoff; checkpoint."""

from __future__ import annotations

import math
import time
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mindspore import dataset as ds
from mindspore import nn
from mindspore.train import Callback, CheckpointConfig, Model, ModelCheckpoint

import mindwatch
from mindwatch.demo.corpus import ByteWindows, stdlib_corpus
from mindwatch.demo.model import GPTConfig, LanguageModelLoss, TinyGPT
from mindwatch.demo.train import lr_schedule, set_mode
from mindwatch.mindspore import MonitorCallback, TrainOneStepWithGradNorm

BATCH, SEQ = 4, 16
GPT = GPTConfig(seq_length=SEQ, layers=1, d_model=32, heads=2)


def dataset(steps: int) -> ds.Dataset:
    windows = ByteWindows(stdlib_corpus(200_000), SEQ, steps * BATCH, seed=1)
    return ds.GeneratorDataset(windows, ["ids", "targets"], shuffle=False).batch(BATCH, drop_remainder=True)


class Observer(Callback):
    """Independent of mindwatch: loss and grad_norm as the train cell returned them, per step; optionally slow steps."""

    def __init__(self, pause: float = 0.0) -> None:
        self.loss: dict[int, float] = {}
        self.grad_norm: dict[int, float] = {}
        self.lr: dict[int, float] = {}
        self.pause = pause

    def on_train_step_end(self, run_context) -> None:
        cb = run_context.original_args()
        loss, norm, lr = (float(x.asnumpy()) for x in cb.net_outputs[:3])  # mindwatch_outputs: loss, grad_norm, lr, ...
        self.loss[cb.cur_step_num], self.grad_norm[cb.cur_step_num], self.lr[cb.cur_step_num] = loss, norm, lr
        time.sleep(self.pause)  # give the worker thread time to act (these steps take milliseconds)


def train(lr, steps: int, cfg: dict, mode: str = "graph", observer: Observer | None = None, extra=()) -> tuple:
    set_mode(mode)
    ms.set_seed(0)
    net = TinyGPT(GPT)
    opt = nn.SGD(net.trainable_params(), learning_rate=lr)
    model = Model(TrainOneStepWithGradNorm(LanguageModelLoss(net), opt))
    obs = observer or Observer()
    mon = MonitorCallback(cfg)
    model.train(1, dataset(steps), callbacks=[obs, *extra, mon], dataset_sink_mode=False)
    return mindwatch.open_run(mon.run_dir), obs, opt


def test_nan_is_alerted_on_the_step_it_appears_and_stop_ends_training_on_that_step(tmp_path: Path) -> None:
    cfg = {"save_dir": str(tmp_path), "alerts": {"nonfinite": {"actions": ["stop"]}}}
    run, obs, _ = train(300.0, 40, cfg)  # SGD at lr 300: the weights blow up within a few steps

    bad = [s for s in sorted(obs.loss) if not (math.isfinite(obs.loss[s]) and math.isfinite(obs.grad_norm[s]))]
    assert bad, "the training never went non-finite; raise the learning rate"
    first = bad[0]
    assert max(obs.loss) == first, "training went on after the NaN step"
    (alert,) = [a for a in run.alerts if a["rule"] == "nonfinite"]
    assert alert["step"] == first and alert["severity"] == "error" and alert["actions"] == ["stop"]
    assert alert["metric"] in ("loss", "grad_norm")
    assert set(alert) >= {"t", "step", "rank", "rule", "metric", "value", "threshold", "severity", "message", "actions"}
    (stop,) = [a for a in run.alerts if a["rule"] == "intervention"]
    assert stop["actions"] == ["stop"] and stop["step"] == first
    assert run.state == "stopped"
    assert run.statuses[0]["last_step"] == first
    assert "is nan" in run.statuses[0]["reason"] or "is inf" in run.statuses[0]["reason"]


def test_without_actions_a_nan_is_alerted_once_and_training_goes_on(tmp_path: Path) -> None:
    run, obs, _ = train(300.0, 20, {"save_dir": str(tmp_path)})
    assert max(obs.loss) == 20
    alerts = [a for a in run.alerts if a["rule"] == "nonfinite"]
    metrics = [a["metric"] for a in alerts]
    assert len(metrics) == len(set(metrics)) >= 1  # the cooldown (300 s) holds back every later NaN step of a metric
    first = min(s for s in obs.loss if not (math.isfinite(obs.loss[s]) and math.isfinite(obs.grad_norm[s])))
    assert alerts[0]["step"] == first
    assert run.state == "finished"


def polynomial(steps: int) -> nn.LearningRateSchedule:
    return nn.PolynomialDecayLR(1e-2, 1e-3, steps, power=1.0)


@pytest.mark.parametrize(("kind", "mode"), [("fixed", "graph"), ("list", "graph"), ("schedule", "graph"), ("list", "pynative")])
def test_lr_backoff_changes_the_rate_the_next_step_uses(kind: str, mode: str, tmp_path: Path) -> None:
    steps = 30 if mode == "graph" else 12
    table = lr_schedule(steps, 1e-2, 5)
    lr = {"fixed": 1e-2, "list": table, "schedule": polynomial(steps)}[kind]
    # a threshold every step exceeds, asking for lr_backoff: fires once (cooldown), acted on at a step boundary
    cfg = {
        "save_dir": str(tmp_path),
        "callback": {"params": {"warn_on_value": {"loss": 0.0}}},
        "alerts": {"thresholds": {"actions": ["lr_backoff"]}, "lr_backoff_factor": 0.5},
    }
    run, obs, opt = train(lr, steps, cfg, mode=mode, observer=Observer(pause=0.03))

    (done,) = [a for a in run.alerts if a["rule"] == "intervention"]
    k = done["step"]  # the boundary it acted at: steps after k use half the rate
    assert 1 <= k < steps
    expected = {
        "fixed": lambda s: 1e-2,
        "list": lambda s: table[s - 1],
        "schedule": lambda s: 1e-2 - (1e-2 - 1e-3) * min(s - 1, steps) / steps,
    }[kind]
    for s in range(1, steps + 1):  # what the optimizer used, as the train cell's graph returned it
        want = expected(s) * (0.5 if s > k else 1.0)
        assert obs.lr[s] == pytest.approx(want, rel=1e-5), s
    assert done["lr_before"] == pytest.approx(expected(k + 1), rel=1e-5)
    assert done["lr_after"] == pytest.approx(0.5 * expected(k + 1), rel=1e-5)
    lr_series = run.series("lr")
    recorded = dict(zip(lr_series.step.tolist(), lr_series.value.tolist(), strict=True))
    assert recorded[k + 1] == pytest.approx(0.5 * expected(k + 1), rel=1e-5)
    if kind == "fixed":
        assert float(opt.learning_rate.asnumpy()) == pytest.approx(5e-3)


def test_checkpoint_and_stacks_on_nan_name_the_last_healthy_checkpoint(tmp_path: Path) -> None:
    ckpt_dir = tmp_path / "ckpt"
    saver = ModelCheckpoint(
        prefix="tiny", directory=str(ckpt_dir), config=CheckpointConfig(save_checkpoint_steps=1, keep_checkpoint_max=50)
    )
    cfg = {"save_dir": str(tmp_path / "runs"), "alerts": {"nonfinite": {"actions": ["checkpoint", "dump_stacks", "stop"]}}}
    run, obs, _ = train(300.0, 40, cfg, extra=[saver])

    first = max(obs.loss)  # stop acted on the NaN step
    acts = {a["actions"][0]: a for a in run.alerts if a["rule"] == "intervention"}
    assert set(acts) == {"checkpoint", "dump_stacks", "stop"}
    ck = acts["checkpoint"]
    saved = Path(ck["checkpoint"])
    assert saved.parent == run.path / "checkpoints" and saved.is_file()
    params = ms.load_checkpoint(str(saved))
    assert any("weight" in name for name in params)
    assert Path(ck["last_healthy_checkpoint"]).name == f"tiny-1_{first - 1}.ckpt"
    healthy = ms.load_checkpoint(ck["last_healthy_checkpoint"])
    assert all(np.isfinite(p.asnumpy()).all() for p in healthy.values())
    stacks = Path(acts["dump_stacks"]["stacks"]).read_text()
    assert "on_train_step_end" in stacks and "mindwatch-monitor" in stacks
