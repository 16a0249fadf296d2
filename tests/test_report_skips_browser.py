"""The report of a real training whose bad batch ``skip_steps`` skipped, opened in headless Chromium: the loss chart
marks the skipped step, as the dashboard does, and no chart draws ``skipped`` as a curve; on paper too, and in a
comparison each run's skips are in its colour."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from conftest import CHROMIUM
from test_report import open_page, report_data
from test_skip_steps import skipped_steps

from mindwatch import metrics
from mindwatch.cli import main
from mindwatch.store.writer import RunWriter

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason="Debian's chromium is not installed (scripts/setup.sh)"),
]

#: The report's line charts by title: their series' names (every series: lines, points off scale), their lines' names
#: and colours, and the vertical marks they draw.
CURVES = """() => Object.fromEntries([...document.querySelectorAll('#curves .chart')].map((el) => {
  const o = echarts.getInstanceByDom(el).getOption();
  const marks = o.series.flatMap((s) => ((s.markLine && s.markLine.data) || []).map((d) => ({name: d.name, x: d.xAxis,
    label: d.label && d.label.show ? d.label.formatter : null, color: d.lineStyle.color})));
  const lines = o.series.filter((s) => s.type === 'line');
  return [o.title[0].text, {series: o.series.map((s) => s.name), lines: lines.map((s) => s.name),
    colors: lines.map((s) => s.lineStyle.color), marks}];
}))"""


def _skip_marks(page: Page, title: str) -> list[dict]:
    chart = page.evaluate(CURVES)[title]
    return [m for m in chart["marks"] if m["name"].startswith(f"{metrics.SKIPPED} at ")]


def _no_skipped_curve(page: Page) -> None:
    charts = page.evaluate(CURVES)
    assert metrics.SKIPPED not in charts
    assert not [(title, s) for title, c in charts.items() for s in c["series"] if metrics.SKIPPED in s]


@pytest.fixture(scope="module")
def skipping_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real training with a loss scale and ``skip_steps``: one bad batch (inputs x 30), whose update it skips."""
    from test_skip_steps import train_a_skipping_run

    return train_a_skipping_run(tmp_path_factory.mktemp("report-skips"))


def test_the_reports_loss_chart_marks_the_skipped_step_and_no_chart_draws_skipped(
    skipping_run: Path, browser: Browser, tmp_path: Path, artifacts_dir: Path
) -> None:
    (skipped,) = skipped_steps(skipping_run)  # the bad batch's step
    out = tmp_path / "skips.html"
    assert main(["report", str(skipping_run), "-o", str(out), "--pdf"]) == 0
    data = report_data(out.read_text())
    assert metrics.SKIPPED not in [m["name"] for m in data["metrics"]]

    page, problems, requests = open_page(browser, out)
    # one dashed line at the skipped step, named: what happened, where it happened
    (mark,) = _skip_marks(page, metrics.LOSS)
    assert mark["x"] == skipped and mark["label"] == metrics.SKIPPED and mark["name"] == f"{metrics.SKIPPED} at step {skipped}"
    # no curve of it anywhere, and no chart of its own; the other charts mark nothing of it
    _no_skipped_curve(page)
    assert [title for title in page.evaluate(CURVES) if title != metrics.LOSS and _skip_marks(page, title)] == []
    # the skip's alert is listed beside the charts
    assert f"step {skipped} was skipped" in page.inner_text("#alerts")
    assert problems == [] and requests == []
    page.locator("#curves .chart").first.screenshot(path=str(artifacts_dir / "report-skipped-step.png"))
    page.close()

    # on paper (the page pdf.py prints: report.html#print at the A4 column's width) the mark is there too
    page = browser.new_page(viewport={"width": 794, "height": 1123})
    page.emulate_media(media="print")
    page.goto(out.resolve().as_uri() + "#print")
    page.wait_for_function("document.readyState === 'complete'", timeout=30_000)
    assert [m["x"] for m in _skip_marks(page, metrics.LOSS)] == [skipped]
    _no_skipped_curve(page)
    page.close()
    pdf = out.with_suffix(".pdf").read_bytes()
    assert pdf.startswith(b"%PDF")
    (artifacts_dir / "report-skipped-step.pdf").write_bytes(pdf)


def test_a_comparison_marks_each_runs_skips_in_its_colour(skipping_run: Path, browser: Browser, tmp_path: Path) -> None:
    (skipped,) = skipped_steps(skipping_run)
    other = tmp_path / "p" / "other"  # two ranks; each skips a step of its own, and rank 1 one more
    t0 = time.time() - 100
    for rank in (0, 1):
        w = RunWriter(other, rank=rank)
        w.write(
            [
                {"step": s, "t": t0 + s, "loss": 2 - s / 100, metrics.SKIPPED: float(s in (20, 20 + 10 * rank))}
                for s in range(1, 41)
            ]
        )
        w.close("finished")
    out = tmp_path / "compare.html"
    assert main(["report", str(skipping_run), "--compare", str(other), "-o", str(out)]) == 0

    page, problems, _ = open_page(browser, out)
    loss = page.evaluate(CURVES)[metrics.LOSS]
    assert loss["lines"] == ["skips", "other rank 0", "other rank 1"]
    marks = {m["x"]: m["color"] for m in _skip_marks(page, metrics.LOSS)}
    # each step once (step 20 was skipped on both ranks), in the colour of the run's first curve
    assert marks == {skipped: loss["colors"][0], 20: loss["colors"][1], 30: loss["colors"][1]}
    _no_skipped_curve(page)
    assert problems == []
    page.close()
