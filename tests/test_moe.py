"""A mixture of experts' routing, recorded by ``RouterStats`` in real trainings, against the test's own counts.

The reference is the test's own: each MoE layer of ``tests/moe_model.py`` keeps the experts its router chose and the
router's probabilities in Parameters of its own (an ``ops.assign`` in ``construct``); the test reads them after each
measured step and counts the choices with numpy.
"""

from __future__ import annotations

import logging

import mindspore as ms
import numpy as np
import pytest
from mindspore import dataset as ds
from mindspore import nn, ops
from mindspore.train import Callback, Model
from moe_model import EXPERTS, MoENet, batches, kept, routing_of

import mindwatch
import mindwatch.mindspore as mw
from mindwatch.mindspore import MonitorCallback, RouterStats, TrainOneStepWithGradNorm

EVERY, TOKENS = 5, 32
LAYERS = ("moe0", "moe1")


def assert_recorded_as_counted(run, counted: dict[int, dict[str, dict]], *, dropped: bool) -> None:
    """Each measured step's ``expert_load``, ``moe_imbalance``, ``router_entropy`` (and ``moe_dropped``) equal the
    test's own statistics of the kept choices."""
    assert sorted(counted) == list(range(EVERY, max(counted) + 1, EVERY))
    for layer in LAYERS:
        for e in range(EXPERTS):
            s = run.series(f"expert_load/{layer}/{e}")
            assert s.step.tolist() == sorted(counted), (layer, e)
            assert s.value.tolist() == pytest.approx([counted[t][layer]["shares"][e] for t in sorted(counted)], abs=1e-6)
        imbalance = run.series(f"moe_imbalance/{layer}")
        assert imbalance.value.tolist() == pytest.approx([counted[t][layer]["imbalance"] for t in sorted(counted)], rel=1e-6)
        entropy = run.series(f"router_entropy/{layer}")
        assert entropy.value.tolist() == pytest.approx([counted[t][layer]["entropy"] for t in sorted(counted)], rel=1e-4)
        if dropped:
            recorded = run.series(f"moe_dropped/{layer}").value.tolist()
            assert recorded == pytest.approx([counted[t][layer]["dropped"] for t in sorted(counted)], abs=1e-6)
        else:
            assert f"moe_dropped/{layer}" not in run.metrics


class CountRouting(Callback):
    """After mindwatch's callback: the test's own routing statistics of each measured step's kept choices."""

    def __init__(self, net: MoENet, capacity_factor: float | None) -> None:
        self.net, self.capacity_factor = net, capacity_factor
        self.counted: dict[int, dict[str, dict]] = {}

    def on_train_step_end(self, run_context) -> None:
        step = int(run_context.original_args().cur_step_num)
        if step % EVERY == 0:
            self.counted[step] = {k: routing_of(i, p, self.capacity_factor) for k, (i, p) in kept(self.net).items()}


@pytest.mark.slow  # ~6 s
def test_model_train_records_each_experts_share_as_the_test_counts_them(tmp_path) -> None:
    """GRAPH, our train cell, top-2 of 4 with a capacity factor of 1: on every measured step the recorded shares, the
    imbalance, the router's entropy and the share over capacity are the test's own; a healthy routing raises no alert."""
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    net = MoENet(TOKENS, k=2, capacity_factor=1.0)
    train_net = TrainOneStepWithGradNorm(nn.WithLossCell(net, nn.MSELoss()), nn.Adam(net.trainable_params(), 1e-3))
    data = ds.GeneratorDataset(batches(30, TOKENS), ["x", "y"], shuffle=False)
    counting = CountRouting(net, capacity_factor=1.0)
    monitor = MonitorCallback({"save_dir": str(tmp_path), "project": "p", "interval": 60, "moe": {"every": EVERY}})
    Model(train_net).train(1, data, callbacks=[monitor, counting], dataset_sink_mode=False)
    run = mindwatch.open_run(monitor.run_dir)
    assert_recorded_as_counted(run, counting.counted, dropped=True)
    assert any(counting.counted[t]["moe0"]["dropped"] > 0 for t in counting.counted), "nothing over capacity: no test"
    assert [a for a in run.alerts if a["rule"] in ("expert_collapse", "router_imbalance")] == []


