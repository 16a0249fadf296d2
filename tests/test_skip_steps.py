"""``skip_steps``: one bad batch (its inputs x 30) costs one skipped step, decided in the graph, and is named.

Real trainings on CPU: a small regression MLP; the weights are snapshotted by a callback of the test's own
(or the loop itself) after every step, independently of mindwatch.
"""

from __future__ import annotations

import json
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mindspore import dataset as ds
from mindspore import nn, ops
from mindspore.train import Callback, Model

import mindwatch
import mindwatch.mindspore as mw
from mindwatch import metrics as vocab
from mindwatch.mindspore import MonitorCallback, TrainOneStepWithGradNorm, TrainOneStepWithGradNormAndLossScale

STEPS, BAD, BATCH = 80, 60, 8


class Samples:
    """Random regression batches; the samples of step ``BAD`` (1-based) have their inputs x 30; ``ids`` 1000 + index."""

    def __init__(self, with_ids: bool = False, bad: int = BAD) -> None:
        rng = np.random.default_rng(3)
        self.x = rng.normal(size=(STEPS * BATCH, 8)).astype(np.float32)
        self.y = (self.x @ rng.normal(size=(8, 1))).astype(np.float32)
        self.x[(bad - 1) * BATCH : bad * BATCH] *= 30.0
        self.with_ids = with_ids

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        item = (self.x[i], self.y[i])
        return (*item, np.int64(1000 + i)) if self.with_ids else item


def dataset(with_ids: bool = False, bad: int = BAD) -> ds.Dataset:
    columns = ["x", "y", "sample_id"] if with_ids else ["x", "y"]
    return ds.GeneratorDataset(Samples(with_ids, bad), columns, shuffle=False).batch(BATCH, drop_remainder=True)


def mlp() -> nn.Cell:
    ms.set_seed(0)
    return nn.SequentialCell(nn.Dense(8, 16), nn.ReLU(), nn.Dense(16, 1))


class WithIds(nn.Cell):
    """The loss of ``(x, y, ids)`` batches: the ids ride along for mindwatch and are not used."""

    def __init__(self, net: nn.Cell) -> None:
        super().__init__()
        self.net, self.loss = net, nn.MSELoss()

    def construct(self, x, y, ids):
        return self.loss(self.net(x), y)


class Weights(Callback):
    """The network's weights after every step, copied to the host (independent of mindwatch)."""

    def __init__(self, net: nn.Cell) -> None:
        self.net = net
        self.after: dict[int, list[np.ndarray]] = {}

    def on_train_step_end(self, run_context) -> None:
        step = run_context.original_args().cur_step_num
        self.after[step] = [p.asnumpy().copy() for p in self.net.trainable_params()]


def same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def set_mode(mode: str) -> None:
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)


def train_a_skipping_run(save_dir: Path) -> Path:
    """A real training with a loss scale and ``skip_steps`` (GRAPH): one bad batch (inputs x 30), whose update it skips.
    The dashboard's and the report's browser tests look at it."""
    set_mode("graph")
    net = mlp()
    opt = nn.SGD(net.trainable_params(), learning_rate=0.01)
    cell = TrainOneStepWithGradNormAndLossScale(nn.WithLossCell(net, nn.MSELoss()), opt, nn.FixedLossScaleUpdateCell(1.0))
    mon = MonitorCallback({"save_dir": str(save_dir), "project": "p", "run_name": "skips", "skip_steps": {"enabled": True}})
    Model(cell).train(1, dataset(), callbacks=[mon], dataset_sink_mode=False)
    return Path(mon.run_dir)


def skipped_steps(run_dir: Path) -> list[int]:
    """The steps rank 0's metrics file says were skipped, read here with json (not with mindwatch's reader)."""
    rows = map(json.loads, (run_dir / "metrics.rank0.jsonl").read_text().splitlines())
    return [r["step"] for r in rows if r.get(vocab.SKIPPED) == 1]


