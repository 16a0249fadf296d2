"""In headless Chromium, on runs written by RunWriter: the header's progress, honest y-axes, the runs table."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
from conftest import CHROMIUM
from test_dashboard_browser import wait_for

from mindwatch.serve.process import DashboardProcess
from mindwatch.store.layout import write_json_atomic
from mindwatch.store.writer import RunWriter
from mindwatch.units import format_duration

if TYPE_CHECKING:
    from playwright.sync_api import Browser


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason="Debian's chromium is not installed (scripts/setup.sh)"),
]

Y_AXIS = """(id) => {
  const el = document.querySelector(id);
  const c = el && echarts.getInstanceByDom(el);
  if (!c || !c.getOption().series.some((s) => s.data && s.data.length)) return null;
  const axis = c.getModel().getComponent('yAxis', 0);
  if (!axis || !axis.axis) return null;
  const [lo, hi] = axis.axis.scale.getExtent();
  const off = c.getOption().series.filter((s) => s.name.endsWith('off scale')).flatMap((s) => s.data.map((d) => d.value));
  const marks = c.getOption().series.flatMap((s) => ((s.markLine && s.markLine.data) || []).map((d) => d.xAxis));
  return { lo, hi, max: c.getOption().yAxis[0].max ?? null, off, marks };
}"""


def write_run(root: Path, records: list[dict], meta: dict, state: str | None = "finished", flush_secs: float = 2.0) -> RunWriter:
    writer = RunWriter(root, 0, flush_secs=flush_secs)
    writer.write(records)
    if state:
        writer.close(state)
    else:
        writer.flush()
    write_json_atomic(root / "meta.json", {"run_id": root.name, "project": root.parent.name, **meta})
    return writer


def robust_max(values: list[float]) -> float:
    """The robust upper bound the charts promise (docs/dashboard.md), computed here with numpy's nearest-rank percentiles."""
    v = np.sort(np.asarray(values))
    lo = np.percentile(v, 1, method="higher")
    hi = np.percentile(v, 99, method="lower")
    return float(hi + 0.1 * (hi - lo))


