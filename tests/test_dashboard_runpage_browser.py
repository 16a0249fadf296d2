"""In headless Chromium, on runs written by RunWriter: the run page says what a live run waits for before its first
step, an ended run's rate reads as its average, and the chart tools (download, full screen, metric search)."""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import pytest
from conftest import CHROMIUM, CHROMIUM_ARGS
from test_dashboard_browser import wait_for
from test_dashboard_charts_browser import _look_at

from mindwatch.serve.process import DashboardProcess
from mindwatch.store.layout import write_json_atomic
from mindwatch.store.writer import RunWriter

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason="Debian's chromium is not installed (scripts/setup.sh)"),
]

LOSS = """() => {
  const el = document.querySelector('#chart-loss');
  const c = el && echarts.getInstanceByDom(el);
  const s = c && c.getOption().series.find((x) => x.name === 'loss');
  return s ? {points: s.data.filter((p) => p[1] !== '-').length, symbol: s.showSymbol} : null;
}"""


def _meta(run_dir: Path, **meta: object) -> None:
    write_json_atomic(run_dir / "meta.json", {"run_id": run_dir.name, "project": run_dir.parent.name, **meta})


def test_a_live_run_says_it_waits_for_its_first_step_and_its_first_point_draws_as_a_point(
    tmp_path: Path, artifacts_dir: Path
) -> None:
    from playwright.sync_api import sync_playwright

    run_dir = tmp_path / "logs" / "p" / "compiling"
    writer = RunWriter(run_dir, 0, flush_secs=60)  # running, no step yet: the graph compiles
    _meta(run_dir, started_at=time.time() - 42)
    with DashboardProcess(tmp_path / "logs", port=0) as dash, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{dash.url}#/run/p%2Fcompiling")
        page.wait_for_selector("#run-waiting:not([hidden])", timeout=30_000)
        said = page.inner_text("#run-waiting")
        m = re.fullmatch(r"compiling the graph / waiting for the first step: (\d+) s", said.strip())
        assert m and 42 <= int(m.group(1)) < 42 + 30, said
        wait_for(lambda: int(re.findall(r"\d+", page.inner_text("#run-waiting"))[0]) > int(m.group(1)), 5, "the clock to tick")
        _look_at(page, artifacts_dir, "run_page_compiling")

        writer.write([{"step": 1, "t": time.time(), "loss": 2.5}])
        writer.flush()
        drawn = wait_for(lambda: page.evaluate(LOSS), 30, "the first point")
        assert drawn == {"points": 1, "symbol": True}  # one value: a visible point, not an invisible line
        wait_for(lambda: page.is_hidden("#run-waiting"), 10, "the waiting line to go")
        writer.write([{"step": 2, "t": time.time(), "loss": 2.4}])
        writer.flush()
        assert wait_for(lambda: (d := page.evaluate(LOSS)) and d["points"] == 2 and d, 20, "the second point")["symbol"] is False
        assert not errors, errors
        browser.close()
    writer.close("finished")


def test_an_ended_run_shows_its_average_rate_labelled_as_such(tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    t0 = time.time() - 600
    # 300 steps at 10 steps/s, then 200 at 2 steps/s: the last minute says 2, the run's average is 500 / 130 s
    times = [t0 + 0.1 * s for s in range(1, 301)] + [t0 + 30 + 0.5 * s for s in range(1, 201)]
    run_dir = tmp_path / "logs" / "p" / "ended"
    writer = RunWriter(run_dir, 0)
    writer.write([{"step": s, "t": t, "loss": 1.0} for s, t in enumerate(times, start=1)])
    writer.close("stopped")
    _meta(run_dir, started_at=t0, total_steps=1000)
    average = (500 - 1) / (times[-1] - times[0])  # the steps between the first and the last recorded step end
    with DashboardProcess(tmp_path / "logs", port=0) as dash, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{dash.url}#/run/p%2Fended")
        rate = wait_for(lambda: page.query_selector("#progress-rate") and page.inner_text("#progress-rate"), 30, "the rate")
        assert rate.strip() == f"average {average:.3g} steps/s"
        assert page.query_selector("#progress-eta") is None
        browser.close()