def check_one_skip(run, weights: dict[int, list[np.ndarray]]) -> None:
    assert same(weights[BAD], weights[BAD - 1]), "the bad step's update was applied"
    assert not same(weights[BAD + 1], weights[BAD]), "training stopped learning after the skipped step"
    assert not same(weights[BAD - 1], weights[BAD - 2])
    skipped = run.series("skipped")
    assert list(skipped.step[skipped.value == 1]) == [BAD]
    assert len(skipped) == STEPS and run.state == "finished"
    (alert,) = [a for a in run.alerts if a["rule"] == "skip"]
    assert alert["step"] == BAD and alert["metric"] == "grad_norm" and alert["epoch"] == 1 and alert["batch"] == BAD - 1


@pytest.mark.parametrize("mode", ["graph", "pynative"])
def test_a_bad_batch_costs_one_skipped_step_and_training_goes_on(tmp_path: Path, mode: str) -> None:
    set_mode(mode)
    net = mlp()
    opt = nn.SGD(net.trainable_params(), learning_rate=0.01)
    model = Model(TrainOneStepWithGradNorm(nn.WithLossCell(net, nn.MSELoss()), opt))
    weights = Weights(net)
    mon = MonitorCallback({"save_dir": str(tmp_path), "skip_steps": {"enabled": True}})
    model.train(1, dataset(), callbacks=[weights, mon], dataset_sink_mode=False)

    run = mindwatch.open_run(mon.run_dir)
    check_one_skip(run, weights.after)


def test_the_loss_scale_cell_skips_too_and_records_no_overflow_for_it(tmp_path: Path) -> None:
    set_mode("graph")
    net = mlp()
    opt = nn.SGD(net.trainable_params(), learning_rate=0.01)
    scale = nn.FixedLossScaleUpdateCell(1.0)
    model = Model(TrainOneStepWithGradNormAndLossScale(nn.WithLossCell(net, nn.MSELoss()), opt, scale))
    weights = Weights(net)
    mon = MonitorCallback({"save_dir": str(tmp_path), "skip_steps": {"enabled": True}})
    model.train(1, dataset(), callbacks=[weights, mon], dataset_sink_mode=False)

    run = mindwatch.open_run(mon.run_dir)
    check_one_skip(run, weights.after)
    assert not run.series("overflow").value.any()


def test_without_skip_steps_the_cell_declares_no_skipped_output_and_applies_the_bad_step(tmp_path: Path) -> None:
    set_mode("graph")
    net = mlp()
    opt = nn.SGD(net.trainable_params(), learning_rate=0.01)
    cell = TrainOneStepWithGradNorm(nn.WithLossCell(net, nn.MSELoss()), opt)
    weights = Weights(net)
    mon = MonitorCallback({"save_dir": str(tmp_path)})
    Model(cell).train(1, dataset(), callbacks=[weights, mon], dataset_sink_mode=False)
    assert cell.skip_decision is None and "skipped" not in cell.mindwatch_outputs
    assert not same(weights.after[BAD], weights.after[BAD - 1])


def test_a_spike_alert_names_the_epoch_the_batch_index_and_its_sample_ids(tmp_path: Path, capsys) -> None:
    set_mode("graph")
    net = mlp()
    opt = nn.SGD(net.trainable_params(), learning_rate=0.01)
    model = Model(TrainOneStepWithGradNorm(WithIds(net), opt))
    cfg = {
        "save_dir": str(tmp_path),
        "callback": {"sample_ids": "sample_id"},
        "alerts": {"spike": {"metrics": ["grad_norm"], "count": 1}},
    }
    mon = MonitorCallback(cfg)
    model.train(1, dataset(with_ids=True), callbacks=[mon], dataset_sink_mode=False)

    run = mindwatch.open_run(mon.run_dir)
    spikes = [a for a in run.alerts if a["rule"] == "spike"]
    assert spikes and spikes[0]["step"] == BAD, spikes
    first = (BAD - 1) * BATCH
    assert spikes[0]["epoch"] == 1 and spikes[0]["batch"] == BAD - 1
    assert spikes[0]["sample_ids"] == list(range(1000 + first, 1000 + first + BATCH))

    from mindwatch.cli import main
    from mindwatch.report.html import render_report

    assert main(["batches", str(mon.run_dir)]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.split()[:1] == [str(BAD)])
    assert line.split()[1:4] == ["0", "1", str(BAD - 1)] and "spike on grad_norm" in line and f"{1000 + first}, " in line
    page = render_report([run])
    table = page.split('<table id="batches">', 1)[1].split("</table>", 1)[0]
    assert f"<td>{BAD}</td>" in table and f"{1000 + first}, {1001 + first}" in table


