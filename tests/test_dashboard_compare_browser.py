"""In headless Chromium: the compare page overlays every chart group of real trainings (one line per run), names the
config keys that differ, shows each run's summary, keeps a spiking run from flattening the others, and keeps its view
in the URL."""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

import pytest
from conftest import CHROMIUM, dense_training
from test_dashboard_browser import wait_for
from test_dashboard_charts_browser import _look_at

import mindwatch
from mindwatch import metrics
from mindwatch.analysis.summary import summarize_run
from mindwatch.serve.process import DashboardProcess
from mindwatch.store.writer import RunWriter
from mindwatch.units import format_duration

if TYPE_CHECKING:
    from playwright.sync_api import Browser


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason="Debian's chromium is not installed (scripts/setup.sh)"),
]

#: What each compare chart draws: {metric: {x axis type and name, series name -> its [x, y] points}}.
CHARTS = """() => Object.fromEntries([...document.querySelectorAll('#compare-charts .chart')].map((el) => {
  const c = echarts.getInstanceByDom(el), o = c.getOption();
  const xAxis = c.getModel().getComponent('xAxis', 0).axis, yAxis = c.getModel().getComponent('yAxis', 0).axis;
  const labels = xAxis ? xAxis.getViewLabels().map((l) => l.formattedLabel) : [];  // no axis until a lazy update is drawn
  const y = yAxis ? yAxis.scale.getExtent() : [];
  return [el.dataset.metric, {group: el.closest('[data-group]').dataset.group, x: o.xAxis[0].type, xName: o.xAxis[0].name,
    xLabels: labels, y, series: Object.fromEntries(o.series.map((s) => [s.name, s.data.filter((p) => p[1] !== '-')]))}];
}))"""


def _train(save_dir: Path, name: str, interval: int, steps: int, fail_at: int | None = None) -> Path:
    from mindspore.train import Callback

    from mindwatch.mindspore import MonitorCallback

    class ShardError(Callback):  # the training raises after step fail_at, as a corrupt shard would
        def on_train_step_end(self, run_context) -> None:  # noqa: ANN001
            if run_context.original_args().cur_step_num == fail_at:
                raise OSError("shard 7 is corrupt")

    model, data = dense_training(steps, 0.01)
    mon = MonitorCallback(
        {"save_dir": str(save_dir), "project": "cmp", "run_name": name, "interval": interval, "flush_secs": 0.2}
    )
    try:
        model.train(1, data, callbacks=[mon, ShardError()], dataset_sink_mode=False)
    except OSError:
        assert fail_at is not None
    return save_dir / "cmp" / name