def test_step_time_axis_leaves_out_the_compilation_step_until_the_toggle(tmp_path: Path, browser: Browser) -> None:
    rng = np.random.default_rng(3)
    step_times = [6.0] + list(np.round(0.05 + 0.005 * rng.standard_normal(99), 5))
    records = []
    for s, st in enumerate(step_times, start=1):
        records.append({"step": s, "t": 1e9 + s, "step_time": float(st), "loss": float("nan") if s == 70 else 2.0 - s / 200})
    write_run(tmp_path / "logs" / "p" / "compile", records, {"started_at": 1e9})
    with DashboardProcess(tmp_path / "logs", port=0) as dash:
        page = browser.new_page(viewport={"width": 1300, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{dash.url}#/run/p%2Fcompile")
        robust = wait_for(lambda: page.evaluate(Y_AXIS, "#chart-time"), 60, "the step-time chart")
        # the top of the robust range, rounded up to a tick (no full-precision edge label over the ticks)
        assert robust_max(step_times) <= robust["max"] <= 1.25 * robust_max(step_times)
        assert robust["hi"] < 0.2, robust  # the 1,499 ordinary steps fill the chart, not the bottom tenth
        assert [o[0] for o in robust["off"]] == [1] and robust["off"][0][2] == 6.0  # the compile step: a marker at the edge
        loss = wait_for(lambda: page.evaluate(Y_AXIS, "#chart-loss"), 30, "the loss chart")
        assert 70 in loss["marks"]  # the NaN loss keeps its marker

        page.click("#y-all")
        everything = wait_for(lambda: (y := page.evaluate(Y_AXIS, "#chart-time")) and y["hi"] >= 6.0 and y, 10, "the full range")
        assert everything["hi"] >= 6.0 and everything["off"] == []
        page.click("#y-all")
        assert wait_for(lambda: (y := page.evaluate(Y_AXIS, "#chart-time")) and y["hi"] < 0.2, 10, "the robust range again")
        assert not errors, errors


PROGRESS = """() => {
  const bar = document.querySelector('#progress-bar');
  const text = document.querySelector('#progress-text');
  const eta = document.querySelector('#progress-eta');
  const rate = document.querySelector('#progress-rate');
  return { value: bar && bar.value, max: bar && bar.max, text: text && text.textContent,
           eta: eta && eta.textContent, rate: rate && rate.textContent };
}"""


def test_the_header_shows_progress_rate_and_eta_and_moves_with_the_points(tmp_path: Path, browser: Browser) -> None:
    now = time.time()
    records = [{"step": s, "t": now - (60 - s) * 0.1, "loss": 2.0} for s in range(1, 61)]  # 10 steps/s up to now
    writer = write_run(tmp_path / "logs" / "p" / "planned", records, {"started_at": now - 6, "total_steps": 120}, None, 60.0)
    write_run(tmp_path / "logs" / "p" / "endless", records[:10], {"started_at": now - 6})
    with DashboardProcess(tmp_path / "logs", port=0) as dash:
        page = browser.new_page(viewport={"width": 1300, "height": 900})
        page.goto(f"{dash.url}#/run/p%2Fplanned")
        first = wait_for(lambda: (pr := page.evaluate(PROGRESS))["value"] and pr, 30, "the progress bar")
        assert (first["value"], first["max"]) == (60, 120)
        assert first["text"].strip() == "60/120 (50 %)"
        assert first["rate"].strip() == "10.0 steps/s"
        # 60 steps left at 10 steps/s, said as every duration is (mindwatch.units.format_duration)
        assert first["eta"].strip() == f"· ETA {format_duration(6)}" == "· ETA 6.0 s"

        later = time.time()
        writer.write([{"step": s, "t": later + (s - 60) * 0.1, "loss": 2.0} for s in range(61, 91)])
        moved = wait_for(lambda: (pr := page.evaluate(PROGRESS))["value"] == 90 and pr, 20, "the bar to follow the points")
        assert moved["text"].strip() == "90/120 (75 %)"

        page.goto(f"{dash.url}#/run/p%2Fendless")
        wait_for(lambda: page.evaluate(PROGRESS)["text"] == "step 10 (total unknown)", 30, "total unknown")
        assert page.evaluate(PROGRESS)["value"] is None  # no bar without a plan
        writer.close("finished")


ROWS = """() => [...document.querySelectorAll('#runs-table tbody tr')].map((tr) => tr.dataset.run)"""


def test_runs_table_sorts_and_filters_by_a_config_column_and_the_url_restores_it(tmp_path: Path, browser: Browser) -> None:
    lrs = [3e-4, 1e-2, 1e-3, 5e-3, 2e-4, 3e-2]
    finals = [1.9, 2.4, 1.5, 2.2, 1.7, 2.9]
    for i, (lr, final) in enumerate(zip(lrs, finals, strict=True)):
        records = [{"step": s, "t": 1e9 + s, "loss": final + (20 - s) * 0.01} for s in range(1, 21)]
        meta = {"started_at": 1e9 + i, "config": {"optimizer": {"lr": lr, "name": "adamw"}, "batch_size": 8}}
        write_run(tmp_path / "logs" / "team" / f"run_{i}", records, meta)
    by_lr = [f"team/run_{i}" for i in sorted(range(6), key=lambda i: lrs[i])]
    with DashboardProcess(tmp_path / "logs", port=0) as dash:
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(dash.url)
        wait_for(lambda: len(page.evaluate(ROWS)) == 6, 30, "six runs")
        page.fill("#add-column", "config.optimizer.lr")
        page.dispatch_event("#add-column", "change")
        page.wait_for_selector('th[data-column="config.optimizer.lr"]', timeout=10_000)
        page.click('th[data-column="config.optimizer.lr"] .sort')
        wait_for(lambda: page.evaluate(ROWS) == by_lr, 10, "rows sorted by lr")
        page.click('th[data-column="config.optimizer.lr"] .sort')  # again: descending
        wait_for(lambda: page.evaluate(ROWS) == by_lr[::-1], 10, "rows sorted by lr, descending")
        cells = page.eval_on_selector_all(
            'td[data-column="config.optimizer.lr"]', "tds => tds.map((td) => Number(td.textContent))"
        )
        assert cells == sorted(lrs, reverse=True)

        page.fill("#filter-expr", "lr > 1e-3 and final(loss) < 2.5")
        page.dispatch_event("#filter-expr", "change")
        want = [r for r in by_lr[::-1] if lrs[int(r[-1])] > 1e-3 and finals[int(r[-1])] < 2.5]
        assert want == ["team/run_1", "team/run_3"]  # 1e-2 (2.4) and 5e-3 (2.2); 3e-2 has 2.9
        wait_for(lambda: page.evaluate(ROWS) == want, 10, "the filtered rows")
        url = page.url
        assert "filter=" in url and "sort=-config.optimizer.lr" in url

        page.goto("about:blank")
        page.goto(url)  # a shared link: the same view
        wait_for(lambda: page.evaluate(ROWS) == want, 30, "the view from the URL")
        assert page.input_value("#filter-expr") == "lr > 1e-3 and final(loss) < 2.5"
        assert page.query_selector('th[data-column="config.optimizer.lr"]') is not None

        page.fill("#filter-expr", "lr >")
        page.dispatch_event("#filter-expr", "change")
        wait_for(lambda: "expected a value" in page.text_content("#filter-error"), 10, "the filter's error")
        assert not errors, errors
