"""Per-layer health on real trainings (CPU): the statistics equal what the weights themselves say."""

from __future__ import annotations

from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mindspore import dataset as ds
from mindspore import nn, ops
from mindspore.train import Callback, Model
from test_callback import GPT, gpt_dataset

import mindwatch
import mindwatch.mindspore
from mindwatch.demo.model import LanguageModelLoss, TinyGPT
from mindwatch.demo.train import set_mode
from mindwatch.demo.tutorial_step import jit_train_step
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


def train(
    tmp_path: Path,
    mode: str,
    optimizer: str = "sgd",
    every: int = 1,
    steps: int = 6,
    loss_scale: bool = False,
    histogram_every: int | None = None,
):
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
    layers = {"every": every, "histogram_every": histogram_every}
    monitor = MonitorCallback({"save_dir": str(tmp_path), "project": "p", "layers": layers, "interval": 60})
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


class Loop(nn.Cell):
    """Calls the train cell from inside a graph, as MindSpore's dataset-sink loop does: the flags pick the branch."""

    def __init__(self, step: nn.Cell) -> None:
        super().__init__()
        self.step = step

    def construct(self, ids, targets):
        return self.step(ids, targets)


def test_a_train_cell_compiled_inside_another_graph_measures_on_the_flagged_steps_only(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # a graph that fails to compile leaves rank_0/om/analyze_fail.ir in the working directory
    set_mode("graph")
    ms.set_seed(7)
    net = LanguageModelLoss(TinyGPT(GPT))
    cell = TrainOneStepWithGradNorm(net, nn.SGD(net.trainable_params(), learning_rate=LR), layer_stats=True)
    loop = Loop(cell)
    names = [p.name for p in cell.weights]  # (the loop cell may prefix them)
    ids, targets = next(gpt_dataset(1).create_tuple_iterator())
    for measure in (True, False, True):
        cell.measure_layers(measure)
        before = {p.name: p.asnumpy().astype(np.float64) for p in cell.weights}
        squares = loop(ids, targets)[cell.mindwatch_outputs.index("layer_stats")].asnumpy()
        after = {p.name: p.asnumpy().astype(np.float64) for p in cell.weights}
        grads = [((before[n] - after[n]) / LR) for n in names]  # plain SGD: w -= lr * g
        assert squares[0] == pytest.approx([float((g**2).sum()) for g in grads], rel=1e-3)  # every step
        if measure:
            assert squares[1] == pytest.approx([float((before[n] ** 2).sum()) for n in names], rel=1e-4)
            assert squares[2] == pytest.approx([float(((after[n] - before[n]) ** 2).sum()) for n in names], rel=1e-3)
        else:
            assert not squares[1:].any()  # the branch skipped: nothing measured


def test_the_second_graph_compiling_is_not_a_stall(tmp_path: Path) -> None:
    """The cell's graph without measurements compiles in the first step that does not measure (step 2)."""
    set_mode("graph")
    ms.set_seed(7)
    net = LanguageModelLoss(TinyGPT(GPT))
    cell = TrainOneStepWithGradNorm(net, nn.SGD(net.trainable_params(), learning_rate=LR), layer_stats=True)
    config = {"save_dir": str(tmp_path), "layers": {"every": 4}, "interval": 1, "alerts": {"stall_timeout": 1.0}}
    monitor = MonitorCallback(config)
    Model(cell).train(1, gpt_dataset(8), callbacks=[monitor], dataset_sink_mode=False)
    run = mindwatch.open_run(monitor.run_dir)
    series = run.series("step_time")
    step_time = dict(zip(series.step.tolist(), series.value.tolist(), strict=True))
    assert step_time[2] > 1.0 > step_time[5]  # step 2 compiled for longer than the stall timeout; then steps are quick
    assert [a["rule"] for a in run.alerts if a["rule"] in ("stall", "resumed")] == []
    assert run.series("grad_norm/head").step.tolist() == [1, 4, 8]


class MomentSnapshots(Callback):
    """The optimizer's moment Parameters at each step's end, by the name of the weight each belongs to."""

    def __init__(self, optimizer: nn.Optimizer) -> None:
        self.optimizer = optimizer
        self.after: dict[int, tuple[dict[str, np.ndarray], dict[str, np.ndarray]]] = {}

    def take(self, step: int) -> None:
        opt = self.optimizer
        weights = [w.name for w in opt.parameters]
        both = (opt.moment1, opt.moment2) if isinstance(opt, nn.Adam) else (opt.moments1, opt.moments2)
        self.after[step] = tuple(
            {n: m.asnumpy().astype(np.float64) for n, m in zip(weights, moments, strict=True)} for moments in both
        )

    def on_train_step_end(self, run_context) -> None:
        self.take(run_context.original_args().cur_step_num)


def assert_moments_recorded(run, snaps: MomentSnapshots, measured: list[int]) -> None:
    """The recorded adam_m_norm / adam_v_norm of every layer equal numpy's norms of the moment Parameters."""
    layers = sorted({layer_of(n) for n in snaps.after[1][0]})
    for k, stat in enumerate(("adam_m_norm", "adam_v_norm")):
        for layer in layers:
            series = run.series(f"{stat}/{layer}")
            assert series.step.tolist() == measured, (stat, layer)
            for step, value in zip(series.step.tolist(), series.value, strict=True):
                expected = np.sqrt(by_layer(snaps.after[step][k])[layer])
                assert value == pytest.approx(expected, rel=1e-4), (stat, layer, step)


@pytest.mark.slow  # 8-18 s a mode here
@pytest.mark.parametrize("mode", ["graph", "pynative"])
def test_adam_moments_per_layer_equal_the_optimizers_own_parameters(tmp_path: Path, mode: str) -> None:
    """AdamWeightDecay, layers.every 5: on the measured steps (1, 5, 10) the norms of each layer's first and second
    moments, after the step's update, as numpy computes them from the optimizer's Parameters; and the update ratio
    is what the optimizer did to the weights."""
    set_mode(mode)
    ms.set_seed(7)
    net = LanguageModelLoss(TinyGPT(GPT))
    opt = nn.AdamWeightDecay(net.trainable_params(), learning_rate=1e-2, weight_decay=0.01)
    cell = TrainOneStepWithGradNorm(net, opt, layer_stats=True)
    snaps, weights = MomentSnapshots(opt), WeightSnapshots(net)
    layers = {"every": 5, "histogram_every": None}
    monitor = MonitorCallback({"save_dir": str(tmp_path), "project": "p", "layers": layers, "interval": 60})
    Model(cell).train(1, gpt_dataset(10), callbacks=[snaps, weights, monitor], dataset_sink_mode=False)
    run = mindwatch.open_run(monitor.run_dir)
    assert_moments_recorded(run, snaps, [1, 5, 10])
    for layer in ("blocks.0.attn.qkv", "blocks.0.mlp.0", "head"):
        r = run.series(f"update_ratio/{layer}")
        for step, value in zip(r.step.tolist(), r.value, strict=True):
            before = {n: v for n, v in weights.before[step].items() if layer_of(n) == layer}
            delta = {n: weights.after[step][n] - v for n, v in before.items()}
            assert value == pytest.approx(np.sqrt(by_layer(delta)[layer] / by_layer(before)[layer]), rel=1e-3)


@pytest.mark.slow  # 15 s here
def test_adam_moments_per_layer_in_a_loop_of_its_own(tmp_path: Path) -> None:
    """The same with ``nn.Adam`` in a loop (``start_run`` with a ``layers`` section, a ``ms.jit`` step): read after
    the loop's update."""
    set_mode("pynative")
    ms.set_seed(7)
    net = LanguageModelLoss(TinyGPT(GPT))
    opt = nn.Adam(net.trainable_params(), learning_rate=1e-2)
    train_step = jit_train_step(net, opt)

    snaps = MomentSnapshots(opt)
    config = {"save_dir": str(tmp_path), "project": "p", "layers": {"every": 5, "histogram_every": None}, "interval": 60}
    with mindwatch.mindspore.start_run(config, network=net, optimizer=opt) as run:
        for step, (ids, targets) in enumerate(run.batches(gpt_dataset(10).create_tuple_iterator()), start=1):
            loss, grads = train_step(ids, targets)
            snaps.take(step)
            run.step(loss=loss, grads=grads)
    assert_moments_recorded(mindwatch.open_run(run.run_dir), snaps, [1, 5, 10])


def test_the_loss_scale_cell_measures_layers_too(tmp_path: Path) -> None:
    run, snaps = train(tmp_path, "graph", loss_scale=True, steps=4)
    g = run.series("grad_norm/head")
    assert g.step.tolist() == [1, 2, 3, 4]
    for i, step in enumerate(g.step.tolist()):
        grads = {n: (v - snaps.after[step][n]) / LR for n, v in snaps.before[step].items() if layer_of(n) == "head"}
        assert g.value[i] == pytest.approx(np.sqrt(by_layer(grads)["head"]), rel=1e-3)


class GradGate(nn.Cell):
    """The identity forward; backward, the gradient times ``gate`` (1 normally; the test sets 1e4 or NaN)."""

    def construct(self, x, gate):
        return x

    def bprop(self, x, gate, out, dout):
        return dout * gate, ops.zeros_like(gate)


class Planted(nn.Cell):
    """A small MLP whose middle layer the test makes vanish (its output times 0), explode or go NaN (its gradient)."""

    def __init__(self, vanish: bool = False) -> None:
        super().__init__()
        self.inp, self.mid, self.out = nn.Dense(8, 16), nn.Dense(16, 16), nn.Dense(16, 1)
        self.act = nn.ReLU()
        self.mid_output = 0.0 if vanish else 1.0
        self.grad_gate = GradGate()
        self.gate = ms.Parameter(ms.Tensor(1.0, ms.float32), name="gate", requires_grad=False)

    def construct(self, x):
        h = self.act(self.inp(x))
        m = ops.matmul(h, self.grad_gate(self.mid.weight, self.gate).T) + self.mid.bias
        return self.out(self.act(m) * self.mid_output + h * (1 - self.mid_output))


class AtStep(Callback):
    """Sets a parameter to a value for one step (the planted fault), then back."""

    def __init__(self, param: ms.Parameter, step: int, value: float) -> None:
        self.param, self.step, self.value = param, step, value
        self.normal = float(param.asnumpy())

    def on_train_step_begin(self, run_context) -> None:
        step = run_context.original_args().cur_step_num
        if step in (self.step, self.step + 1):
            self.param.set_data(ms.Tensor(self.value if step == self.step else self.normal, ms.float32))


def planted_run(tmp_path: Path, *, vanish: bool = False, fault: tuple[str, int, float] | None = None, steps: int = 30):
    set_mode("graph")
    ms.set_seed(3)
    net = Planted(vanish)
    loss = nn.WithLossCell(net, nn.MSELoss())
    cell = TrainOneStepWithGradNorm(loss, nn.SGD(net.trainable_params(), learning_rate=0.01), layer_stats=True)
    rng = np.random.default_rng(0)
    data = [(rng.standard_normal(8).astype(np.float32), rng.standard_normal(1).astype(np.float32)) for _ in range(steps * 4)]
    dataset = ds.GeneratorDataset(data, ["x", "y"], shuffle=False).batch(4)
    callbacks: list[Callback] = []
    if fault is not None:
        name, step, value = fault
        callbacks.append(AtStep(net.gate, step, value))
    config = {"save_dir": str(tmp_path), "project": "p", "layers": {"every": 1}, "interval": 60, "alerts": {"cooldown_secs": 0}}
    monitor = MonitorCallback(config)
    Model(cell).train(1, dataset, callbacks=[*callbacks, monitor], dataset_sink_mode=False)
    return mindwatch.open_run(monitor.run_dir)


def fired(run, rule: str) -> list[dict]:
    return [a for a in run.alerts if a["rule"] == rule]


def test_a_vanishing_layer_is_named(tmp_path: Path) -> None:
    run = planted_run(tmp_path, vanish=True)
    alerts = fired(run, "layer_vanishing")
    assert {a["layer"] for a in alerts} == {"mid"}
    assert alerts[0]["step"] == 3  # the default count: 3 measured steps in a row
    assert run.series("grad_norm/mid").value.max() == 0.0 and run.series("grad_norm/inp").value.min() > 0


def test_an_exploding_layer_is_named(tmp_path: Path) -> None:
    run = planted_run(tmp_path, fault=("gate", 20, 1e4))
    alerts = fired(run, "layer_spike")
    assert alerts and (alerts[0]["layer"], alerts[0]["step"]) == ("mid", 20)  # nothing before the fault, and it first
    assert "mid" in alerts[0]["message"] and alerts[0]["metric"] == "grad_norm/mid"
    g = run.series("grad_norm/mid")
    assert g.value[g.step.tolist().index(20)] > 1000 * np.median(g.value[:19])


class Starved(nn.Cell):
    """A small MLP whose middle layer (no bias) the test can starve: its input times ``feed``, 1 until the test sets 0.
    A starved layer's gradient is 0, so Adam's second moment of it falls by ``beta2`` each step; the rest learn on
    through the skip connection."""

    def __init__(self) -> None:
        super().__init__()
        self.inp, self.mid, self.out = nn.Dense(8, 16), nn.Dense(16, 16, has_bias=False), nn.Dense(16, 1)
        self.act = nn.ReLU()
        self.feed = ms.Parameter(ms.Tensor(1.0, ms.float32), name="feed", requires_grad=False)

    def construct(self, x):
        h = self.act(self.inp(x))
        return self.out(self.act(self.mid(h * self.feed)) + h)


class StarveFrom(Callback):
    """From ``step`` on, the middle layer's input is 0."""

    def __init__(self, net: Starved, step: int) -> None:
        self.net, self.step = net, step

    def on_train_step_begin(self, run_context) -> None:
        if run_context.original_args().cur_step_num == self.step:
            self.net.feed.set_data(ms.Tensor(0.0, ms.float32))


def collapses(values: list[float], warmup: int = 5, window: int = 20, factor: float = 10.0) -> int | None:
    """The index of the first value below the median of the (up to ``window``) values before it / ``factor``, once
    ``warmup`` are in: layer_collapse's documented defaults, in numpy."""
    return next((i for i in range(warmup, len(values)) if values[i] < np.median(values[max(0, i - window) : i]) / factor), None)


@pytest.mark.parametrize("starve_from", [17, None])
def test_a_layer_whose_adam_v_collapses_is_named_and_the_same_training_without_it_raises_nothing(
    tmp_path: Path, starve_from: int | None
) -> None:
    """AdamWeightDecay with beta2 0.5, layers.every 2: from step 17 the middle layer's input is 0, its gradient too,
    and its second moment halves each step. layer_collapse names it, on the measured step numpy's norms of the
    optimizer's own moment Parameters say, with their value and median; unstarved, the same training raises none."""
    set_mode("graph")
    ms.set_seed(3)
    net = Starved()
    opt = nn.AdamWeightDecay(net.trainable_params(), learning_rate=1e-2, beta2=0.5)
    cell = TrainOneStepWithGradNorm(nn.WithLossCell(net, nn.MSELoss()), opt, layer_stats=True)
    rng = np.random.default_rng(0)
    data = [(rng.standard_normal(8).astype(np.float32), rng.standard_normal(1).astype(np.float32)) for _ in range(30 * 4)]
    snaps = MomentSnapshots(opt)
    callbacks: list[Callback] = [snaps] if starve_from is None else [snaps, StarveFrom(net, starve_from)]
    layers = {"every": 2, "histogram_every": None}
    monitor = MonitorCallback({"save_dir": str(tmp_path), "project": "p", "layers": layers, "interval": 60})
    dataset = ds.GeneratorDataset(data, ["x", "y"], shuffle=False).batch(4)
    Model(cell).train(1, dataset, callbacks=[*callbacks, monitor], dataset_sink_mode=False)
    run = mindwatch.open_run(monitor.run_dir)

    measured = run.series("adam_v_norm/mid").step.tolist()
    assert measured == [1, *range(2, 31, 2)]
    reference = {}  # each layer's v norm on the measured steps, from the optimizer's own Parameters
    for layer in ("inp", "mid", "out"):
        reference[layer] = [float(np.sqrt(by_layer(snaps.after[step][1])[layer])) for step in measured]
        assert run.series(f"adam_v_norm/{layer}").value == pytest.approx(reference[layer], rel=1e-4), layer
    # the rule judges v once it settled, from step round(1 / (1 - beta2)) = 2 on: step 1's value is no baseline
    settled = [k for k, step in enumerate(measured) if step >= round(1 / (1 - 0.5))]
    measured = [measured[k] for k in settled]
    reference = {layer: [v[k] for k in settled] for layer, v in reference.items()}
    expected = {layer: measured[i] for layer, v in reference.items() if (i := collapses(v)) is not None}
    alerts = fired(run, "layer_collapse")
    assert {a["layer"]: a["step"] for a in alerts} == expected
    if starve_from is None:
        assert alerts == []
        return
    (alert,) = alerts
    assert starve_from < alert["step"] <= starve_from + 4  # halving each step: below a tenth in a few measured steps
    i, v = measured.index(alert["step"]), reference["mid"]
    assert (alert["metric"], alert["value"], alert["threshold"]) == (
        "adam_v_norm/mid",
        pytest.approx(v[i], rel=1e-4),
        pytest.approx(np.median(v[max(0, i - 20) : i]) / 10, rel=1e-4),
    )
    assert alert["message"].startswith("layer mid: its adam_v norm collapsed to ")
    g = run.series("grad_norm/mid")
    assert g.value[g.step >= starve_from].max() == 0.0 < g.value[g.step < starve_from].min()  # the cause, as planted


def test_a_nan_in_one_layer_is_named_first(tmp_path: Path) -> None:
    run = planted_run(tmp_path, fault=("gate", 12, float("nan")), steps=14)
    nonfinite = fired(run, "nonfinite")
    assert nonfinite and nonfinite[0]["step"] == 12 and nonfinite[0]["layer"] == "mid"
    assert "mid" in nonfinite[0]["message"]


@pytest.mark.slow  # a training of 10 s or more: `-m "not slow"` stays a quick loop
def test_the_report_compares_the_layers_and_maps_them(tmp_path: Path) -> None:
    import json
    import re

    from conftest import CHROMIUM, CHROMIUM_ARGS
    from playwright.sync_api import sync_playwright
    from test_report import CHARTS_SHOWN, open_page

    from mindwatch.cli import main

    run, _ = train(tmp_path, "graph", every=2, histogram_every=3)
    out = tmp_path / "report.html"
    assert main(["report", str(run.path), "-o", str(out)]) == 0
    html = out.read_text()
    data = json.loads(re.search(r'<script id="mindwatch-data" type="application/json">(.*?)</script>', html, re.S).group(1))
    # the layer files read with numpy alone, as another tool would (docs/run-directory.md)
    head = json.loads((run.path / "layers.rank0" / "layers.json").read_text())
    rows = np.fromfile(run.path / "layers.rank0" / "values.f32", "<f4").reshape(-1, len(head["stats"]) * len(head["layers"]))
    n = len(head["layers"])
    assert data["layers"]["layers"] == head["layers"]
    assert data["layers"]["last"]["grad_norm"] == pytest.approx(rows[-1, :n].tolist(), rel=1e-6)
    assert data["layers"]["last"]["weight_norm"] == pytest.approx(rows[-1, n : 2 * n].tolist(), rel=1e-6)
    assert data["layers"]["histogram_weights"]["step"] == 6 and data["layers"]["histogram_grads"]["layers"] == head["layers"]
    assert not any(m["name"].startswith("grad_norm/") for m in data["metrics"])  # no chart per layer metric
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page, problems, requests = open_page(browser, out)
        state = page.evaluate(CHARTS_SHOWN)
        assert state["errors"] == [] and problems == [] and requests == []
        for chart in ("chart-layer-norms", "chart-layers-grad_norm", "chart-layers-update_ratio", "chart-histogram-weights"):
            assert page.evaluate(f"() => !!echarts.getInstanceByDom(document.getElementById('{chart}'))"), chart
        for chart in ("chart-histogram-weights", "chart-histogram-grads"):  # their columns are values, not steps
            x_name = f"() => echarts.getInstanceByDom(document.getElementById('{chart}')).getOption().xAxis[0].name"
            assert page.evaluate(x_name) == "value / max |value|", chart
        browser.close()


@pytest.mark.slow
def test_both_ranks_of_a_data_parallel_job_record_the_same_reduced_layer_norms(tmp_path: Path) -> None:
    from test_distributed import Launch, msrun, only_run_dir

    launch = Launch()
    try:
        config = '{"layers": {"every": 2}}'
        msrun(
            launch, tmp_path / "logs", "--save-dir", str(tmp_path / "out"), "--steps", "12", "--layer-stats", "--config", config
        )
        assert launch.wait(300) == [0], (tmp_path / "logs" / "msrun.out").read_text()[-3000:]
    finally:
        launch.kill()
    run = mindwatch.open_run(only_run_dir(tmp_path / "out" / "dist"))
    layers = [m for m in run.metrics if m.startswith("grad_norm/")]
    assert layers == ["grad_norm/0", "grad_norm/2"]  # the two Dense layers of the SequentialCell
    for metric in [m for m in run.metrics if m.split("/")[0] in ("grad_norm", "weight_norm", "update_ratio") and "/" in m]:
        r0, r1 = run.series(metric, rank=0), run.series(metric, rank=1)
        assert r0.step.tolist() == r1.step.tolist() == [1, 2, 4, 6, 8, 10, 12]  # the first step, then every 2
        assert r0.value == pytest.approx(r1.value, rel=1e-5)  # after the AllReduce: the same on every rank
    # each rank's own loss differs (different data), so equal norms are not a copy of one rank's numbers
    assert run.series("loss", rank=0).value.tolist() != run.series("loss", rank=1).value.tolist()


def test_layer_histograms_count_the_weights_and_gradients_and_tensorboard_reads_them(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from mindwatch.sinks.tensorboard import export_tensorboard
    from mindwatch.store.layerfiles import LayerHistograms

    set_mode("graph")
    ms.set_seed(7)
    net = LanguageModelLoss(TinyGPT(GPT))
    cell = TrainOneStepWithGradNorm(net, nn.SGD(net.trainable_params(), learning_rate=LR), layer_stats=True)
    snaps = WeightSnapshots(net)
    config = {"save_dir": str(tmp_path), "project": "p", "layers": {"every": 1, "histogram_every": 3}, "interval": 60}
    monitor = MonitorCallback(config)
    Model(cell).train(1, gpt_dataset(6), callbacks=[snaps, monitor], dataset_sink_mode=False)
    run = mindwatch.open_run(monitor.run_dir)
    steps, hist = run.layer_histograms()
    assert steps.tolist() == [3, 6] and hist is not None and hist.bins == 32
    j = hist.layers.index("blocks.0.mlp.0")
    for row, step in enumerate(steps.tolist()):
        one = LayerHistograms(hist.layers, hist.data[row])
        before = {n: v for n, v in snaps.before[step].items() if layer_of(n) == "blocks.0.mlp.0"}
        grads = {n: (v - snaps.after[step][n]) / LR for n, v in before.items()}  # plain SGD
        for kind, values in ((0, before), (1, grads)):
            x = np.concatenate([v.ravel() for v in values.values()])
            edges, counts = one.histogram(kind, j)
            assert edges[-1] == pytest.approx(np.abs(x).max(), rel=1e-3)
            reference, _ = np.histogram(x / np.abs(x).max(), bins=32, range=(-1, 1))
            assert np.abs(counts - reference).sum() <= 2 and counts.sum() == x.size  # a value on a bin edge may round over
    logdir = export_tensorboard(run.path)
    events = EventAccumulator(str(logdir / "rank0"), size_guidance={"histograms": 0})
    events.Reload()
    assert "weights/blocks.0.mlp.0" in events.Tags()["histograms"]
    read = events.Histograms("weights/blocks.0.mlp.0")
    assert [e.step for e in read] == [3, 6]
    assert read[-1].histogram_value.num == pytest.approx(float(hist.data[-1, 0, j, :-1].sum()))
    assert list(read[-1].histogram_value.bucket) == pytest.approx(hist.data[-1, 0, j, :-1].tolist())


def test_attention_entropy_and_max_logit_come_through_the_graph(tmp_path: Path) -> None:
    """GRAPH mode: the demo model's AttentionStats; the reference is the same first forward, hooked in PyNative."""
    config = {"save_dir": str(tmp_path), "project": "p", "attention_entropy": {"every": 2}, "interval": 60}
    set_mode("graph")
    ms.set_seed(11)
    net = LanguageModelLoss(TinyGPT(GPT))
    cell = TrainOneStepWithGradNorm(net, nn.SGD(net.trainable_params(), learning_rate=0.0))  # weights stay as at step 1
    assert cell.mindwatch_attention_layers == ("blocks.0.attn",)  # the attention cell, without the loss wrapper
    monitor = MonitorCallback(config)
    Model(cell).train(1, gpt_dataset(4), callbacks=[monitor], dataset_sink_mode=False)
    run = mindwatch.open_run(monitor.run_dir)
    layer = cell.mindwatch_attention_layers[0]
    entropy, top = run.series(f"attention_entropy/{layer}"), run.series(f"attention_max_logit/{layer}")
    assert entropy.step.tolist() == top.step.tolist() == [2, 4]  # every 2 steps

    set_mode("pynative")  # the reference: the same weights on step 2's batch, the softmax's input and output hooked
    ms.set_seed(11)
    ref_net = LanguageModelLoss(TinyGPT(GPT))
    seen: dict[str, np.ndarray] = {}
    softmax = ref_net.network.blocks[0].attn.softmax

    def hook(cell, inputs, output):
        seen["scores"], seen["probs"] = inputs[0].asnumpy(), output.asnumpy()

    handle = softmax.register_forward_hook(hook)
    batches = list(gpt_dataset(4).create_tuple_iterator())
    ref_net(*batches[1])
    handle.remove()
    p = seen["probs"].astype(np.float64)
    ref_entropy = float((-(p * np.log(np.clip(p, 1e-12, None))).sum(-1)).mean())
    assert entropy.value[0] == pytest.approx(ref_entropy, rel=1e-4)
    assert top.value[0] == pytest.approx(float(seen["scores"].max()), rel=1e-4)


def test_the_moments_settle_after_one_over_one_minus_beta2_steps() -> None:
    """Read from the optimizers themselves: MindSpore's Adam (beta2 0.999) settles in 1000 steps, an AdamWeightDecay at
    beta2 0.95 in 20; an optimizer without a beta2, the default."""
    from mindwatch.mindspore.layer_stats import DEFAULT_SETTLE_STEPS, moments_settle_steps

    params = nn.Dense(2, 2).trainable_params()
    assert moments_settle_steps(nn.Adam(params)) == 1000
    assert moments_settle_steps(nn.AdamWeightDecay(params, beta2=0.95)) == 20
    assert moments_settle_steps(nn.SGD(params)) == DEFAULT_SETTLE_STEPS