def test_the_loop_skips_a_bad_step_with_skip_step_in_place_of_the_optimizer(tmp_path: Path) -> None:
    ms.set_context(mode=ms.PYNATIVE_MODE)
    net = mlp()
    opt = nn.SGD(net.trainable_params(), learning_rate=0.01)
    loss_fn = nn.MSELoss()

    def forward(x, y):
        return loss_fn(net(x), y)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)
    skip_step = mw.SkipStep(opt)

    @ms.jit
    def train_step(x, y):
        loss, grads = grad_fn(x, y)
        skipped = skip_step(grads)
        return loss, grads, skipped

    weights: dict[int, list[np.ndarray]] = {}
    data = dataset(with_ids=True)
    with mw.start_run({"save_dir": str(tmp_path), "skip_steps": {"enabled": True}}, network=net, optimizer=opt) as run:
        for step, (x, y, ids) in enumerate(run.batches(data.create_tuple_iterator()), 1):
            loss, grads, skipped = train_step(x, y)
            run.step(loss=loss, grads=grads, skipped=skipped, sample_ids=ids)
            weights[step] = [p.asnumpy().copy() for p in net.trainable_params()]

    opened = mindwatch.open_run(run.run_dir)
    check_one_skip(opened, weights)
    (alert,) = [a for a in opened.alerts if a["rule"] == "skip"]
    assert alert["sample_ids"][0] == 1000 + (BAD - 1) * BATCH
    assert ops.isfinite(loss)


def test_max_consecutive_skips_in_a_row_raise_an_error_alert_with_the_actions() -> None:
    from mindwatch.alerts.skip import SkipRule

    rule = SkipRule(enabled=True, max_consecutive=3, actions=["stop"])
    fired = [rule.check({"step": s, "skipped": 1.0, "grad_norm": 50.0, "epoch": 1, "batch": s - 1}) for s in (10, 12, 13, 14)]
    assert [len(f) for f in fired] == [1, 1, 1, 2]  # 10 alone; 12, 13, 14 in a row
    last = fired[-1][-1]
    assert last["severity"] == "error" and last["actions"] == ["stop"] and last["in_a_row"] == 3 and last["batch"] == 13
    assert all(f[0]["actions"] == [] for f in fired)
    assert rule.check({"step": 15, "skipped": 0.0}) == []


class TutorialLoop:
    """The tutorial's loop on :func:`dataset`'s batches: ``value_and_grad`` and a jit step that calls ``update``."""

    def __init__(self) -> None:
        ms.set_context(mode=ms.PYNATIVE_MODE)
        self.net = mlp()
        self.opt = nn.SGD(self.net.trainable_params(), learning_rate=0.01)
        loss_fn = nn.MSELoss()

        def forward(x, y):
            return loss_fn(self.net(x), y)

        self.grad_fn = ms.value_and_grad(forward, None, self.opt.parameters)

    def train(self, run: mw.Run, skip_step: mw.SkipStep | None, bad: int = BAD) -> dict[int, list[np.ndarray]]:
        """Train one epoch (the bad batch at step ``bad``); ``skip_step`` in place of ``optimizer(grads)``, or the
        plain optimizer (None)."""
        grad_fn, opt = self.grad_fn, self.opt

        @ms.jit
        def plain_step(x, y):
            loss, grads = grad_fn(x, y)
            opt(grads)
            return loss, grads

        @ms.jit
        def skipping_step(x, y):
            loss, grads = grad_fn(x, y)
            return loss, grads, skip_step(grads)

        weights = {}
        for step, (x, y) in enumerate(run.batches(dataset(bad=bad).create_tuple_iterator()), 1):
            if skip_step is None:
                run.step(*plain_step(x, y))
            else:
                loss, grads, skipped = skipping_step(x, y)
                run.step(loss=loss, grads=grads, skipped=skipped)
            weights[step] = [p.asnumpy().copy() for p in self.net.trainable_params()]
        return weights


