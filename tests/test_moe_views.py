"""The MoE routing as a person reads it: one small real training (two top-2-of-4 MoE layers, measured every 5 steps), its
expert load and imbalance on the run page and in the report (both in Chromium), on the Prometheus endpoint and in
``mindwatch check``. Every drawn or served value is held to the run's own recorded series."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import httpx
import pytest
from conftest import CHROMIUM, wait_for
from prometheus_client.parser import text_string_to_metric_families
from test_report import open_page, report_data

import mindwatch
from mindwatch.analysis.heatmap import layer_order
from mindwatch.checks.evaluate import evaluate
from mindwatch.report.html import write_report
from mindwatch.sinks.prometheus import PrometheusSink
from mindwatch.store.reader import Run

if TYPE_CHECKING:
    from playwright.sync_api import Page

STEPS, EVERY, LAYERS = 30, 5, ("moe0", "moe1")
pytestmark = pytest.mark.slow  # a training shared by the module (~4 s), a dashboard and Chromium
needs_chromium = pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason=f"{CHROMIUM} is not installed")


@pytest.fixture(scope="module")
def moe_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """Two top-2-of-4 MoE layers with 3-D expert weights (tests/moe_model.py), 30 steps in GRAPH mode (~3 s)."""
    import mindspore as ms
    import mindspore.dataset as ds
    from mindspore import nn
    from mindspore.train import Model
    from moe_model import MoENet, batches

    from mindwatch.mindspore import MonitorCallback, TrainOneStepWithGradNorm

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    net = MoENet(tokens=32, k=2)
    step = TrainOneStepWithGradNorm(nn.WithLossCell(net, nn.MSELoss()), nn.Adam(net.trainable_params(), learning_rate=1e-3))
    data = ds.GeneratorDataset(batches(STEPS, 32), ["x", "y"], shuffle=False)
    config = {
        "save_dir": str(tmp_path_factory.mktemp("moe")),
        "project": "p",
        "interval": 60,
        "moe": {"every": EVERY},
        "layers": {"stable_rank_every": 10},
    }
    monitor = MonitorCallback(config)
    Model(step).train(1, data, callbacks=[monitor], dataset_sink_mode=False)
    run = mindwatch.open_run(monitor.run_dir)
    assert run.series(f"moe_imbalance/{LAYERS[0]}").step.tolist() == list(range(EVERY, STEPS + 1, EVERY))
    return run


def measured(run: Run) -> list[int]:
    return run.series(f"moe_imbalance/{LAYERS[0]}").step.tolist()


def load_at(run: Run, step: int) -> dict[tuple[str, str], float]:
    """``(layer, expert) -> share`` recorded at ``step``."""
    out = {}
    for name in run.metrics:
        if name.startswith("expert_load/"):
            layer, _, expert = name.removeprefix("expert_load/").rpartition("/")
            s = run.series(name)
            out[(layer, expert)] = float(s.value[s.step.tolist().index(step)])
    return out


# -- the run page -----------------------------------------------------------------------------------------------------
HEAT = """(id) => {
  const el = document.getElementById(id);
  const c = el && echarts.getInstanceByDom(el);
  if (!c) return null;
  const o = c.getOption();
  return {columns: o.xAxis[0].data, rows: o.yAxis[0].data, values: o.series[0].data, title: o.title[0].text};
}"""


def drawn(page: Page, chart_id: str) -> dict[str, Any]:
    """The heat map ``#chart_id`` as drawn: its columns, rows, values and title (once ECharts has it)."""
    return wait_for(lambda: page.evaluate(HEAT, chart_id), 60, f"#{chart_id}")


def cells(heat: dict[str, Any]) -> dict[tuple[str, str], float]:
    """A drawn heat map's values by (row, column) name."""
    return {(heat["rows"][int(r)], str(heat["columns"][int(c)])): v for c, r, v in heat["values"]}


@needs_chromium
def test_the_run_page_draws_each_experts_load_at_the_sliders_step_and_each_moe_layers_imbalance(moe_run: Run, browser) -> None:
    from mindwatch.serve.process import DashboardProcess

    steps = measured(moe_run)
    with DashboardProcess(moe_run.path.parent.parent, port=0) as dash:
        page = browser.new_page(viewport={"width": 1300, "height": 1000})
        page.goto(f"{dash.url}#/run/{quote(f'{moe_run.path.parent.name}/{moe_run.path.name}', safe='')}")
        experts = drawn(page, "chart-expert-load")
        # the newest measured step first: experts (x) x MoE layers (y), the recorded shares
        assert experts["title"] == f"expert load (share of routed tokens) at step {steps[-1]}"
        assert experts["rows"] == list(LAYERS) and experts["columns"] == ["0", "1", "2", "3"]
        assert cells(experts) == pytest.approx(load_at(moe_run, steps[-1]), abs=1e-6)
        # the slider, from the keyboard: its first step, then the next
        slider = page.locator("#chart-expert-load-step")
        slider.focus()
        page.keyboard.press("Home")
        page.keyboard.press("ArrowRight")
        assert slider.get_attribute("aria-valuetext") == f"step {steps[1]}"
        moved = page.evaluate(HEAT, "chart-expert-load")
        assert moved["title"].endswith(f"at step {steps[1]}")
        assert cells(moved) == pytest.approx(load_at(moe_run, steps[1]), abs=1e-6)
        assert cells(moved) != pytest.approx(cells(experts), abs=1e-6), "another step, other shares"

        # each MoE layer's imbalance over the steps, layers x steps, as recorded; the router's entropy beside it
        imbalance = drawn(page, "chart-moe-imbalance")
        assert imbalance["title"] == "MoE imbalance (largest share x experts) per MoE layer"
        assert [int(s) for s in imbalance["columns"]] == steps
        for metric in imbalance["rows"]:
            recorded = dict(zip(map(str, steps), moe_run.series(metric).value.tolist(), strict=True))
            assert {col: v for (row, col), v in cells(imbalance).items() if row == metric} == pytest.approx(recorded, abs=1e-6)
        assert sorted(imbalance["rows"]) == [f"moe_imbalance/{layer}" for layer in LAYERS]
        assert drawn(page, "chart-router-entropy")["title"] == "router entropy (nats) per MoE layer"
        # the stable rank of each expert's matrices, grouped by layer; no card of its own for any member
        weights = drawn(page, "chart-stable-rank")["rows"]
        assert "stable_rank/moe0.experts/3" in weights and weights == sorted(weights, key=layer_order)
        ids = page.evaluate("() => [...document.querySelectorAll('.chart')].map((el) => el.id)")
        assert not [i for i in ids if "/" in i], ids


