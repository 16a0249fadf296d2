"""In headless Chromium: what the pages take from the server rather than write themselves. A duration reads as
mindwatch.units.format_duration writes it (charts.js's formatDuration, the pages' one formatter); a state takes the
colour of analysis/state_colours.py and a summary value the label of analysis/summary.py; and the vocabulary is asked
for when a page needs it: without it the runs page still lists the runs, and the run page says what did not load."""

from __future__ import annotations

import random
import re
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from conftest import CHROMIUM
from test_dashboard_browser import wait_for

from mindwatch.analysis.state_colours import STATE_COLOURS
from mindwatch.assets import asset_text
from mindwatch.serve.process import DashboardProcess
from mindwatch.store.layout import write_json_atomic
from mindwatch.store.writer import RunWriter
from mindwatch.units import format_duration

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason="Debian's chromium is not installed (scripts/setup.sh)"),
]

#: Ties at every place the two languages round differently (Python: to even), the edges of each unit, and long runs.
DURATIONS = [0, 0.04, 0.05, 0.25, 0.35, 0.75, 1.25, 2.5, 4.31, 9.95, 59.4, 59.5, 59.94, 59.96, 60, 60.5, 61.5, 83, 119.5,
             3599.4, 3599.5, 3600, 3723.4, 86399.9, 90061, 1e6 + 0.5, 1e7 + 1.5]  # fmt: skip


def _rgb(colour: str) -> str:
    """``#5470c6`` as the browser's computed style says it: ``rgb(84, 112, 198)``."""
    return "rgb({}, {}, {})".format(*(int(colour[i : i + 2], 16) for i in (1, 3, 5)))


def _finished_run(run_dir: Path) -> None:
    t0 = time.time() - 3725
    run_dir.mkdir(parents=True)
    write_json_atomic(run_dir / "meta.json", {"run_id": run_dir.name, "project": run_dir.parent.name, "started_at": t0,
                                              "ended_at": t0 + 3723.4, "tags": {"mode": "graph"}})  # fmt: skip
    writer = RunWriter(run_dir, 0)
    writer.write([{"step": i, "t": t0 + 93 * i, "rank": 0, "loss": 2.0 / i} for i in range(1, 41)])  # the last 5 s ago
    writer.close("finished")


def test_a_duration_reads_on_a_page_as_units_format_duration_writes_it(browser: Browser) -> None:
    rng = random.Random(7)
    values = DURATIONS + [rng.uniform(0, 100) for _ in range(300)] + [rng.uniform(0, 4e5) for _ in range(300)]
    values += [round(rng.uniform(0, 200) * 4) / 4 for _ in range(100)] + [round(rng.uniform(0, 7200)) + 0.5 for _ in range(100)]
    page = browser.new_page()
    page.set_content("<!doctype html><title>durations</title>")
    page.add_script_tag(type="module", content=asset_text("charts.js") + "\nwindow.formatDuration = formatDuration;")
    wait_for(lambda: page.evaluate("() => typeof window.formatDuration === 'function'"), 10, "charts.js")
    shown = page.evaluate("(xs) => xs.map((x) => window.formatDuration(x))", [*values, None])
    assert shown == [format_duration(v) for v in values] + [format_duration(None)]
    page.close()


def test_the_runs_page_colours_and_names_as_the_server_says(tmp_path: Path, browser: Browser) -> None:
    _finished_run(tmp_path / "logs" / "p" / "done")
    with DashboardProcess(tmp_path / "logs", port=0) as dash:
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{dash.url}#/")
        badge = '#runs-table tr[data-run="p/done"] .state'
        colour = "(sel) => getComputedStyle(document.querySelector(sel)).backgroundColor"
        wanted = _rgb(STATE_COLOURS["finished"].strong)
        wait_for(lambda: page.query_selector(badge) and page.evaluate(colour, badge) == wanted, 30, "the finished colour")
        heads = [t.strip() for t in page.locator("#runs-table thead th").all_inner_texts()]
        assert heads[:9] == ["", "run", "project", "tags", "state", "steps", "last point", "alerts", "duration"]
        row = page.locator('#runs-table tr[data-run="p/done"] td')
        assert row.nth(3).inner_text() == "mode=graph" and row.nth(8).inner_text() == "1h 02m 03s"
        assert re.fullmatch(r"\d+(\.\d)? s ago", row.nth(6).inner_text()), row.nth(6).inner_text()
        assert not errors, errors
        page.close()


def _without_vocabulary(page: Page) -> None:
    page.route(
        "**/api/vocabulary", lambda route: route.fulfill(status=500, content_type="application/json", body='{"error": "boom"}')
    )


def test_without_the_vocabulary_the_runs_page_works_and_the_run_page_says_what_did_not_load(
    tmp_path: Path, browser: Browser
) -> None:
    _finished_run(tmp_path / "logs" / "p" / "done")
    with DashboardProcess(tmp_path / "logs", port=0) as dash:
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        _without_vocabulary(page)
        page.goto(f"{dash.url}#/")
        wait_for(lambda: page.query_selector('#runs-table tr[data-run="p/done"] .state-finished'), 30, "the run listed")
        assert page.inner_text("#runs-count") == "1 of 1 run(s)"
        page.click('#runs-table tr[data-run="p/done"] a')
        banner = wait_for(lambda: page.is_visible("#banner") and page.inner_text("#banner"), 30, "the run page's banner")
        assert banner == "the metric vocabulary (/api/vocabulary) did not load: boom"
        assert not errors, errors
        page.close()