def test_skip_steps_in_a_loop_without_skip_step_warns_once_naming_skip_step(tmp_path: Path, caplog) -> None:
    """``skip_steps: {enabled: true}`` alone cannot skip a loop's update (the loop calls the optimizer itself): the
    first step says so, once, and how to use ``mw.SkipStep``; the bad step is applied, as the warning says."""
    loop = TutorialLoop()
    with mw.start_run({"save_dir": str(tmp_path), "skip_steps": {"enabled": True}}, optimizer=loop.opt) as run:
        weights = loop.train(run, skip_step=None)
    warnings = [r for r in caplog.records if r.name == "mindwatch" and "SkipStep" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelname == "WARNING"
    text = warnings[0].getMessage()
    assert "mw.SkipStep(optimizer, run=run)" in text and "skipped=skipped" in text and "skips no update" in text
    assert not same(weights[BAD], weights[BAD - 1])
    assert "skipped" not in mindwatch.open_run(run.run_dir).metrics


def test_a_loop_with_skip_step_gets_no_such_warning(tmp_path: Path, caplog) -> None:
    loop = TutorialLoop()
    with mw.start_run({"save_dir": str(tmp_path), "skip_steps": {"enabled": True}}, optimizer=loop.opt) as run:
        loop.train(run, mw.SkipStep(loop.opt, run=run))
    assert not [r for r in caplog.records if "SkipStep" in r.getMessage()]


def test_skip_step_takes_its_settings_from_the_runs_config(tmp_path: Path) -> None:
    """``warmup: 5`` written once, in the config: step 10's bad batch (inputs x 30) is skipped, which the default
    warmup of 20 would not do, and the decision cell holds the config's sigma, window and warmup."""
    loop = TutorialLoop()
    config = {"save_dir": str(tmp_path), "skip_steps": {"enabled": True, "warmup": 5, "sigma": 4.0, "window": 32}}
    with mw.start_run(config, optimizer=loop.opt) as run:
        skip_step = mw.SkipStep(loop.opt, run=run)
        weights = loop.train(run, skip_step, bad=10)
    decision = skip_step.decision
    assert decision is not None and decision.window == 32
    assert float(decision.sigma.asnumpy()) == 4.0 and int(decision.warmup.asnumpy()) == 5
    skipped = mindwatch.open_run(run.run_dir).series("skipped")
    assert list(skipped.step[skipped.value == 1]) == [10]
    assert same(weights[10], weights[9])
    assert mw.SkipStep(loop.opt, run=run, warmup=5, sigma=4).decision is not None  # keywords that agree are fine


def test_skip_step_keywords_that_disagree_with_the_runs_config_are_an_error_naming_the_key(tmp_path: Path) -> None:
    net = mlp()
    opt = nn.SGD(net.trainable_params(), learning_rate=0.01)
    with mw.start_run({"save_dir": str(tmp_path), "skip_steps": {"enabled": True, "sigma": 4.0}}, optimizer=opt) as run:
        with pytest.raises(ValueError, match=r"SkipStep\(sigma=6\.0\) disagrees with the run's config, skip_steps\.sigma: 4\.0"):
            mw.SkipStep(opt, run=run, sigma=6.0)
        with pytest.raises(ValueError, match=r"skip_steps\.window: 128"):  # the config's default counts as written
            mw.SkipStep(opt, run=run, window=64)
        with pytest.raises(TypeError, match="not both"):
            mw.SkipStep(opt, run.config.skip_steps, run=run)


def test_skip_step_of_a_run_whose_skip_steps_is_off_applies_every_update_and_says_so(tmp_path: Path, caplog) -> None:
    """The config switches skipping off without a change to the code; the warning says how to switch it on."""
    loop = TutorialLoop()
    with mw.start_run({"save_dir": str(tmp_path)}, optimizer=loop.opt) as run:
        skip_step = mw.SkipStep(loop.opt, run=run)
        weights = loop.train(run, skip_step)
    assert skip_step.decision is None
    (warning,) = [r.getMessage() for r in caplog.records if "SkipStep" in r.getMessage()]
    assert "applies every update" in warning and "skip_steps: {enabled: true}" in warning
    assert not same(weights[BAD], weights[BAD - 1])
    assert not mindwatch.open_run(run.run_dir).series("skipped").value.any()
