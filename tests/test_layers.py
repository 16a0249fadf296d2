"""Per-layer health on real trainings (CPU): the statistics equal what the weights themselves say."""

from __future__ import annotations

from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn
from mindspore.train import Callback, Model
from test_callback import GPT, gpt_dataset

import mindwatch
from mindwatch.demo.model import LanguageModelLoss, TinyGPT
from mindwatch.demo.train import set_mode
from mindwatch.mindspore import MonitorCallback, TrainOneStepWithGradNorm, TrainOneStepWithGradNormAndLossScale

LR = 0.05


class WeightSnapshots(Callback):
    """The weights at each step's begin and end, by parameter name (the independent reference)."""

    def __init__(self, net: nn.Cell) -> None:
        self.net = net
        self.before: dict[int, dict[str, np.ndarray]] = {}
        self.after: dict[int, dict[str, np.ndarray]] = {}

    def _weights(self) -> dict[str, np.ndarray]:
        return {p.name: p.asnumpy().astype(np.float64) for p in self.net.trainable_params()}

    def on_train_step_begin(self, run_context) -> None:
        self.before[run_context.original_args().cur_step_num] = self._weights()

    def on_train_step_end(self, run_context) -> None:
        self.after[run_context.original_args().cur_step_num] = self._weights()


def layer_of(name: str) -> str:
    """The layer of a parameter, as the docs define it: ``network.blocks.0.attn.qkv.weight`` -> ``blocks.0.attn.qkv``."""
    return name.removeprefix("network.").rsplit(".", 1)[0]


def by_layer(values: dict[str, np.ndarray]) -> dict[str, float]:
    """Squared sums of the parameters of each layer."""
    out: dict[str, float] = {}
    for name, v in values.items():
        out[layer_of(name)] = out.get(layer_of(name), 0.0) + float((v**2).sum())
    return out


def train(tmp_path: Path, mode: str, optimizer: str = "sgd", every: int = 1, steps: int = 6, loss_scale: bool = False):
    set_mode(mode)
    ms.set_seed(7)
    net = LanguageModelLoss(TinyGPT(GPT))
    params = net.trainable_params()
    opt = nn.SGD(params, learning_rate=LR) if optimizer == "sgd" else nn.Adam(params, learning_rate=1e-2)
    if loss_scale:
        cell = TrainOneStepWithGradNormAndLossScale(net, opt, ms.Tensor(1.0, ms.float32), layer_stats=True)
    else:
        cell = TrainOneStepWithGradNorm(net, opt, layer_stats=True)
    snaps = WeightSnapshots(net)
    monitor = MonitorCallback({"save_dir": str(tmp_path), "project": "p", "layers": {"every": every}, "interval": 60})
    Model(cell).train(1, gpt_dataset(steps), callbacks=[snaps, monitor], dataset_sink_mode=False)
    return mindwatch.open_run(monitor.run_dir), snaps


@pytest.mark.parametrize("mode", ["graph", "pynative"])
def test_layer_statistics_equal_the_weights_own_story_with_sgd(tmp_path: Path, mode: str) -> None:
    run, snaps = train(tmp_path, mode)
    layers = sorted(by_layer(snaps.before[1]))
    assert "blocks.0.attn.qkv" in layers and {f"grad_norm/{layer}" for layer in layers} <= set(run.metrics)
    checked = 0
    for layer in layers:
        g, w, r = (run.series(f"{stat}/{layer}") for stat in ("grad_norm", "weight_norm", "update_ratio"))
        assert g.step.tolist() == list(range(1, 7))
        for i, step in enumerate(g.step.tolist()):
            before, after = snaps.before[step], snaps.after[step]
            grads = {n: (before[n] - after[n]) / LR for n in before if layer_of(n) == layer}  # plain SGD: w -= lr * g
            delta = {n: after[n] - before[n] for n in grads}
            ref_g = np.sqrt(by_layer(grads)[layer])
            ref_w = np.sqrt(by_layer({n: before[n] for n in grads})[layer])
            ref_r = np.sqrt(by_layer(delta)[layer]) / ref_w
            assert g.value[i] == pytest.approx(ref_g, rel=1e-3), (layer, step)
            assert w.value[i] == pytest.approx(ref_w, rel=1e-3), (layer, step)
            assert r.value[i] == pytest.approx(ref_r, rel=1e-3), (layer, step)
            checked += 1
    assert checked == 6 * len(layers)


def test_update_ratio_with_adam_is_what_the_optimizer_did(tmp_path: Path) -> None:
    run, snaps = train(tmp_path, "graph", optimizer="adam", every=2)
    for layer in ("blocks.0.attn.qkv", "blocks.0.mlp.0", "head"):
        r = run.series(f"update_ratio/{layer}")
        assert r.step.tolist() == [2, 4, 6]  # every 2 steps; the others are not measured
        for step, value in zip(r.step.tolist(), r.value, strict=True):
            before = {n: v for n, v in snaps.before[step].items() if layer_of(n) == layer}
            delta = {n: snaps.after[step][n] - v for n, v in before.items()}
            assert value == pytest.approx(np.sqrt(by_layer(delta)[layer] / by_layer(before)[layer]), rel=1e-3)


def test_the_loss_scale_cell_measures_layers_too(tmp_path: Path) -> None:
    run, snaps = train(tmp_path, "graph", loss_scale=True, steps=4)
    g = run.series("grad_norm/head")
    assert g.step.tolist() == [1, 2, 3, 4]
    for i, step in enumerate(g.step.tolist()):
        grads = {n: (v - snaps.after[step][n]) / LR for n, v in snaps.before[step].items() if layer_of(n) == "head"}
        assert g.value[i] == pytest.approx(np.sqrt(by_layer(grads)["head"]), rel=1e-3)
