"""The report's Evaluation section on a real loop that evaluates as it trains: the chart draws the evaluation loss
beside the training's loss with the best marked, and the table holds every evaluation the training handed over."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from conftest import CHROMIUM
from mindspore import nn
from test_report import open_page, raw_records, report_data

import mindwatch.mindspore as mw
from mindwatch.demo.train import set_mode
from mindwatch.demo.tutorial_step import jit_train_step
from mindwatch.report.html import render_report, write_report
from mindwatch.store.reader import open_run

FEATURES, BATCH, STEPS, EVAL_EVERY = 8, 16, 24, 4


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    """A loop of our own: a small regression, evaluated on a held-out set every 4 steps (its MSE and the share of it
    within 0.5 of the target), as a person's loop calls ``run.eval``. Returns the run directory and what it handed over."""
    set_mode("pynative")
    ms.set_seed(0)
    net = nn.SequentialCell(nn.Dense(FEATURES, 16), nn.ReLU(), nn.Dense(16, 1))
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.02, momentum=0.9)
    step = jit_train_step(nn.WithLossCell(net, nn.MSELoss()), opt)
    rng = np.random.default_rng(0)
    held_x = rng.normal(size=(128, FEATURES)).astype(np.float32)
    held_y = held_x.sum(axis=1, keepdims=True)
    handed: list[dict] = []
    config = {"save_dir": str(tmp_path_factory.mktemp("runs")), "project": "p", "run_name": "evaluated"}
    with mw.start_run(config, network=net, optimizer=opt) as run:
        for i in range(1, STEPS + 1):
            x = rng.normal(size=(BATCH, FEATURES)).astype(np.float32)
            loss, grads = step(ms.Tensor(x), ms.Tensor(x.sum(axis=1, keepdims=True)))
            run.step(loss=loss, grads=grads)
            if i % EVAL_EVERY == 0:
                error = net(ms.Tensor(held_x)).asnumpy() - held_y
                results = {"loss": float((error**2).mean()), "accuracy": float((np.abs(error) < 0.5).mean())}
                # a result that is not a scalar: the signs of target and prediction, counted (a 2 x 2 confusion matrix)
                positive = held_y.reshape(-1) > 0, (error + held_y).reshape(-1) > 0
                confusion = [[int(((positive[0] == a) & (positive[1] == b)).sum()) for b in (False, True)] for a in (False, True)]
                run.eval(**results, confusion=np.array(confusion), epoch=i // EVAL_EVERY, eval_time=0.01)
                handed.append({"step": i, "epoch": i // EVAL_EVERY, **results, "confusion": confusion})
    return Path(run.run_dir), handed


def number(text: str) -> float:
    return float(text.replace(",", ""))


def test_the_reports_evaluation_table_holds_every_evaluation_the_training_handed_over(evaluated) -> None:
    run_dir, handed = evaluated
    html = render_report([open_run(run_dir)])
    assert "<h2>Evaluation</h2>" in html
    table = re.search(r'<table id="evaluations"[^>]*>(.*?)</table>', html, re.S).group(1)
    head = re.findall(r"<th>(.*?)</th>", table)
    assert head == ["step", "epoch", "eval/loss", "eval/accuracy", "from best (eval/loss)"]  # the primary first
    rows = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in re.findall(r"<tr[^>]*>(.*?)</tr>", table.split("</thead>")[1])]
    best = min(handed, key=lambda e: e["loss"])
    assert len(rows) == len(handed) == STEPS // EVAL_EVERY
    for cells, given in zip(rows, handed, strict=True):
        step, epoch, loss, accuracy, behind = map(number, cells)
        assert (step, epoch) == (given["step"], given["epoch"])
        assert loss == pytest.approx(given["loss"], rel=5e-4) and accuracy == pytest.approx(given["accuracy"], rel=5e-4)
        assert behind == pytest.approx(given["loss"] - best["loss"], rel=5e-4, abs=1e-9)  # 4 significant digits
    assert f'<tr class="best" data-step="{best["step"]}">' in table
    caption = f"best eval/loss {rows[handed.index(best)][2]} at step {best['step']}, epoch {best['epoch']} (lower is better)"
    assert caption in html

    # the chart: the training's loss as the metrics file holds it, the evaluations as handed over, the best marked
    (chart,) = report_data(html)["evaluation"]
    loss, evals = chart["series"]
    train = [(r["step"], r["loss"]) for r in raw_records(run_dir) if "loss" in r]
    assert (loss["label"], [tuple(p) for p in loss["points"]]) == ("loss", train)
    assert evals["label"] == "eval/loss" and evals["marker"]
    assert evals["points"] == [[e["step"], pytest.approx(e["loss"], rel=1e-6)] for e in handed]
    assert (evals["best"]["step"], evals["best"]["epoch"]) == (best["step"], best["epoch"])
    assert evals["best"]["value"] == pytest.approx(best["loss"], rel=1e-6)
    # every other evaluation metric is a chart of points among the curves, its best (the highest accuracy) marked; the
    # evaluation loss is drawn once, in the Evaluation chart
    curves = report_data(html)["metrics"]
    assert "eval/loss" not in [m["name"] for m in curves] and "loss" in [m["name"] for m in curves]
    (accuracy,) = [m for m in curves if m["name"] == "eval/accuracy"]
    top = max(handed, key=lambda e: e["accuracy"])
    assert accuracy["marker"] and accuracy["series"][0]["best"]["step"] == top["step"]


def test_a_result_that_is_not_a_scalar_is_shown_as_a_table_of_its_last_evaluation(evaluated) -> None:
    run_dir, handed = evaluated
    html = render_report([open_run(run_dir)])
    last = handed[-1]
    assert f"confusion at the evaluation after step {last['step']}, epoch {last['epoch']}" in html
    table = re.search(r'<table class="result-table"[^>]*data-result="confusion">(.*?)</table>', html, re.S).group(1)
    rows = [re.findall(r'<td class="num">(.*?)</td>', row) for row in re.findall(r"<tr>(.*?)</tr>", table.split("</thead>")[1])]
    assert [[number(c) for c in row] for row in rows] == last["confusion"]
    assert "eval/confusion" not in open_run(run_dir).metrics  # a table, not a curve


@pytest.mark.slow
@pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason="Debian's chromium is not installed (scripts/setup.sh)")
def test_the_reports_evaluation_chart_marks_the_best_evaluation(evaluated, browser, tmp_path: Path, artifacts_dir: Path) -> None:
    run_dir, handed = evaluated
    path = write_report([run_dir], tmp_path / "report.html")[0]
    page, problems, requests = open_page(browser, path)
    drawn = page.evaluate(
        """() => {
          const o = echarts.getInstanceByDom(document.querySelector('#chart-evaluation-0')).getOption();
          return o.series.map((s) => ({name: s.name, symbols: s.showSymbol, data: s.data,
                                        best: s.markPoint && s.markPoint.data.map((p) => p.coord)}));
        }"""
    )
    page.screenshot(path=str(artifacts_dir / "report_evaluation.png"), full_page=True)
    evals = next(s for s in drawn if s["name"] == "eval/loss")
    best = min(handed, key=lambda e: e["loss"])
    assert evals["symbols"] and [p[0] for p in evals["data"]] == [e["step"] for e in handed]
    assert evals["best"] == [[best["step"], pytest.approx(best["loss"], rel=1e-6)]]
    assert any(s["name"] == "loss" for s in drawn)
    assert not problems and not requests
