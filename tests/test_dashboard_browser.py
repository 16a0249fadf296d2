"""End to end in headless Chromium: a real MindSpore training runs, the open run page gains points without reload."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

import conftest
import pytest
from conftest import CHROMIUM

from mindwatch.serve.process import DashboardProcess

if TYPE_CHECKING:
    from playwright.sync_api import Browser


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason="Debian's chromium is not installed (scripts/setup.sh)"),
]

# A small GRAPH-mode training (PyNative is several times slower on a busy 2-core machine), paced to at most
# 20 steps/s so that the page is open while it runs even on a fast machine.
TRAINING = """
import os, sys, time
from mindspore.train import Callback
from mindwatch.demo.train import DemoSettings, build_training
from mindwatch.mindspore import MonitorCallback

class Pace(Callback):  # 50 ms a step; 10 steps from the end, it waits (2 min at most) for the test's release file
    def on_train_step_end(self, run_context):
        time.sleep(0.05)
        if run_context.original_args().cur_step_num == int(sys.argv[2]) - 10:
            deadline = time.monotonic() + 120
            while not os.path.exists(sys.argv[3]) and time.monotonic() < deadline:
                time.sleep(0.05)

settings = DemoSettings(steps=int(sys.argv[2]), layers=2, d_model=32, heads=2, batch_size=8, seq_length=32, mode="graph")
model, dataset = build_training(settings)
monitor = MonitorCallback({"project": "e2e", "save_dir": sys.argv[1], "interval": 60, "flush_secs": 0.5,
    "metrics": ["loss", "lr", "grad_norm", "step_time", "data_time", "throughput", "memory_usage"],
    "tags": {"test": "browser"}})
model.train(1, dataset, callbacks=[monitor, Pace()], dataset_sink_mode=False)
"""

CHART_POINTS = """() => {
  const el = document.querySelector('#chart-loss');
  if (!el) return -1;
  const c = echarts.getInstanceByDom(el);
  const s = c && c.getOption().series.find((x) => x.name === 'loss');
  return s ? s.data.filter((p) => p[1] !== '-').length : -1;
}"""


def wait_for(predicate, timeout: float, what: str, interval: float = 0.2):  # noqa: ANN001, ANN201
    """conftest's wait_for for a page: an evaluate that meets a chart mid-redraw (a reload, a lazy update) is "not yet"."""
    from playwright.sync_api import Error as PageError

    return conftest.wait_for(predicate, timeout, what, interval, transient=(PageError,))


#: Counts, from the test side, the points the live stream pushes ("points" events) into window.__pushedPoints.
COUNT_PUSHED_POINTS = """
window.__pushedPoints = 0;
const Plain = window.EventSource;
window.EventSource = class extends Plain {
  constructor(...args) {
    super(...args);
    this.addEventListener("points", (e) => {
      for (const pts of Object.values(JSON.parse(e.data).metrics)) window.__pushedPoints += pts.length;
    });
  }
};
"""


