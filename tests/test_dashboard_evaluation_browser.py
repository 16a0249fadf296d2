"""In headless Chromium: a run's evaluations on the dashboard. The run page's Evaluation card draws the evaluation
loss beside the training's loss on one axis, its best evaluation marked and the tooltip naming the step and epoch;
every other evaluation metric is a card of points with its own best; the runs table's best-eval column sorts."""

from __future__ import annotations

import math
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from conftest import CHROMIUM
from test_dashboard_browser import wait_for

from mindwatch.serve.process import DashboardProcess
from mindwatch.store.layout import write_json_atomic
from mindwatch.store.writer import RunWriter

if TYPE_CHECKING:
    from playwright.sync_api import Browser

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason="Debian's chromium is not installed (scripts/setup.sh)"),
]

STEPS, EVERY = 100, 20
#: run -> its evaluations after steps 20, 40, ... 100: (eval/loss, eval/accuracy).
EVALS = {
    "a": [(1.9, 0.40), (1.2, 0.60), (0.9, 0.70), (0.95, 0.72), (1.0, 0.71)],
    "b": [(1.5, 0.50), (1.1, 0.65), (0.8, 0.75), (0.85, 0.70), (0.9, 0.71)],
    "c": [(2.5, 0.30), (2.0, 0.35), (1.7, 0.50), (1.6, 0.52), (1.65, 0.50)],
}

CARD = """(id) => {
  const el = document.getElementById(id);
  const c = el && echarts.getInstanceByDom(el);
  if (!c || !c.getOption().series.some((s) => s.markPoint)) return null;  // drawn once its points came
  const o = c.getOption();
  return {title: o.title[0].text, axes: o.yAxis.length,
          series: o.series.map((s) => ({name: s.name, symbols: s.showSymbol, data: s.data.filter((p) => p[1] !== '-'),
                                        marks: ((s.markPoint || {}).data || []).map((m) => ({at: m.coord, name: m.name}))}))};
}"""


def train_loss(step: int) -> float:
    return 2.5 * math.exp(-step / 40) + 0.1 * math.sin(step)


