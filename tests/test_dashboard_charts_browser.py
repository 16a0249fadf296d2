"""In headless Chromium: the run page's charts do not mislead (time axis, smoothing), its view survives a reload,
and the runs table keeps focus while it updates live."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from conftest import CHROMIUM
from test_dashboard_browser import wait_for

from mindwatch.serve.process import DashboardProcess
from mindwatch.store.writer import RunWriter

if TYPE_CHECKING:
    from playwright.sync_api import Browser


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason="Debian's chromium is not installed (scripts/setup.sh)"),
]

LOSS_SERIES = """() => {
  const el = document.querySelector('#chart-loss');
  const c = el && echarts.getInstanceByDom(el);
  if (!c) return null;
  const o = c.getOption();
  return {names: o.series.map((s) => s.name), x: o.xAxis[0].type, xName: o.xAxis[0].name,
          data: Object.fromEntries(o.series.map((s) => [s.name, s.data.filter((p) => p[1] !== '-')]))};
}"""

LR_TICKS = """() => {
  const el = document.querySelector('#chart-lr');
  const c = el && echarts.getInstanceByDom(el);
  const axis = c && c.getModel().getComponent('yAxis', 0);
  if (!axis || !c.getOption().series.length || !c.getOption().series[0].data.length) return null;
  const labels = c.getModel().getComponent('yAxis', 0).axis.getViewLabels().map((l) => l.formattedLabel);
  return labels;
}"""


def _look_at(page, artifacts_dir: Path, name: str) -> None:  # noqa: ANN001
    """Screenshots at 1400 and 390 px for a person to look at; at 390 px the page does not overflow sideways."""
    page.screenshot(path=str(artifacts_dir / f"{name}_1400.png"), full_page=True)
    page.set_viewport_size({"width": 390, "height": 900})
    time.sleep(0.5)
    assert page.evaluate("() => document.documentElement.scrollWidth") <= 390 + 1
    page.screenshot(path=str(artifacts_dir / f"{name}_390.png"), full_page=True)


def _write_run(logs: Path, name: str, steps: int, t0: float) -> RunWriter:
    writer = RunWriter(logs / "p" / name, 0, flush_secs=0.2)
    noisy = [200.0 + (50 if s % 3 else -50) + s / 10 for s in range(1, steps + 1)]
    records = [{"step": s, "t": t0 + s, "loss": v, "lr": 0.003} for s, v in enumerate(noisy, start=1)]
    writer.write(records)
    writer.flush()
    return writer


def test_time_axis_is_milliseconds_near_now_and_smoothing_keeps_the_raw_line(
    tmp_path: Path, artifacts_dir: Path, browser: Browser
) -> None:
    t0 = time.time() - 300
    _write_run(tmp_path / "logs", "noisy", 120, t0).close("finished")
    with DashboardProcess(tmp_path / "logs", port=0) as dash:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{dash.url}#/run/p%2Fnoisy?x=time&smoothing=0.9")
        wait_for(lambda: (page.evaluate(LOSS_SERIES) or {}).get("data", {}).get("loss"), 60, "the loss chart")
        shown = page.evaluate(LOSS_SERIES)
        assert shown["x"] == "time" and shown["xName"] == "time"
        xs = [p[0] for p in shown["data"]["loss"]]
        assert abs(xs[0] - (t0 + 1) * 1000) < 1000 and abs(xs[-1] - time.time() * 1000) < 600_000  # ms, near now
        raw = shown["data"]["loss (raw)"]
        assert [p[1] for p in raw] == [200.0 + (50 if s % 3 else -50) + s / 10 for s in range(1, 121)]  # the data itself
        smoothed = [p[1] for p in shown["data"]["loss"]]
        assert max(smoothed) - min(smoothed) < max(p[1] for p in raw) - min(p[1] for p in raw)
        # a constant lr: a readable range around 0.003, not six identical ticks
        ticks = wait_for(lambda: page.evaluate(LR_TICKS), 30, "the lr chart")
        assert len(set(ticks)) == len(ticks) > 2 and "0.003" in ticks
        _look_at(page, artifacts_dir, "run_page")


def test_the_run_pages_view_survives_a_reload(tmp_path: Path, browser: Browser) -> None:
    _write_run(tmp_path / "logs", "view", 200, time.time() - 600).close("finished")
    with DashboardProcess(tmp_path / "logs", port=0) as dash:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{dash.url}#/run/p%2Fview")
        wait_for(lambda: (page.evaluate(LOSS_SERIES) or {}).get("data", {}).get("loss"), 60, "the loss chart")
        page.check("#logscale")
        page.fill("#smoothing", "0.6")
        page.dispatch_event("#smoothing", "input")
        page.select_option("#xaxis", "elapsed")

        def elapsed_drawn() -> bool:
            shown = page.evaluate(LOSS_SERIES) or {}
            return shown.get("x") == "value" and bool(shown.get("data", {}).get("loss"))

        wait_for(elapsed_drawn, 30, "the elapsed axis")
        page.evaluate(
            """() => echarts.getInstanceByDom(document.querySelector('#chart-loss'))
                 .dispatchAction({type: 'dataZoom', startValue: 100, endValue: 200})"""
        )
        hash_of = "() => location.hash"
        wait_for(lambda: "zoom=" in page.evaluate(hash_of), 10, "the zoom in the URL")
        url = page.evaluate(hash_of)
        assert "log=1" in url and "smoothing=0.6" in url and "x=elapsed" in url
        page.reload()
        wait_for(lambda: (page.evaluate(LOSS_SERIES) or {}).get("data", {}).get("loss"), 60, "the loss chart again")
        assert page.evaluate(hash_of) == url
        wait_for(lambda: page.is_checked("#logscale"), 30, "the toolbar")
        assert page.is_checked("#logscale") and page.input_value("#smoothing") == "0.6"
        assert page.input_value("#xaxis") == "elapsed"
        assert page.evaluate(LOSS_SERIES)["xName"].startswith("elapsed")
        assert "loss (raw)" in page.evaluate(LOSS_SERIES)["names"]
        extent = """() => {
          const c = echarts.getInstanceByDom(document.querySelector('#chart-loss'));
          const x = c && c.getModel().getComponent('xAxis', 0);
          return x && x.axis ? x.axis.scale.getExtent() : null; }  // no axis until a lazy update is drawn"""
        lo, hi = wait_for(lambda: (e := page.evaluate(extent)) and 90 <= e[0] <= 110 and e, 30, "the zoomed window again")
        assert 190 <= hi <= 210