def api(url: str) -> dict:  # type: ignore[type-arg]
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def test_run_page_gains_points_while_mindspore_trains(tmp_path: Path, artifacts_dir: Path, browser: Browser) -> None:
    save_dir = tmp_path / "monitor_output"
    script = tmp_path / "train.py"
    script.write_text(TRAINING)
    with DashboardProcess(save_dir, port=0) as dash:
        log = open(tmp_path / "training.log", "wb")  # noqa: SIM115 (closed with the process)
        release = tmp_path / "release"
        training = subprocess.Popen(
            [sys.executable, str(script), str(save_dir), "100", str(release)], stdout=log, stderr=subprocess.STDOUT
        )
        try:
            # the training's start (imports, the graph compiled) is not what this test times: a machine at load 12 took
            # over 120 s to reach step 3
            runs = wait_for(lambda: [r for r in api(dash.url + "api/runs")["runs"] if (r["last_step"] or 0) >= 3], 400, "the run")
            run_id = runs[0]["id"]
            page = browser.new_page(viewport={"width": 1500, "height": 1150})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.add_init_script(COUNT_PUSHED_POINTS)  # the test counts the points the stream pushes
            # The runs page lists the run, live.
            page.goto(dash.url)
            page.wait_for_selector(f'tr[data-run="{run_id}"] .state-running', timeout=20_000)

            page.goto(f"{dash.url}#/run/{quote(run_id, safe='')}")
            page.evaluate("() => { window.__notReloaded = true; }")
            first = wait_for(lambda: max(page.evaluate(CHART_POINTS), 0), 30, "the first loss points")
            wait_for(lambda: page.evaluate(CHART_POINTS) >= first + 20, 60, "pushed points on the open page")
            assert page.evaluate("() => window.__notReloaded === true")  # the same page, no reload
            assert page.evaluate("() => window.__pushedPoints") >= 20
            assert training.poll() is None, "the training should still be running while points arrive"
            page.screenshot(path=str(artifacts_dir / "dashboard_run_live.png"), full_page=True)

            release.touch()
            training.wait(timeout=300)
            assert training.returncode == 0, (tmp_path / "training.log").read_text()[-2000:]
            page.wait_for_selector("#banner.banner-finished", timeout=20_000)
            final = api(f"{dash.url}api/run?run={quote(run_id)}")["status"]["last_step"]
            wait_for(lambda: page.evaluate(CHART_POINTS) == final, 20, f"all {final} loss points on the page")
            assert page.query_selector("#chart-grad_norm") is not None and page.query_selector("#chart-throughput") is not None
            page.screenshot(path=str(artifacts_dir / "dashboard_run_finished.png"), full_page=True)
            assert not errors, errors
        finally:
            release.touch()
            if training.poll() is None:
                training.kill()
                training.wait()
            log.close()


WINDOW_POINTS = """([lo, hi]) => {
  const c = echarts.getInstanceByDom(document.querySelector('#chart-loss'));
  const s = c && c.getOption().series.find((x) => x.name === 'loss');
  return s ? s.data.filter((p) => p[0] >= lo && p[0] <= hi).length : -1;
}"""


def test_zoom_fetches_every_point_of_the_window(tmp_path: Path, artifacts_dir: Path, browser: Browser) -> None:
    from mindwatch.store.writer import RunWriter

    steps, lo, hi = 100_000, 61_000, 61_299
    writer = RunWriter(tmp_path / "logs" / "p" / "long", 0)
    loss = [2.0 + (s % 7) / 100 + (5.0 if s == 61_234 else 0.0) for s in range(1, steps + 1)]
    writer.write([{"step": s, "t": 1e9 + s, "loss": v} for s, v in enumerate(loss, start=1)])
    writer.close("finished")
    with DashboardProcess(tmp_path / "logs", port=0) as dash:
        page = browser.new_page(viewport={"width": 1300, "height": 800})
        page.goto(f"{dash.url}#/run/p%2Flong")
        wait_for(lambda: page.evaluate(CHART_POINTS) > 0, 60, "the loss chart")
        overview = page.evaluate(WINDOW_POINTS, [lo, hi])
        assert 0 < page.evaluate(CHART_POINTS) <= 2000 and overview < 50  # thinned: a few points of the window
        page.evaluate(
            f"""() => echarts.getInstanceByDom(document.querySelector('#chart-loss'))
                .dispatchAction({{type: 'dataZoom', startValue: {lo}, endValue: {hi}}})"""
        )
        wait_for(lambda: page.evaluate(WINDOW_POINTS, [lo, hi]) == hi - lo + 1, 60, "the window's detail")
        page.screenshot(path=str(artifacts_dir / "dashboard_zoom.png"))


HEAT_LAST_STEP = """() => {
  const el = document.querySelector('#chart-attention-entropy');
  const c = el && echarts.getInstanceByDom(el);
  const steps = c ? c.getOption().xAxis[0].data : [];
  return steps.length ? steps[steps.length - 1] : -1;
}"""

BAND_LAST_STEP = """() => {
  const c = echarts.getInstanceByDom(document.querySelector('#chart-loss'));
  const s = c && c.getOption().series.find((x) => x.name.endsWith(' range'));
  return s && s.data.length ? s.data[s.data.length - 1][0] : -1;
}"""