def write_run(logs: Path, name: str, t0: float) -> None:
    """100 train steps, 20 a epoch, an evaluation after each epoch's last step (the record after the step's own)."""
    run_dir = logs / "p" / name
    run_dir.mkdir(parents=True)
    write_json_atomic(run_dir / "meta.json", {"run_id": name, "project": "p", "started_at": t0})
    writer, records = RunWriter(run_dir, 0), []
    for step in range(1, STEPS + 1):
        epoch = (step - 1) // EVERY + 1
        records.append({"step": step, "t": t0 + step, "epoch": epoch, "loss": train_loss(step)})
        if step % EVERY == 0:
            loss, accuracy = EVALS[name][step // EVERY - 1]
            records.append({"step": step, "t": t0 + step + 0.5, "epoch": epoch, "eval/loss": loss, "eval/accuracy": accuracy})
    writer.write(records)
    writer.close("finished")


def best(name: str, i: int, better) -> tuple[int, float]:  # noqa: ANN001
    """(step, value) of the best of EVALS[name]'s i-th result, the first of equals."""
    values = [e[i] for e in EVALS[name]]
    at = values.index(better(values))
    return (at + 1) * EVERY, values[at]


def test_the_evaluation_card_draws_both_curves_on_one_axis_with_the_best_marked(
    tmp_path: Path, artifacts_dir: Path, browser: Browser
) -> None:
    write_run(tmp_path / "logs", "a", time.time() - 600)
    with DashboardProcess(tmp_path / "logs", port=0) as dash:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{dash.url}#/run/p%2Fa?smoothing=0.6")
        card = wait_for(lambda: page.evaluate(CARD, "chart-evaluation"), 60, "the Evaluation card")
        assert card["title"] == "Evaluation" and card["axes"] == 1
        series = {s["name"]: s for s in card["series"]}
        assert set(series) == {"loss", "loss (raw)", "eval/loss"}  # the training's loss smoothed, as on the loss card
        assert [p[1] for p in series["loss (raw)"]["data"]] == [train_loss(s) for s in range(1, STEPS + 1)]
        evals = series["eval/loss"]
        assert evals["symbols"] and evals["data"] == [[(i + 1) * EVERY, e[0]] for i, e in enumerate(EVALS["a"])]
        step, value = best("a", 0, min)
        assert [m["at"] for m in evals["marks"]] == [[step, value]]
        assert "epoch 3" in evals["marks"][0]["name"] and step == 60
        # the tooltip at the best evaluation names its step and its epoch
        page.evaluate(
            """() => echarts.getInstanceByDom(document.getElementById('chart-evaluation'))
                 .dispatchAction({type: 'showTip', seriesIndex: 2, dataIndex: 2})"""
        )
        tip = wait_for(
            lambda: page.evaluate(
                "() => [...document.querySelectorAll('#chart-evaluation div')].map((d) => d.innerText).join('|')"
            ),
            10,
            "the tooltip",
        )
        assert f"step {step} · epoch 3" in tip and f"eval/loss: {value}" in tip, tip
        # every other evaluation metric: a card of its own, points, its best (the highest) marked; eval/loss drawn once
        accuracy = wait_for(lambda: page.evaluate(CARD, "chart-eval/accuracy"), 30, "the eval/accuracy card")
        (points,) = accuracy["series"]
        assert points["symbols"] and [m["at"] for m in points["marks"]] == [list(best("a", 1, max))]
        assert page.evaluate("() => document.getElementById('chart-eval/loss')") is None
        on_loss_card = (
            "() => echarts.getInstanceByDom(document.getElementById('chart-loss')).getOption().series.map((s) => s.name)"
        )
        assert set(page.evaluate(on_loss_card)) == {"loss", "loss (raw)"}  # the loss card stays as it is
        page.screenshot(path=str(artifacts_dir / "run_page_evaluation.png"), full_page=True)


def test_the_runs_tables_best_eval_column_names_its_metric_and_sorts(tmp_path: Path, browser: Browser) -> None:
    t0 = time.time() - 600
    for i, name in enumerate(EVALS):
        write_run(tmp_path / "logs", name, t0 + 10 * i)
    bests = {name: best(name, 0, min)[1] for name in EVALS}  # 0.9, 0.8, 1.6
    with DashboardProcess(tmp_path / "logs", port=0) as dash:
        page = browser.new_page(viewport={"width": 1400, "height": 800})
        page.goto(dash.url)
        page.wait_for_selector('tr[data-run="p/c"] td[data-column="best_eval"]', timeout=30_000)
        cell = page.inner_text('tr[data-run="p/a"] td[data-column="best_eval"]')
        assert cell.split() == [f"{bests['a']:g}", "eval/loss"]
        assert page.inner_text('th[data-column="best_eval"] button.sort') == "best eval"

        def order() -> list[str]:
            return page.evaluate("() => [...document.querySelectorAll('#runs-table tbody tr')].map((tr) => tr.dataset.run)")

        page.click('th[data-column="best_eval"] button.sort')
        up = sorted(EVALS, key=bests.__getitem__)
        wait_for(lambda: order() == [f"p/{n}" for n in up], 20, f"the runs by best eval, {up}")
        assert "sort=best_eval" in page.evaluate("() => location.hash")
        page.click('th[data-column="best_eval"] button.sort')
        wait_for(lambda: order() == [f"p/{n}" for n in reversed(up)], 20, "the runs by best eval, descending")
        assert "sort=-best_eval" in page.evaluate("() => location.hash")


def test_the_compare_page_overlays_each_runs_evaluations_as_points_with_its_best(tmp_path: Path, browser: Browser) -> None:
    t0 = time.time() - 600
    for i, name in enumerate(("a", "b")):
        write_run(tmp_path / "logs", name, t0 + 10 * i)
    with DashboardProcess(tmp_path / "logs", port=0) as dash:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{dash.url}#/compare?runs=p/a,p/b&y=all")  # every point on the axis: no off-scale marks
        for metric, i, better in (("eval/loss", 0, min), ("eval/accuracy", 1, max)):
            chart = wait_for(lambda m=metric: page.evaluate(CARD, f"compare-{m}"), 60, f"the {metric} chart")
            assert [s["name"] for s in chart["series"]] == ["p/a", "p/b"]
            for s, run in zip(chart["series"], ("a", "b"), strict=True):
                assert s["symbols"] and s["data"] == [[(k + 1) * EVERY, e[i]] for k, e in enumerate(EVALS[run])]
                assert [m["at"] for m in s["marks"]] == [list(best(run, i, better))], (metric, run)
        row = page.inner_text('#summary-table tr[data-row="best_eval"]')
        assert "best eval" in row and "0.9 (eval/loss, step 60)" in row and "0.8 (eval/loss, step 60)" in row


def test_a_new_best_evaluation_moves_the_mark_while_the_page_is_open(tmp_path: Path, browser: Browser) -> None:
    run_dir = tmp_path / "logs" / "p" / "live"
    run_dir.mkdir(parents=True)
    t0 = time.time() - 60
    write_json_atomic(run_dir / "meta.json", {"run_id": "live", "project": "p", "started_at": t0})
    writer = RunWriter(run_dir, 0, flush_secs=0.2)
    writer.write([{"step": s, "t": t0 + s, "epoch": 1, "loss": train_loss(s)} for s in range(1, 21)])
    writer.write([{"step": 20, "t": t0 + 20.5, "epoch": 1, "eval/loss": 1.5}])
    writer.flush()
    with DashboardProcess(tmp_path / "logs", port=0) as dash:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{dash.url}#/run/p%2Flive")

        def marked() -> list:
            card = page.evaluate(CARD, "chart-evaluation") or {"series": []}
            return [m["at"] for s in card["series"] if s["name"] == "eval/loss" for m in s["marks"]]

        wait_for(lambda: marked() == [[20, 1.5]], 60, "the first evaluation marked")
        writer.write([{"step": s, "t": time.time(), "epoch": 2, "loss": train_loss(s)} for s in range(21, 41)])
        writer.write([{"step": 40, "t": time.time(), "epoch": 2, "eval/loss": 1.1}])
        writer.flush()
        wait_for(lambda: marked() == [[40, 1.1]], 30, "the new best marked, without a reload")
        writer.close("finished")