def test_a_focused_checkbox_in_the_runs_table_survives_live_updates(
    tmp_path: Path, artifacts_dir: Path, browser: Browser
) -> None:
    writers = [_write_run(tmp_path / "logs", f"r{i}", 10, time.time() - 100 + i) for i in range(3)]
    with DashboardProcess(tmp_path / "logs", port=0) as dash:
        page = browser.new_page(viewport={"width": 1400, "height": 800})
        page.goto(dash.url)
        page.wait_for_selector('tr[data-run="p/r1"]', timeout=20_000)
        page.focus('tr[data-run="p/r1"] input[type=checkbox]')
        page.keyboard.press("Space")
        for step in range(11, 15):  # the run goes on: its row's steps change, the table re-renders every second
            writers[1].write([{"step": step, "t": time.time(), "loss": 1.0}])
            writers[1].flush()
            time.sleep(0.6)
        wait_for(lambda: "14" in page.inner_text('tr[data-run="p/r1"]'), 20, "the row updated live")
        time.sleep(1.5)
        focused_row = "() => { const tr = document.activeElement.closest('tr'); return tr && tr.dataset.run; }"
        assert page.evaluate(focused_row) == "p/r1"
        assert page.is_checked('tr[data-run="p/r1"] input[type=checkbox]')
        page.keyboard.press("Tab")  # keyboard users go on from where they were
        _look_at(page, artifacts_dir, "runs_page")
    for w in writers:
        w.close("finished")
