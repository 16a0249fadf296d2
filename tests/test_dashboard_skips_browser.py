"""In headless Chromium: a step ``skip_steps`` skipped is an event. The loss chart marks it where it happened, as
alerts are marked, live too; no chart draws ``skipped`` as a curve (on the loss-scale chart's outlier-clipped axis
one skip was a triangle at the edge); the compare page marks each run's skips in its colour."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from conftest import CHROMIUM
from test_dashboard_browser import wait_for
from test_dashboard_charts_browser import _look_at
from test_dashboard_compare_browser import _compare_url
from test_skip_steps import skipped_steps

from mindwatch import metrics
from mindwatch.serve.process import DashboardProcess
from mindwatch.store.writer import RunWriter

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason="Debian's chromium is not installed (scripts/setup.sh)"),
]

#: Every line chart of the page: its series' names and the vertical marks it draws ({name, x, label, color}).
CHARTS = """() => Object.fromEntries([...document.querySelectorAll('.chart:not(.heat)')].map((el) => {
  const c = echarts.getInstanceByDom(el), o = c && c.getOption();
  if (!o || !o.series) return [el.id, null];
  const marks = o.series.flatMap((s) => ((s.markLine && s.markLine.data) || []).map((d) => ({name: d.name, x: d.xAxis,
    label: d.label && d.label.show ? d.label.formatter : null, color: d.lineStyle.color})));
  return [el.id, {series: o.series.map((s) => s.name), marks}];
}))"""


def _skip_marks(page: Page, chart: str) -> list[dict]:
    shown = page.evaluate(CHARTS).get(chart) or {"marks": []}
    return [m for m in shown["marks"] if m["name"].startswith(f"{metrics.SKIPPED} at ")]


@pytest.fixture(scope="module")
def skipping_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real training with a loss scale and ``skip_steps``: one bad batch (inputs x 30), whose update it skips."""
    from test_skip_steps import train_a_skipping_run

    return train_a_skipping_run(tmp_path_factory.mktemp("skips"))


def test_a_skipped_step_is_marked_on_the_loss_chart_and_drawn_as_no_curve(
    skipping_run: Path, artifacts_dir: Path, browser: Browser
) -> None:
    (skipped,) = skipped_steps(skipping_run)  # the bad batch's step
    with DashboardProcess(skipping_run.parent.parent, port=0) as dash:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{dash.url}#/run/p%2Fskips")
        wait_for(lambda: _skip_marks(page, "chart-loss"), 60, "the skip's mark on the loss chart")
        charts = page.evaluate(CHARTS)

        # one dashed line at the skipped step, named: what happened, where it happened
        (mark,) = _skip_marks(page, "chart-loss")
        assert mark["x"] == skipped and mark["label"] == metrics.SKIPPED
        # no curve of it anywhere, and no card of its own; the loss-scale chart draws the scale and the overflows
        assert not [(chart, s) for chart, c in charts.items() for s in c["series"] if s.startswith(metrics.SKIPPED)]
        assert f"chart-{metrics.SKIPPED}" not in charts
        assert charts["chart-loss_scale"]["series"] == [metrics.LOSS_SCALE, metrics.OVERFLOW]
        # the skip's alert is listed beside the charts
        assert f"step {skipped} was skipped" in page.inner_text("#alert-list")
        # the metric search finds the chart that marks it
        page.fill("#metric-filter", metrics.SKIPPED)
        wait_for(lambda: page.is_visible("#chart-loss") and not page.is_visible("#chart-lr"), 10, "the search's charts")
        page.fill("#metric-filter", "")
        _look_at(page, artifacts_dir, "run_page_skipped_step")

        # the compare page marks it on the run's loss chart, in the run's colour
        page.goto(_compare_url(dash.url, ["p/skips"]))
        wait_for(lambda: _skip_marks(page, "compare-loss"), 60, "the skip's mark on the compare page")
        (mark,) = _skip_marks(page, "compare-loss")
        line = page.evaluate("() => echarts.getInstanceByDom(document.querySelector('#compare-loss')).getOption().series[0]")
        assert mark["x"] == skipped and mark["color"] == line["lineStyle"]["color"]
        assert page.query_selector(f"#compare-{metrics.SKIPPED}") is None
        assert not errors, errors


def test_a_skip_that_arrives_live_is_marked_by_step_and_by_time(tmp_path: Path, browser: Browser) -> None:
    writer = RunWriter(tmp_path / "logs" / "p" / "live", 0, flush_secs=0.1)
    t0 = time.time() - 100
    record = lambda s: {"step": s, "t": t0 + s, "loss": 2 - s / 100, "grad_norm": 1.0, metrics.SKIPPED: float(s == 45)}  # noqa: E731
    writer.write([record(s) for s in range(1, 31)])
    writer.flush()
    with DashboardProcess(tmp_path / "logs", port=0) as dash:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{dash.url}#/run/p%2Flive")
        wait_for(lambda: (page.evaluate(CHARTS).get("chart-loss") or {}).get("series"), 60, "the loss chart")
        assert _skip_marks(page, "chart-loss") == []  # 30 steps, none skipped: nothing marked
        writer.write([record(s) for s in range(31, 61)])
        writer.flush()
        wait_for(lambda: _skip_marks(page, "chart-loss"), 30, "the live skip's mark")
        assert [m["x"] for m in _skip_marks(page, "chart-loss")] == [45]

        page.select_option("#xaxis", "time")  # the mark moves with the x axis: at the step's time, in ms
        wait_for(lambda: [m["x"] for m in _skip_marks(page, "chart-loss")] == [pytest.approx((t0 + 45) * 1000)], 30, "by time")
        page.close()
    writer.close("finished")