@pytest.mark.slow  # ~8 s
def test_a_loop_in_pynative_records_the_routing_and_a_router_sent_to_one_expert_collapses(tmp_path) -> None:
    """PyNative, a loop of its own, top-1: the shares are the test's own counts; from step K a bias sends every token of
    ``moe1`` to expert 0, and exactly one ``expert_collapse`` names that layer within ``count`` measured steps of K
    (none before K, none on ``moe0``)."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_seed(0)
    steps, bias_from, count = 30, 13, 3
    net = MoENet(TOKENS, k=1)
    optimizer = nn.Adam(net.trainable_params(), 1e-3)
    loss_net = nn.WithLossCell(net, nn.MSELoss())
    grad_fn = ms.value_and_grad(loss_net, None, optimizer.parameters)

    def train_step(x, y):
        loss, grads = grad_fn(x, y)
        optimizer(grads)
        return loss, grads

    counted: dict[int, dict[str, dict]] = {}
    config = {"save_dir": str(tmp_path), "project": "p", "interval": 60, "moe": {"every": EVERY}}
    with mw.start_run(config, network=net, optimizer=optimizer, total_steps=steps) as run:
        for step, (x, y) in enumerate(batches(steps, TOKENS, seed=1), start=1):
            if step == bias_from:
                ops.assign(net.moe1.expert_bias, ms.Tensor(np.array([30, 0, 0, 0], np.float32)))
            loss, grads = train_step(ms.Tensor(x), ms.Tensor(y))
            run.step(loss=loss, grads=grads)
            if step % EVERY == 0:
                counted[step] = {k: routing_of(i, p) for k, (i, p) in kept(net).items()}
    recorded = mindwatch.open_run(run.run_dir)
    assert_recorded_as_counted(recorded, counted, dropped=False)
    assert counted[20]["moe1"]["shares"][0] == 1.0, "the bias did not send every token to expert 0"
    collapses = [a for a in recorded.alerts if a["rule"] == "expert_collapse"]
    first_measured = -(-bias_from // EVERY) * EVERY
    assert [(a["metric"], a["step"]) for a in collapses] == [("expert_load/moe1", first_measured + (count - 1) * EVERY)]
    assert collapses[0]["experts"] == [0, 1, 2, 3]  # expert 0 takes all (above the ceiling), the others starve
    assert "MoE layer moe1" in collapses[0]["message"] and "expert 0 100 %" in collapses[0]["message"]


def test_indices_naming_no_expert_are_dropped_with_one_warning_and_a_bad_shape_names_the_layer(caplog) -> None:
    """Out of [0, experts): counted as dropped, one warning; probabilities of the wrong width: an error naming the cell."""
    from mindwatch.mindspore.routing_watch import RoutingWatch

    ms.set_context(mode=ms.PYNATIVE_MODE)
    cell = RouterStats(4)
    watch = RoutingWatch([("blocks.0.moe", cell)], every=1)
    watch.plan(1)
    recs = []
    with caplog.at_level(logging.WARNING, logger="mindwatch"):
        for _ in range(2):
            cell(ms.Tensor(np.array([[0, 1], [2, 7], [-1, 3]], np.int32)))
            rec: dict = {"step": 1}
            watch.add(rec, watch.read())
            recs.append(rec)
    assert [r.getMessage() for r in caplog.records if "named no expert" in r.getMessage()] == [
        "mindwatch: blocks.0.moe: 2 of 6 routed choices at step 1 named no expert (an index outside [0, 4)): counted as "
        "dropped (moe_dropped/blocks.0.moe)"
    ]
    assert recs[1]["moe_dropped/blocks.0.moe"] == pytest.approx(2 / 6)
    assert [recs[1][f"expert_load/blocks.0.moe/{e}"] for e in range(4)] == pytest.approx([0.25] * 4)
    with pytest.raises(ValueError, match=r"blocks\.0\.moe: the router's probabilities must have num_experts \(4\)"):
        cell(ms.Tensor(np.zeros((3, 2), np.int32)), ms.Tensor(np.zeros((3, 5), np.float32)))
    with pytest.raises(TypeError, match=r"blocks\.0\.moe: RouterStats takes the chosen experts' integer indices first"):
        cell(ms.Tensor(np.zeros((3, 2), np.float32)))
