"""In headless Chromium at a phone's 390 px: the runs table and the compare page's summary stack into the width, so
every value is on screen (none cut at the right edge, none behind a scroll the phone does not show), and the run page
shows its alerts before its charts."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from conftest import CHROMIUM
from test_dashboard_browser import wait_for
from test_dashboard_compare_browser import _compare_url

from mindwatch.serve.process import DashboardProcess
from mindwatch.store.notes import write_notes
from mindwatch.store.writer import RunWriter

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason="Debian's chromium is not installed (scripts/setup.sh)"),
]

PHONE = {"width": 390, "height": 844}

#: The cells of a table a person can see that do not fit on the screen or in their own box: [text, left, right].
CUT_CELLS = """(table) => [...document.querySelectorAll(`${table} th, ${table} td`)]
  .filter((el) => el.offsetParent !== null && el.getClientRects().length)
  .map((el) => [el.innerText.trim().slice(0, 40), el.getBoundingClientRect().left, el.getBoundingClientRect().right,
    el.scrollWidth - el.clientWidth])
  .filter(([, left, right, hidden]) => left < 0 || right > innerWidth || hidden > 1)"""

#: Boxes around a table that hide part of it behind a scroll of their own: [id or class, hidden px across, down].
SCROLLED = """(table) => {
  const out = [];
  for (let el = document.querySelector(table); el && el !== document.body; el = el.parentElement) {
    if (el.scrollWidth > el.clientWidth + 1 || el.scrollHeight > el.clientHeight + 1)
      out.push([el.id || el.className, el.scrollWidth - el.clientWidth, el.scrollHeight - el.clientHeight]);
  }
  return out;
}"""


def _fits(page: Page, table: str) -> None:
    assert page.evaluate("() => document.documentElement.scrollWidth") <= PHONE["width"]
    assert page.evaluate(CUT_CELLS, table) == []
    assert page.evaluate(SCROLLED, table) == []


def _runs(logs: Path) -> list[str]:
    """Four finished runs and a failed one, with long names, a note, a tag and a long error."""
    t0 = time.time() - 600
    ids = []
    for i in range(5):
        name = f"run_20261201_19353{i}_a_long_experiment_name"
        writer = RunWriter(logs / "p" / name, 0)
        writer.write([{"step": s, "t": t0 + s, "loss": 2 - s / 100 + i / 10, "grad_norm": 1.0 + i, "step_time": 0.1}
                      for s in range(1, 61)])  # fmt: skip
        if i < 4:
            writer.close("finished")
        else:
            writer.close("failed", error="OSError: shard 7 of /data/corpus/train_shards is corrupt")
        ids.append(f"p/{name}")
    write_notes(logs / ids[0], name="baseline with the long warmup", note="the reference")
    return ids


def test_the_runs_table_and_the_compare_summary_fit_a_phone(tmp_path: Path, artifacts_dir: Path, browser: Browser) -> None:
    ids = _runs(tmp_path / "logs")
    with DashboardProcess(tmp_path / "logs", port=0) as dash:
        page = browser.new_page(viewport=PHONE)
        page.goto(f"{dash.url}#/?columns=final_loss,best_loss,max_grad_norm")
        wait_for(lambda: len(page.query_selector_all("#runs-table tbody tr")) == 5, 30, "the runs")
        time.sleep(0.5)
        _fits(page, "#runs-table")
        # each value named by its column, the sort buttons still there
        row = f'#runs-table tr[data-run="{ids[4]}"]'
        state = page.query_selector(f'{row} td[data-label="state"]')
        assert state.evaluate("(el) => getComputedStyle(el, '::before').content") == '"state: "'
        assert "shard 7" in page.inner_text(f"{row} .err")
        assert page.is_visible('#runs-table button[data-sort="final_loss"]')
        page.screenshot(path=str(artifacts_dir / "runs_table_390.png"), full_page=True)

        page.goto(_compare_url(dash.url, ids))
        wait_for(lambda: page.query_selector('#summary-table tr[data-row="error"] td'), 30, "the summary")
        time.sleep(0.5)
        _fits(page, "#summary-table")
        # every run's every value, named by the run
        for run in ids:
            cells = page.query_selector_all(f'#summary-table tbody td[data-run="{run}"]')
            assert len(cells) == len(page.query_selector_all("#summary-table tbody tr")) and all(c.is_visible() for c in cells)
        named = page.query_selector(f'#summary-table tr[data-row="state"] td[data-run="{ids[0]}"]')
        assert named.evaluate("(el) => getComputedStyle(el, '::before').content") == '"baseline with the long warmup: "'
        page.screenshot(path=str(artifacts_dir / "compare_summary_390.png"), full_page=True)

        # a wide screen keeps the table: a column a field, a row a run
        page.set_viewport_size({"width": 1400, "height": 900})
        page.goto(f"{dash.url}#/")
        wait_for(lambda: len(page.query_selector_all("#runs-table tbody tr")) == 5, 30, "the runs")
        assert page.evaluate("() => getComputedStyle(document.querySelector('#runs-table')).display") == "table"


def test_the_run_page_shows_its_alerts_before_its_charts_on_a_phone(
    tmp_path: Path, artifacts_dir: Path, browser: Browser
) -> None:
    run_dir = tmp_path / "logs" / "p" / "spiky"
    writer = RunWriter(run_dir, 0)
    t0 = time.time() - 100
    writer.write([{"step": s, "t": t0 + s, "loss": 9.0 if s == 30 else 2.0, "grad_norm": 1.0} for s in range(1, 61)])
    writer.append_alert({"t": t0 + 30, "step": 30, "rank": 0, "rule": "spike", "metric": "loss", "value": 9.0,
                  "severity": "warning", "message": "loss 9 is 4.5x its recent median"})  # fmt: skip
    writer.close("finished")
    with DashboardProcess(tmp_path / "logs", port=0) as dash:
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.goto(f"{dash.url}#/run/p%2Fspiky")
        wait_for(lambda: "loss 9 is" in page.inner_text("#alert-list"), 30, "the alert")
        box = lambda sel: page.evaluate(f"() => document.querySelector('{sel}').getBoundingClientRect().toJSON()")  # noqa: E731
        assert box("#alert-list")["left"] >= box("#charts")["right"]  # wide: beside the charts

        page.set_viewport_size(PHONE)
        time.sleep(0.5)
        alerts, charts, config = box("#side-alerts"), box("#charts"), box("#config")
        assert alerts["bottom"] <= charts["top"] and alerts["top"] < PHONE["height"]  # on the first screen, above the charts
        assert config["top"] >= charts["bottom"]  # the run's meta and config after them
        assert page.evaluate("() => document.documentElement.scrollWidth") <= PHONE["width"]
        page.screenshot(path=str(artifacts_dir / "run_page_alerts_390.png"), full_page=True)