# -- the report -------------------------------------------------------------------------------------------------------
@needs_chromium
def test_the_report_holds_the_expert_load_and_the_imbalance_per_moe_layer(moe_run: Run, browser, tmp_path: Path) -> None:
    (out,) = write_report([moe_run], tmp_path / "report.html")
    data = report_data(out.read_text())
    steps = measured(moe_run)
    experts = data["experts"]
    assert experts["steps"] == steps
    assert experts["layers"] == [f"{layer}/{e}" for layer in LAYERS for e in range(4)]
    for row, name in enumerate(experts["layers"]):
        embedded = [v for _, r, v in sorted(experts["values"]) if r == row]
        assert embedded == pytest.approx(moe_run.series(f"expert_load/{name}").value.tolist(), abs=1e-6), name
    maps = {m["id"]: m for m in data["moe"]}
    assert sorted(maps) == ["chart-moe-imbalance", "chart-router-entropy"]  # no capacity factor: nothing dropped
    imbalance = maps["chart-moe-imbalance"]
    assert imbalance["layers"] == list(LAYERS) and imbalance["steps"] == steps
    for row, layer in enumerate(LAYERS):
        embedded = [v for _, r, v in sorted(imbalance["values"]) if r == row]
        assert embedded == pytest.approx(moe_run.series(f"moe_imbalance/{layer}").value.tolist(), abs=1e-6), layer
    curves = [m["name"] for m in data["metrics"]]
    assert not [c for c in curves if c.startswith(("expert_load/", "moe_imbalance/", "router_entropy/", "stable_rank/"))]

    # drawn: the newest step's shares, and another step's from the slider
    page, problems, requests = open_page(browser, out)
    newest = drawn(page, "chart-expert-load")
    assert newest["title"] == f"expert load (share of routed tokens) at step {steps[-1]}"
    assert cells(newest) == pytest.approx(load_at(moe_run, steps[-1]), abs=1e-6)
    page.focus("#chart-expert-load-step")
    page.keyboard.press("Home")
    assert cells(page.evaluate(HEAT, "chart-expert-load")) == pytest.approx(load_at(moe_run, steps[0]), abs=1e-6)
    assert drawn(page, "chart-moe-imbalance")["rows"] == list(LAYERS)
    assert problems == [] and requests == []


# -- Prometheus -------------------------------------------------------------------------------------------------------
def scrape(url: str) -> list[Any]:
    return [s for f in text_string_to_metric_families(httpx.get(url, timeout=5).text) for s in f.samples]


def test_prometheus_serves_the_worst_moe_layers_newest_imbalance_and_no_series_per_expert(moe_run: Run) -> None:
    """The run's records handed to the sink in batches, each ending at a measured step, as the monitor hands them."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sink = PrometheusSink(project="p", run=moe_run.id, rank=0, port=port)
    labels = {"project": "p", "run": moe_run.id, "rank": "0"}
    records = [json.loads(line) for line in moe_run.layout.metrics(0).read_text().splitlines()]
    try:
        assert sink.url is not None
        for i, step in enumerate(measured(moe_run)):
            sink.write([r for r in records if step - EVERY < r["step"] <= step])
            routing = [
                s for s in scrape(sink.url) if s.name.startswith(("mindwatch_expert", "mindwatch_moe", "mindwatch_router"))
            ]
            # one series: no expert's load, no MoE layer's own, no router entropy (with a capacity factor, the worst
            # layer's dropped share too)
            assert [(s.name, s.labels) for s in routing] == [("mindwatch_moe_imbalance_max", labels)]
            worst = max(float(moe_run.series(f"moe_imbalance/{layer}").value[i]) for layer in LAYERS)
            assert routing[0].value == pytest.approx(worst, abs=1e-9), step
    finally:
        sink.close("finished")


# -- mindwatch check --------------------------------------------------------------------------------------------------
def test_check_reads_a_moe_layers_imbalance_and_an_experts_load_by_name(moe_run: Run) -> None:
    worst = float(moe_run.series(f"moe_imbalance/{LAYERS[0]}").value.max())
    result = evaluate(moe_run, f"max(moe_imbalance/{LAYERS[0]}) < {worst + 0.01}")
    assert result.passed and result.values == {f"max(moe_imbalance/{LAYERS[0]})": pytest.approx(worst)}
    assert not evaluate(moe_run, f"max(moe_imbalance/{LAYERS[0]}) < {worst}").passed
    last = float(moe_run.series(f"expert_load/{LAYERS[1]}/3").value[-1])
    result = evaluate(moe_run, f"final(expert_load/{LAYERS[1]}/3) >= 0")
    assert result.passed and result.values == {f"final(expert_load/{LAYERS[1]}/3)": pytest.approx(last)}