@pytest.fixture(scope="module")
def trainings(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Three real small trainings: two that finish (config ``interval`` 5 and 50) and one that fails at step 20."""
    save_dir = tmp_path_factory.mktemp("compare")
    return {
        "cmp/fast": _train(save_dir, "fast", 5, 30),
        "cmp/slow": _train(save_dir, "slow", 50, 40),
        "cmp/broken": _train(save_dir, "broken", 5, 40, fail_at=20),
    }


def _jsonl_losses(run_dir: Path) -> list[float]:
    """The loss of every line of rank 0's metrics file, read here with json (not with mindwatch's reader)."""
    lines = (run_dir / "metrics.rank0.jsonl").read_text().splitlines()
    return [float(r["loss"]) for r in map(json.loads, lines) if "loss" in r]


def _compare_url(url: str, ids: list[str], query: str = "") -> str:
    return f"{url}#/compare?runs={','.join(quote(i, safe='/') for i in ids)}{query}"


def test_compare_overlays_every_chart_group_with_the_config_diff_and_the_summaries(
    trainings: dict[str, Path], artifacts_dir: Path, browser: Browser
) -> None:
    ids = list(trainings)
    runs = {i: mindwatch.open_run(p) for i, p in trainings.items()}
    with DashboardProcess(next(iter(trainings.values())).parent.parent, port=0) as dash:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.goto(_compare_url(dash.url, ids))
        wait_for(
            lambda: all(s for s in (page.evaluate(CHARTS).get("loss") or {}).get("series", {"": []}).values()),
            60,
            "the loss chart",
        )
        time.sleep(1)
        shown = page.evaluate(CHARTS)

        # every chart group of the vocabulary the runs recorded: a chart per metric, a line per run that has it
        expected = 0
        for group in metrics.CHART_GROUPS:
            for m in (m for m in group.metrics if m not in group.events):  # an event is marked, not charted
                having = [i for i in ids if m in runs[i].metrics]
                if not having:
                    assert m not in shown
                    continue
                expected += 1
                assert shown[m]["group"] == group.id, m
                lines = [name for name in shown[m]["series"] if not name.endswith(" off scale")]  # outliers' triangles apart
                assert sorted(lines) == sorted(having), m
        assert expected >= 5 and {"loss", "step_time"} <= set(shown)
        for i in ids:  # each run's line is its losses, as the file holds them
            assert [pt[1] for pt in shown["loss"]["series"][i]] == pytest.approx(_jsonl_losses(trainings[i]), rel=1e-6)

        # the config keys that differ: interval 5 / 50 / 5; the same save_dir is not listed
        row = page.locator('#config-table tr[data-key="interval"]')
        assert [row.locator(f'td[data-run="{i}"]').inner_text() for i in ids] == ["5", "50", "5"]
        assert page.locator('#config-table tr[data-key="save_dir"]').count() == 0
        page.check("#config-all")
        assert page.locator('#config-table tr[data-key="save_dir"]').count() == 1

        # the summaries side by side: each run's RunSummary, and what the files say
        assert page.locator('#summary-table tr[data-row="best_loss"] th').inner_text() == "best loss"
        for i in ids:
            s = summarize_run(runs[i])

            def cell(label: str, run: str = i) -> str:
                return page.locator(f'#summary-table tr[data-row="{label}"] td[data-run="{run}"]').inner_text()

            assert cell("state") == s.state == ("failed" if i == "cmp/broken" else "finished")
            assert cell("last_step").split()[0] == str(s.last_step)
            assert s.last_step == len(_jsonl_losses(trainings[i]))
            best = float(cell("best_loss").split()[0])
            # shown in 4 significant digits, as the report shows them
            assert best == pytest.approx(s.best_loss, rel=5e-4) and best == pytest.approx(
                min(_jsonl_losses(trainings[i])), rel=5e-4
            )
            assert cell("ranks") == s.rank_text == "1"
            assert cell("duration") == format_duration(s.duration) != "-"  # as the report and `mindwatch runs` say it

        # elapsed: each run from its own start, ticks in round units
        page.select_option("#xaxis", "elapsed")
        wait_for(lambda: page.evaluate(CHARTS)["loss"]["x"] == "value" and page.evaluate(CHARTS)["loss"]["series"], 30, "elapsed")
        time.sleep(0.5)
        loss = page.evaluate(CHARTS)["loss"]
        assert loss["xName"] == "elapsed (m:ss)"
        assert all(min(pt[0] for pt in pts) < 30 for pts in loss["series"].values())  # seconds since each start
        secs = [int(m) * 60 + int(s) for m, s in (re.fullmatch(r"(\d+):(\d\d)", t).groups() for t in loss["xLabels"])]  # type: ignore[union-attr]
        steps = {b - a for a, b in zip(secs, secs[1:], strict=False)}
        assert len(steps) == 1 and steps.pop() in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600), loss["xLabels"]
        assert all(s % (secs[1] - secs[0]) == 0 for s in secs)
        _look_at(page, artifacts_dir, "compare_page")
        assert not errors, errors


def _write_run(logs: Path, name: str, spike: float | None) -> None:
    writer = RunWriter(logs / "p" / name, 0, flush_secs=0.2)
    t0 = time.time() - 400
    loss = [2.0 - s / 200 + (0.05 if s % 2 else -0.05) for s in range(1, 151)]
    if spike is not None:
        loss[100] = spike
    writer.write([{"step": s, "t": t0 + s, "loss": v} for s, v in enumerate(loss, start=1)])
    writer.close("finished")


def test_a_spiking_run_leaves_the_others_readable_and_the_view_survives_a_reload(tmp_path: Path, browser: Browser) -> None:
    for name, spike in (("a", None), ("b", None), ("spiky", 1e6)):
        _write_run(tmp_path / "logs", name, spike)
    ids = ["p/a", "p/spiky", "p/b"]
    with DashboardProcess(tmp_path / "logs", port=0) as dash:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(_compare_url(dash.url, ids))
        drawn = lambda: len((page.evaluate(CHARTS).get("loss") or {}).get("series", {})) >= 3  # noqa: E731
        wait_for(drawn, 60, "the loss chart")
        lo, hi = page.evaluate(CHARTS)["loss"]["y"]
        assert lo >= 1.0 and hi <= 3.0, (lo, hi)  # the others' 1.2..2.05 fill the chart; 1e6 is a triangle at its edge
        assert "p/spiky off scale" in page.evaluate(CHARTS)["loss"]["series"]
        page.check("#y-all")
        # the chart is drawn again: until its lazy update its y axis has no extent yet ([])
        wait_for(lambda: (page.evaluate(CHARTS)["loss"]["y"] or [0, 0])[1] >= 1e6, 10, "every point in range")

        # the view: smoothing, log scale, x, every point, every config key; kept in the URL
        page.fill("#smoothing", "0.6")
        page.dispatch_event("#smoothing", "input")
        page.check("#logscale")
        page.check("#config-all")
        page.select_option("#xaxis", "elapsed")
        wait_for(lambda: "x=elapsed" in page.evaluate("() => location.hash"), 10, "the view in the URL")
        url = page.evaluate("() => location.hash")
        assert all(k in url for k in ("smoothing=0.6", "log=1", "y=all", "config=all", "runs=p/a,p/spiky,p/b"))
        page.reload()
        wait_for(drawn, 60, "the loss chart again")
        assert page.evaluate("() => location.hash") == url
        assert page.input_value("#smoothing") == "0.6" and page.is_checked("#logscale") and page.is_checked("#y-all")
        assert page.is_checked("#config-all") and page.input_value("#xaxis") == "elapsed"
        shown = page.evaluate(CHARTS)["loss"]
        assert shown["xName"] == "elapsed (m:ss)" and {"p/a (raw)", "p/spiky (raw)", "p/b (raw)"} <= set(shown["series"])
        assert shown["xLabels"][:4] == ["0:00", "0:30", "1:00", "1:30"]  # 150 s in round units
        colours = """() => echarts.getInstanceByDom(document.querySelector('#compare-loss')).getOption().series
          .filter((s) => !s.name.includes('(')).map((s) => [s.name, s.lineStyle.color])"""
        swatches = """() => [...document.querySelectorAll('#summary-table thead th[data-run]')]
          .map((th) => [th.dataset.run, getComputedStyle(th.querySelector('.swatch')).backgroundColor])"""
        by_chart = dict(page.evaluate(colours))
        assert len(set(by_chart.values())) == 3  # one colour per run, the same in the tables
        rgb = lambda hex_: f"rgb({int(hex_[1:3], 16)}, {int(hex_[3:5], 16)}, {int(hex_[5:7], 16)})"  # noqa: E731
        assert {run: rgb(c) for run, c in by_chart.items()} == dict(page.evaluate(swatches))


def test_every_compared_run_is_named_in_full_beside_its_colour_above_the_charts(
    tmp_path: Path, artifacts_dir: Path, browser: Browser
) -> None:
    ids = [f"p/run_20261201_1935{s:02d}" for s in (39, 40, 41, 42)]  # long names that differ only at their end
    t0 = time.time() - 400
    for i, run in enumerate(ids):
        writer = RunWriter(tmp_path / "logs" / run, 0)
        writer.write([{"step": s, "t": t0 + s, "loss": 2 - s / 100 + i / 10, "lr": 1e-3, "grad_norm": 1.0 + i, "step_time": 0.1}
                      for s in range(1, 101)])  # fmt: skip
        writer.close("finished")
    with DashboardProcess(tmp_path / "logs", port=0) as dash:
        page = browser.new_page(viewport={"width": 1400, "height": 600})
        page.goto(_compare_url(dash.url, ids))
        wait_for(lambda: len((page.evaluate(CHARTS).get("loss") or {}).get("series", {})) >= 4, 60, "the loss chart")
        lines = """() => echarts.getInstanceByDom(document.querySelector('#compare-loss')).getOption().series
          .filter((s) => s.type === 'line' && !s.name.includes('(') && !s.name.includes(' off scale'))
          .map((s) => [s.name, s.lineStyle.color])"""
        key = """() => [...document.querySelectorAll('#compare-key [data-run]')].filter((el) => el.offsetParent !== null)
          .map((el) => [el.textContent.trim(), getComputedStyle(el.querySelector('.swatch')).backgroundColor])"""
        rgb = lambda hex_: f"rgb({int(hex_[1:3], 16)}, {int(hex_[3:5], 16)}, {int(hex_[5:7], 16)})"  # noqa: E731
        drawn = {run: rgb(colour) for run, colour in page.evaluate(lines)}
        assert sorted(drawn) == sorted(ids) and len(set(drawn.values())) == 4
        assert dict(page.evaluate(key)) == drawn  # each run in full, in its line's colour: none cut, none scrolled away
        page.evaluate("() => window.scrollTo(0, document.body.scrollHeight)")
        heading = page.evaluate("() => document.querySelector('h3.compare-heading').getBoundingClientRect().bottom")
        top = page.evaluate("() => document.querySelector('#compare-key').getBoundingClientRect().top")
        assert heading < 0 and 0 <= top < 5, (heading, top)  # scrolled past the heading, the key stays in view
        page.evaluate("() => window.scrollTo(0, 0)")
        _look_at(page, artifacts_dir, "compare_key")


def test_the_summaries_numbers_read_as_the_reports_four_significant_digits(tmp_path: Path, browser: Browser) -> None:
    t0 = time.time() - 100
    losses, norms = [3.0, 2.0, 1.234567, 1.5], [15.369388, 8.1, 2.0, 1.0]
    for name in ("a", "b"):
        writer = RunWriter(tmp_path / "logs" / "p" / name, 0)
        pairs = enumerate(zip(losses, norms, strict=True), 1)
        writer.write([{"step": s, "t": t0 + s, "loss": v, "grad_norm": g} for s, (v, g) in pairs])
        writer.close("finished")
    with DashboardProcess(tmp_path / "logs", port=0) as dash:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(_compare_url(dash.url, ["p/a", "p/b"]))
        cell = lambda row: page.inner_text(f'#summary-table tr[data-row="{row}"] td[data-run="p/a"]').strip()  # noqa: E731
        wait_for(lambda: page.query_selector('#summary-table tr[data-row="best_loss"] td'), 30, "the summary")
        best = min(losses)
        assert cell("best_loss") == f"{best:.4g} (step {losses.index(best) + 1})"  # 1.235 (step 3), as the report prints it
        assert cell("final_loss") == f"{losses[-1]:.4g}" and cell("max_grad_norm") == f"{max(norms):.4g}"  # 15.37


def test_the_compared_runs_are_called_by_their_display_names(tmp_path: Path, browser: Browser) -> None:
    from mindwatch.store.notes import write_notes

    t0 = time.time() - 100
    for name in ("run_20261201_193539", "run_20261201_193540"):
        writer = RunWriter(tmp_path / "logs" / "p" / name, 0)
        writer.write([{"step": s, "t": t0 + s, "loss": 2 - s / 100} for s in range(1, 21)])
        writer.close("finished")
    write_notes(tmp_path / "logs" / "p" / "run_20261201_193539", name="baseline lr 3e-4")  # mindwatch rename
    named, plain = "p/run_20261201_193539", "p/run_20261201_193540"
    with DashboardProcess(tmp_path / "logs", port=0) as dash:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(_compare_url(dash.url, [named, plain]))
        wait_for(lambda: len((page.evaluate(CHARTS).get("loss") or {}).get("series", {})) >= 2, 60, "the loss chart")
        # the renamed run by its name (its id beside it, as on the runs page), the other by its id
        head = lambda table, run: page.inner_text(f'#{table} thead th[data-run="{run}"]').strip()  # noqa: E731
        assert head("summary-table", named).startswith("baseline lr 3e-4") and head("summary-table", plain).startswith(plain)
        assert page.inner_text(f'#compare-key [data-run="{named}"]').strip() == f"baseline lr 3e-4 {named}"
        assert page.inner_text(f'#compare-key [data-run="{plain}"]').strip() == plain
        remove = page.query_selector(f'#summary-table th[data-run="{named}"] button.remove-run')
        assert remove.get_attribute("aria-label") == "leave baseline lr 3e-4 out"
        # the charts' lines (their tooltips) too
        assert sorted(page.evaluate(CHARTS)["loss"]["series"]) == sorted(["baseline lr 3e-4", plain])
