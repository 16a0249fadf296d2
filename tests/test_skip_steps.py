"""``skip_steps``: one bad batch (its inputs x 30) costs one skipped step, decided in the graph, and is named.

Real trainings on CPU: a small regression MLP; the weights are snapshotted by a callback of the test's own
(or the loop itself) after every step, independently of mindwatch.
"""

from __future__ import annotations

from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mindspore import dataset as ds
from mindspore import nn, ops
from mindspore.train import Callback, Model

import mindwatch
import mindwatch.mindspore as mw
from mindwatch.mindspore import MonitorCallback, TrainOneStepWithGradNorm, TrainOneStepWithGradNormAndLossScale

STEPS, BAD, BATCH = 80, 60, 8


class Samples:
    """Random regression batches; the samples of step ``BAD`` (1-based) have their inputs x 30; ``ids`` 1000 + index."""

    def __init__(self, with_ids: bool = False) -> None:
        rng = np.random.default_rng(3)
        self.x = rng.normal(size=(STEPS * BATCH, 8)).astype(np.float32)
        self.y = (self.x @ rng.normal(size=(8, 1))).astype(np.float32)
        self.x[(BAD - 1) * BATCH : BAD * BATCH] *= 30.0
        self.with_ids = with_ids

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        item = (self.x[i], self.y[i])
        return (*item, np.int64(1000 + i)) if self.with_ids else item


def dataset(with_ids: bool = False) -> ds.Dataset:
    columns = ["x", "y", "sample_id"] if with_ids else ["x", "y"]
    return ds.GeneratorDataset(Samples(with_ids), columns, shuffle=False).batch(BATCH, drop_remainder=True)


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