def test_heat_map_and_rank_band_follow_the_pushed_points(tmp_path: Path, artifacts_dir: Path, browser: Browser) -> None:
    from mindwatch.store.writer import RunWriter

    writers = [RunWriter(tmp_path / "logs" / "p" / "two_ranks", rank, flush_secs=0.2) for rank in (0, 1)]

    def write(first: int, last: int) -> None:
        for w in writers:
            records = []
            for s in range(first, last + 1):
                rec = {"step": s, "t": time.time(), "loss": 2.0 - s / 100 + w.rank / 10}
                records.append(rec | {f"attention_entropy/{k}": 1.0 + k / 10 + s / 1000 for k in range(4)})
            w.write(records)
            w.flush()

    write(1, 20)
    with DashboardProcess(tmp_path / "logs", port=0) as dash:
        page = browser.new_page(viewport={"width": 1300, "height": 1000})
        heat_requests: list[str] = []  # the page's heat-map fetches: a live refresh fetches it again
        page.on("request", lambda r: heat_requests.append(r.url) if "/api/heatmap" in r.url else None)
        page.goto(f"{dash.url}#/run/p%2Ftwo_ranks")
        wait_for(lambda: page.evaluate(HEAT_LAST_STEP) >= 19, 60, "the heat map of 4 layers")
        page.select_option("#rank", "all")
        wait_for(lambda: page.evaluate(BAND_LAST_STEP) >= 20, 60, "the min..max band across the 2 ranks")
        page.evaluate("() => { window.__notReloaded = true; }")
        fetched_before = len(heat_requests)
        write(21, 60)
        wait_for(lambda: page.evaluate(HEAT_LAST_STEP) >= 58, 20, "the heat map re-binned with the pushed steps")
        wait_for(lambda: page.evaluate(BAND_LAST_STEP) >= 60, 20, "the band extended to the pushed steps")
        assert page.evaluate("() => window.__notReloaded === true") and len(heat_requests) > fetched_before
        page.screenshot(path=str(artifacts_dir / "dashboard_heatmap_band_live.png"), full_page=True)
    for w in writers:
        w.close("finished")


RESTART_LINES = """() => {
  const c = echarts.getInstanceByDom(document.querySelector('#chart-loss'));
  if (!c) return [];
  return c.getOption().series.flatMap((s) => ((s.markLine && s.markLine.data) || []))
    .filter((d) => String(d.name).startsWith('restart')).map((d) => [d.xAxis, d.name]);
}"""


def test_each_restart_is_marked_on_the_charts(tmp_path: Path, browser: Browser) -> None:
    from mindwatch.store.layout import write_json_atomic
    from mindwatch.store.writer import RunWriter

    run_dir = tmp_path / "logs" / "p" / "restarted"
    writer = RunWriter(run_dir, 0)
    writer.write([{"step": s, "t": 1e9 + s, "loss": 2.0 - s / 100} for s in range(1, 61)])
    writer.close("finished")
    attempts = [
        {"attempt": 1, "started_at": 1e9, "first_step": 1, "end": "killed"},
        {"attempt": 2, "started_at": 1e9 + 25, "first_step": 21, "end": "failed"},
        {"attempt": 3, "started_at": 1e9 + 50, "first_step": 41, "end": "finished"},
    ]
    write_json_atomic(run_dir / "meta.json", {"run_id": "restarted", "project": "p", "attempts": attempts})
    with DashboardProcess(tmp_path / "logs", port=0) as dash:
        page = browser.new_page(viewport={"width": 1300, "height": 800})
        page.goto(f"{dash.url}#/run/p%2Frestarted")
        wait_for(lambda: page.evaluate(CHART_POINTS) > 0, 60, "the loss chart")
        assert page.evaluate(RESTART_LINES) == [[21, "restart: attempt 2"], [41, "restart: attempt 3"]]


LAYER_ROWS = """() => {
  const el = document.querySelector('#chart-layers');
  const c = el && echarts.getInstanceByDom(el);
  return c ? c.getOption().yAxis[0].data : [];
}"""

LAYER_CURVE = """() => {
  const el = document.querySelector('#chart-layer');
  const c = el && !el.hidden && echarts.getInstanceByDom(el);
  if (!c) return null;
  const o = c.getOption();
  return {title: o.title[0].text, points: o.series.filter((s) => s.type === "line").map((s) => s.data.length)};
}"""


LAYER_HEAT = """() => {
  const c = echarts.getInstanceByDom(document.querySelector('#chart-layers'));
  const y = c && c.getModel().getComponent('yAxis', 0);
  if (!y || !y.axis) return null;  // no axis until a lazy update is drawn
  const o = c.getOption();
  const columns = {};
  for (const v of o.series[0].data) columns[v[0]] = (columns[v[0]] || 0) + 1;
  const outline = o.series.find((s) => s.type === 'custom');
  const axis = y.axis;
  return {steps: o.xAxis[0].data.map(String), columns, outlined: outline ? outline.data : null,
          labels: axis.getViewLabels().map((l) => l.formattedLabel)};
}"""


def test_the_layers_view_shows_a_real_runs_layers_and_opens_one(tmp_path: Path, artifacts_dir: Path, browser: Browser) -> None:
    import mindwatch
    from mindwatch.demo.train import DemoSettings, build_training
    from mindwatch.mindspore import MonitorCallback

    model, data = build_training(DemoSettings(steps=30, layers=1, d_model=32, heads=2, batch_size=8, seq_length=32))
    config = {"save_dir": str(tmp_path / "logs"), "project": "p", "run_name": "layers", "layers": {"every": 2}, "interval": 60}
    model.train(1, data, callbacks=[MonitorCallback(config)], dataset_sink_mode=False)
    run = mindwatch.open_run(tmp_path / "logs" / "p" / "layers")
    layers = [m.removeprefix("grad_norm/") for m in run.metrics if m.startswith("grad_norm/")]
    assert "blocks.0.attn.qkv" in layers
    with DashboardProcess(tmp_path / "logs", port=0) as dash:
        page = browser.new_page(viewport={"width": 1300, "height": 1400})
        page.goto(f"{dash.url}#/run/p%2Flayers")
        wait_for(lambda: len(page.evaluate(LAYER_ROWS)) == len(layers), 60, "a heat-map row per layer")
        rows = page.evaluate(LAYER_ROWS)
        assert sorted(rows) == sorted(layers)
        assert not page.query_selector("#chart-grad_norm\\/blocks\\.0\\.attn\\.qkv")  # no chart per layer metric
        target = rows.index("blocks.0.attn.qkv")
        page.query_selector("#chart-layers").scroll_into_view_if_needed()
        box = page.query_selector("#chart-layers").bounding_box()
        x, y = page.evaluate(
            """(row) => echarts.getInstanceByDom(document.querySelector('#chart-layers'))
                 .convertToPixel({seriesIndex: 0}, [0, row])""",
            target,
        )
        page.mouse.click(box["x"] + x, box["y"] + y)  # a click on the layer's first cell, as a user would
        wait_for(lambda: page.evaluate(LAYER_CURVE) is not None, 30, "the picked layer's curves")
        curve = page.evaluate(LAYER_CURVE)
        assert curve["title"] == "layer blocks.0.attn.qkv"
        heat_stats = ("grad_norm", "update_ratio", "adam_m_norm", "adam_v_norm")  # the demo's AdamWeightDecay has moments
        expected = [len(run.series(f"{stat}/blocks.0.attn.qkv")) for stat in heat_stats]
        assert curve["points"] == expected and expected[0] == 16  # the first step and every 2nd of 30 steps
        # no blank column: a column per measured step (1, 2, 4, ..., 30), each with a cell for every layer
        heat = wait_for(lambda: (h := page.evaluate(LAYER_HEAT)) and h["outlined"] and h, 10, "the picked row outlined")
        measured = run.series("grad_norm/blocks.0.attn.qkv").step.tolist()
        assert heat["steps"] == [str(s) for s in measured] == [str(s) for s in [1, *range(2, 31, 2)]]
        assert sorted(map(int, heat["columns"])) == list(range(len(measured))) and set(heat["columns"].values()) == {len(layers)}
        assert heat["outlined"] == [[0, target]] and heat["labels"][target].startswith("▶")
        page.screenshot(path=str(artifacts_dir / "dashboard_layers.png"), full_page=True)
