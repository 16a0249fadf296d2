"""``mindwatch report`` on real trainings (finished, failed, killed), opened in headless Chromium."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import mindwatch
from mindwatch.analysis.bands import counted_values
from mindwatch.cli import main
from mindwatch.store.writer import RunWriter


def raw_records(run_dir: Path, rank: int = 0) -> list[dict]:
    """The metrics file read independently of mindwatch (json + the store's 'nan' strings)."""
    out = []
    for line in (run_dir / f"metrics.rank{rank}.jsonl").read_text().splitlines():
        rec = json.loads(line)
        out.append({k: (float(v) if isinstance(v, str) else v) for k, v in rec.items()})
    return out


def raw_alerts(run_dir: Path) -> list[dict]:
    p = run_dir / "alerts.jsonl"
    return [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []


def report_data(html: str) -> dict:
    m = re.search(r'<script id="mindwatch-data" type="application/json">(.*?)</script>', html, re.S)
    assert m, "no embedded data"
    return json.loads(m.group(1))


def open_page(browser, html_path: Path):
    """Open the report offline (every request but the file itself is refused and counted)."""
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    requests: list[str] = []

    def route(r):
        if r.request.url == html_path.resolve().as_uri():
            r.continue_()
        else:
            requests.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.goto(html_path.resolve().as_uri())
    page.wait_for_function("document.readyState === 'complete'", timeout=30_000)  # the inline module has run
    return page, problems, requests


# What the page shows: the charts ECharts drew, and the boxes that say a chart failed.
CHARTS_SHOWN = """() => {
  const boxes = Array.from(document.querySelectorAll('.chart'));
  return {
    charts: boxes.filter((el) => echarts.getInstanceByDom(el)).length,
    errors: boxes.filter((el) => el.textContent.startsWith('chart failed')).map((el) => el.textContent),
  };
}"""


def canvas_ink(page) -> list[int]:
    """Non-transparent pixels of each chart canvas (0 means an empty chart)."""
    return page.evaluate(
        """() => Array.from(document.querySelectorAll('.chart canvas')).map(c => {
            const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
            let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++; return n; })"""
    )


def summary_cell(page, key: str) -> str:
    return page.inner_text(f'#summary tr[data-key="{key}"] td').strip()


@pytest.mark.parametrize("kind", ["finished", "failed", "killed"])
def test_report_of_a_real_run(kind: str, report_runs, browser, tmp_path: Path, artifacts_dir: Path) -> None:
    run_dir = report_runs[kind]
    out = tmp_path / f"report-{kind}.html"
    assert main(["report", str(run_dir), "-o", str(out)]) == 0
    html = out.read_text()
    assert "<script src" not in html and "<link" not in html  # self-contained

    page, problems, requests = open_page(browser, out)
    state = page.evaluate(CHARTS_SHOWN)
    assert state["errors"] == [] and problems == [] and requests == []
    data = report_data(html)
    names = [m["name"] for m in data["metrics"]]
    assert {"loss", "lr", "grad_norm", "step_time", "samples_per_second"} <= set(names)
    ink = canvas_ink(page)
    expected_charts = len(names) + 1 + (1 if data["heatmap"] else 0) + (1 if data["alerts"]["series"] else 0)
    expected_charts += 1 if data["weights"] else 0
    assert state["charts"] == expected_charts
    assert len(ink) >= expected_charts and min(ink) > 300, ink  # every canvas drew something
    page.screenshot(path=str(artifacts_dir / f"report-{kind}.png"), full_page=True)
    (artifacts_dir / f"report-{kind}.html").write_text(html)

    # the summary says what the files say
    recs = raw_records(run_dir)
    status = json.loads((run_dir / "status.rank0.json").read_text())
    losses = [r["loss"] for r in recs]
    finite = [v for v in losses if math.isfinite(v)]
    last, planned = recs[-1]["step"], {"finished": 16, "failed": 40, "killed": 5000}[kind]  # tests/scripts/report_training.py
    assert summary_cell(page, "steps") == f"{last:,}/{planned:,} ({100 * last // planned} %)"
    assert summary_cell(page, "records") == str(len(recs))
    assert summary_cell(page, "ranks") == "1"  # the number of ranks, not the last rank's index
    # numbers read with 4 significant digits
    assert float(summary_cell(page, "final loss")) == pytest.approx(losses[-1], rel=5e-4, nan_ok=True)
    best = summary_cell(page, "best loss")
    assert float(best.split()[0]) == pytest.approx(min(finite), rel=5e-4)
    assert f"(step {recs[losses.index(min(finite))]['step']})" in best
    norms = [r["grad_norm"] for r in recs]
    max_norm = summary_cell(page, "max grad norm").split()[0]
    # the largest finite norm (issue 22: a NaN norm is the non-finite rule's, not the maximum)
    assert float(max_norm) == pytest.approx(max(v for v in norms if math.isfinite(v)), rel=5e-4)
    sps = [r["samples_per_second"] for r in recs[1:]]
    p50, p5 = (float(x.replace(",", "")) for x in summary_cell(page, "samples/s p50 / p5").split(" / "))
    assert p50 == pytest.approx(float(np.percentile(sps, 50)), rel=5e-4)
    assert p5 == pytest.approx(float(np.percentile(sps, 5)), rel=5e-4)
    share = sum(r["data_time"] for r in recs[1:]) / sum(r["step_time"] for r in recs[1:])
    assert summary_cell(page, "data-wait share") == f"{100 * share:.1f} %"
    alerts = raw_alerts(run_dir)
    n_errors = sum(a["severity"] == "error" for a in alerts)
    assert f"error {n_errors}" in summary_cell(page, "alerts")
    assert f"kind={kind}" in summary_cell(page, "tags")
    assert len(page.query_selector_all("#alerts tbody tr")) == len(alerts)
    config = page.inner_text("pre.config")
    assert '"project": "report-tests"' in config and "final(loss) < first(loss)" in config

    state_text = summary_cell(page, "state")
    if kind == "finished":
        assert state_text == "finished" == status["state"]
        assert data["heatmap"] and data["heatmap"]["layers"]  # PyNative records attention entropy
        assert page.query_selector(".banner") is None
    elif kind == "failed":
        assert state_text == "failed"
        assert "corrupt shard" in page.inner_text(".banner.banner-failed")
        first_nan = next(r["step"] for r in recs if math.isnan(r["loss"]))
        assert summary_cell(page, "loss non-finite from") == str(first_nan)
        loss_chart = next(m for m in data["metrics"] if m["name"] == "loss")
        assert loss_chart["series"][0]["nonfinite"][0] == [first_nan, "nan"]
    else:
        assert state_text in ("running", "stale")  # no final state: the heartbeat just stops
        assert status["state"] == "running" and recs[-1]["step"] >= 8
        assert page.query_selector(".banner") is not None
    page.close()


def test_compare_and_pdf(report_runs, browser, tmp_path: Path, artifacts_dir: Path) -> None:
    out = tmp_path / "compare.html"
    code = main(["report", str(report_runs["finished"]), "--compare", str(report_runs["failed"]), "-o", str(out), "--pdf"])
    assert code == 0
    data = report_data(out.read_text())
    loss = next(m for m in data["metrics"] if m["name"] == "loss")
    assert [s["label"] for s in loss["series"]] == ["finished", "failed"]
    page, problems, _ = open_page(browser, out)
    assert problems == []
    assert page.inner_text("#summary thead").split() == ["finished", "failed"]
    assert page.evaluate("document.querySelectorAll('#curves .chart canvas').length") >= len(data["metrics"])
    page.screenshot(path=str(artifacts_dir / "report-compare.png"), full_page=True)
    page.close()
    pdf = out.with_suffix(".pdf").read_bytes()
    assert pdf.startswith(b"%PDF") and len(pdf) > 20_000
    assert len(re.findall(rb"/Type\s*/Page[^s]", pdf)) >= 2
    (artifacts_dir / "report-compare.pdf").write_bytes(pdf)


def test_long_run_is_thinned_but_keeps_spikes(tmp_path: Path) -> None:
    run_dir = tmp_path / "long"
    writer = RunWriter(run_dir)
    n, spike = 100_000, 61_234
    t0 = time.time()
    loss = 2 + np.sin(np.arange(n) / 500.0) * 0.1
    loss[spike] = 50.0
    loss[70_000] = np.nan
    for start in range(0, n, 10_000):
        writer.write([{"step": i + 1, "t": t0 + i, "loss": float(loss[i])} for i in range(start, start + 10_000)])
    writer.close("finished")
    out = tmp_path / "long.html"
    assert main(["report", str(run_dir), "-o", str(out)]) == 0
    chart = report_data(out.read_text())["metrics"][0]
    points = chart["series"][0]["points"]
    assert len(points) <= 2100
    assert [spike + 1, 50.0] in points  # the one-step spike survives thinning
    assert [70_001, None] in points and chart["series"][0]["nonfinite"] == [[70_001, "nan"]]
    assert "thinned" in chart["points_note"]


def test_report_needs_no_mindspore(report_runs, tmp_path: Path) -> None:
    """report, check, export, runs and tail on a machine without MindSpore: none of them imports it."""
    run = str(report_runs["finished"])
    code = f"""
import sys
from mindwatch.cli import main
sys.modules['mindspore'] = None  # any import of mindspore now fails
assert main(['report', {run!r}, '-o', {str(tmp_path / "r.html")!r}]) == 0
assert main(['check', {run!r}, '--rule', 'final(loss) < first(loss)']) == 0
assert main(['export', {run!r}, '--format', 'csv', '-o', {str(tmp_path / "m.csv")!r}]) == 0
assert main(['runs', {str(Path(run).parent)!r}]) == 0
assert main(['tail', {run!r}, '--once']) == 0
print('NO MINDSPORE OK')
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "NO MINDSPORE OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]


def test_report_of_a_run_with_no_records_yet(browser, tmp_path: Path) -> None:
    run_dir = tmp_path / "proj" / "just-started"
    RunWriter(run_dir)  # status says running; no metrics yet
    out = tmp_path / "empty.html"
    assert main(["report", str(run_dir), "-o", str(out)]) == 0
    page, problems, _ = open_page(browser, out)
    assert problems == [] and page.evaluate(CHARTS_SHOWN)["errors"] == []
    assert "no metrics recorded yet" in page.inner_text("main")
    assert summary_cell(page, "state") == "running" and summary_cell(page, "steps") == "-"
    assert "still running" in page.inner_text(".banner.banner-running")
    page.close()
    assert main(["report", str(tmp_path / "nope"), "-o", str(out)]) == 2


def test_two_ranks_are_drawn_and_summarised_per_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "proj" / "dp"
    t0 = time.time()
    for rank in (0, 1):
        w = RunWriter(run_dir, rank=rank)
        w.write(
            [
                {"step": s, "t": t0 + s, "loss": 3.0 - s / 10 + rank, "grad_norm": 100.0 if (rank, s) == (1, 7) else 1.0}
                for s in range(1, 11)
            ]
        )
        w.close("finished")
    out = tmp_path / "dp.html"
    assert main(["report", str(run_dir), "-o", str(out)]) == 0
    html = out.read_text()
    data = report_data(html)
    loss = next(m for m in data["metrics"] if m["name"] == "loss")
    assert [s["label"] for s in loss["series"]] == ["rank 0", "rank 1"]
    assert loss["series"][1]["points"][0] == [1, pytest.approx(3.9)]
    assert data["step_range"] == [1, 10]
    assert sum(data["histogram"]["series"][0]["counts"]) == 10  # grad_norm is the same on every rank: rank 0's
    assert re.search(r'data-key="max grad norm"><th>max grad norm</th><td class="num">100 \(step 7\)</td>', html)
    assert re.search(r'data-key="final loss"><th>final loss</th><td class="num">2</td>', html)  # the lowest rank's


def test_the_gradient_norm_distribution_of_two_ranks_counts_each_step_once(tmp_path: Path) -> None:
    run_dir = tmp_path / "proj" / "dp"
    norms = np.exp(np.random.default_rng(0).normal(0.0, 0.3, 300))
    t0 = time.time()
    for rank in (0, 1):  # the all-reduce gives every rank the same norm; the loss and the step time are each rank's
        w = RunWriter(run_dir, rank=rank)
        w.write(
            [
                {"step": s, "t": t0 + s, "grad_norm": float(g), "loss": 3.0 - s / 300 + rank, "step_time": 0.1 + rank}
                for s, g in enumerate(norms, start=1)
            ]
        )
        w.close("finished")
    out = tmp_path / "dp.html"
    assert main(["report", str(run_dir), "-o", str(out)]) == 0
    hist = report_data(out.read_text())["histogram"]
    reference, _ = np.histogram(norms, bins=np.geomspace(norms.min(), norms.max(), 31))
    assert hist["series"][0]["counts"] == reference.tolist() and sum(hist["series"][0]["counts"]) == 300
    assert hist["note"].startswith("300 values, one rank's: the same on every rank")
    step_times, ranks = counted_values(mindwatch.open_run(run_dir), "step_time")
    assert ranks == [0, 1] and len(step_times) == 600  # a rank's own time: every rank's counts


def test_names_and_messages_cannot_inject_html(browser, tmp_path: Path) -> None:
    evil = "<img src=x onerror=window.pwned=1>"
    run_dir = tmp_path / "proj" / "evil"
    w = RunWriter(run_dir)
    w.write([{"step": s, "t": time.time(), "loss": 1.0, f"attention_entropy/{evil}": 1.0 + s} for s in range(1, 5)])
    w.append_alert({"t": time.time(), "step": 2, "rank": 0, "rule": evil, "severity": "error", "message": "</script>" + evil})
    w.close("failed", error="</script><script>window.pwned=1</script>")
    from mindwatch.store.layout import write_json_atomic

    write_json_atomic(run_dir / "meta.json", {"run_id": "evil", "tags": {"x": "</script>" + evil}, "config": {"k": evil}})
    out = tmp_path / "evil.html"
    assert main(["report", str(run_dir), "-o", str(out)]) == 0
    page, problems, requests = open_page(browser, out)
    for chart in ("chart-attention-entropy", "chart-alerts"):  # show each tooltip that carries a name or message
        page.evaluate(
            f"echarts.getInstanceByDom(document.getElementById('{chart}')).dispatchAction("
            "{type: 'showTip', seriesIndex: 0, dataIndex: 0})"
        )
        page.wait_for_selector(f"#{chart} div:has-text('step')", timeout=5000)
    page.wait_for_timeout(300)
    assert page.evaluate("window.pwned") is None
    assert problems == [] and requests == []  # no <img src=x> was ever requested
    assert evil in page.inner_text("#alerts") and evil in page.inner_text("pre.config")
    page.close()


def test_report_and_dashboard_show_the_same_heat_map(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    from mindwatch.report.html import MAX_HEATMAP_STEPS
    from mindwatch.serve.app import create_app

    run_dir = tmp_path / "logs" / "proj" / "entropy"
    w = RunWriter(run_dir)
    steps = range(5, 5001, 5)  # recorded every 5 steps: more samples than the report has buckets
    w.write([{"step": s, "t": time.time(), **{f"attention_entropy/{k}": k + s / 1000 for k in (0, 2, 10)}} for s in steps])
    w.close("finished")
    out = tmp_path / "entropy.html"
    assert main(["report", str(run_dir), "-o", str(out)]) == 0
    report = report_data(out.read_text())["heatmap"]
    with TestClient(create_app(tmp_path / "logs")) as c:
        params = {"run": "proj/entropy", "buckets": MAX_HEATMAP_STEPS}
        dashboard = c.get("/api/heatmap", params=params).json()
    assert report["layers"] == ["0", "2", "10"] and dashboard["layers"] == ["attention_entropy/" + k for k in report["layers"]]
    assert report["steps"] == dashboard["steps"] and report["values"] == dashboard["values"]
    assert len(report["steps"]) == MAX_HEATMAP_STEPS and "mean of each of 300 step buckets" in report["note"]


def test_numbers_read_in_significant_digits() -> None:
    from mindwatch.units import format_change, format_number, format_times

    written = {
        -236670.4: "-236,700",
        811638936.0: "8.116e8",
        0.00312345: "0.003123",
        2.312345: "2.312",
        1e-4: "1e-4",
        0.5: "0.5",
        1234.5: "1,234",
        0.0: "0",
        1200: "1,200",
        float("nan"): "nan",
        None: "-",
    }
    assert {v if v == v else "nan": format_number(v) for v in written} == {
        v if v == v else "nan": text for v, text in written.items()
    }
    assert format_times(8116389.4) == "8.1 million times" and format_times(12.7) == "13 times"
    assert format_change(0.35) == "+35 %" and format_change(-0.2) == "-20 %" and format_change(8116388.4) == "8.1 million times"


def test_gradient_norm_distribution_has_log_bins_and_few_labels(browser, tmp_path: Path, artifacts_dir: Path) -> None:
    run_dir = tmp_path / "proj" / "outlier"
    rng = np.random.default_rng(0)
    norms = np.exp(rng.normal(0.0, 0.2, 300))
    norms[150] = 50.0  # one outlier: on linear bins every other norm would fall in the first bar
    w = RunWriter(run_dir)
    w.write([{"step": i + 1, "t": time.time(), "grad_norm": float(v)} for i, v in enumerate(norms)])
    w.close("finished")
    out = tmp_path / "outlier.html"
    assert main(["report", str(run_dir), "-o", str(out)]) == 0
    hist = report_data(out.read_text())["histogram"]
    reference, _ = np.histogram(norms, bins=np.geomspace(norms.min(), norms.max(), 31))
    assert hist["log"] and hist["series"][0]["counts"] == reference.tolist()
    assert max(reference) < 0.5 * len(norms)  # the bulk spreads over several bars
    shown = [label for label in hist["labels"] if label]
    assert 3 <= len(shown) <= 6 and len(set(shown)) == len(shown) and max(map(len, shown)) <= 5, shown
    assert len(hist["ranges"]) == 30 and "–" in hist["ranges"][0]
    page, problems, _ = open_page(browser, out)
    assert problems == []
    axis = page.evaluate(
        "() => echarts.getInstanceByDom(document.getElementById('chart-grad-norm-histogram')).getOption().xAxis[0]"
    )
    assert axis["name"] == "grad_norm (log bins)"
    page.locator("#chart-grad-norm-histogram").screenshot(path=str(artifacts_dir / "report-grad-norm-histogram.png"))
    page.close()


def test_alert_numbers_and_the_stop_reason_read_in_words(browser, tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    from mindwatch.serve.app import create_app

    run_dir = tmp_path / "logs" / "proj" / "stopped"
    w = RunWriter(run_dir)
    w.write([{"step": s, "t": time.time(), "loss": 2.0} for s in range(1, 31)])
    message = "loss is diverging: up 7.554e5 (8.1 million times the window's median) over the last 50 recorded steps"
    w.append_alert(
        {"t": time.time(), "step": 30, "rank": 0, "rule": "divergence", "severity": "error", "metric": "loss",
         "value": 811638936.0, "threshold": -236670.4, "message": message, "actions": ["stop"]}
    )  # fmt: skip
    w.close("stopped", reason=f"stopped by mindwatch: {message}")
    out = tmp_path / "stopped.html"
    assert main(["report", str(run_dir), "-o", str(out)]) == 0
    page, problems, _ = open_page(browser, out)
    assert problems == []
    cells = page.eval_on_selector_all("#alerts tbody td", "tds => tds.map((td) => td.textContent)")
    assert "8.116e8" in cells and "-236,700" in cells
    banner = page.inner_text(".banner.banner-stopped")
    assert banner == f"stopped: Stopped at step 30 by mindwatch: {message}."
    page.close()
    with TestClient(create_app(tmp_path / "logs")) as c:  # the dashboard's banner: the same sentence
        status = c.get("/api/run", params={"run": "proj/stopped"}).json()["status"]
    assert status["banner"] == banner.removeprefix("stopped: ")


# Every canvas of every chart inside its chart's box (a print style that unpins ECharts' layers draws them below it).
CANVASES_OUTSIDE = """() => Array.from(document.querySelectorAll('.chart')).flatMap((box) => {
  const b = box.getBoundingClientRect();
  return Array.from(box.querySelectorAll('canvas')).filter((c) => {
    const r = c.getBoundingClientRect();
    return r.width === 0 || r.top < b.top - 1 || r.bottom > b.bottom + 1 || r.left < b.left - 1 || r.right > b.right + 1;
  }).map(() => box.id);
})"""
SLIDERS = """() => Array.from(document.querySelectorAll('.chart')).filter((el) => {
  const c = echarts.getInstanceByDom(el);
  return c && (c.getOption().dataZoom || []).some((z) => z.type === 'slider');
}).map((el) => el.id)"""


def test_pdf_packs_the_charts_inside_their_frames_without_sliders(
    report_runs, browser, tmp_path: Path, artifacts_dir: Path
) -> None:
    out = tmp_path / "paper.html"
    assert main(["report", str(report_runs["finished"]), "-o", str(out), "--pdf"]) == 0
    pdf = out.with_suffix(".pdf").read_bytes()
    pages = len(re.findall(rb"/Type\s*/Page[^s]", pdf))
    (artifacts_dir / "report-finished.pdf").write_bytes(pdf)
    data = report_data(out.read_text())
    charts = len(data["metrics"]) + 1 + (1 if data["heatmap"] else 0) + (1 if data["alerts"]["series"] else 0)
    charts += 1 if data["weights"] else 0
    assert charts >= 10 and pages <= 5, pages  # two charts a row, not a page per chart

    # the page as the PDF printer lays it out (report.html#print, print media, the A4 column's width)
    page = browser.new_page(viewport={"width": 794, "height": 1123})
    page.emulate_media(media="print")
    page.goto(out.resolve().as_uri() + "#print")
    page.wait_for_function("document.readyState === 'complete'", timeout=30_000)
    assert page.evaluate(CHARTS_SHOWN)["errors"] == []
    assert page.evaluate(CANVASES_OUTSIDE) == []
    assert page.evaluate(SLIDERS) == []
    heat = page.evaluate(
        """() => { const c = echarts.getInstanceByDom(document.getElementById('chart-attention-entropy'));
                   const grid = c.getModel().getComponent('grid').coordinateSystem.getRect();
                   const box = document.getElementById('chart-attention-entropy').getBoundingClientRect();
                   return {grid: [grid.x, grid.y, grid.width, grid.height], box: [box.width, box.height]}; }"""
    )
    x, y, w, h = heat["grid"]
    assert w > 200 and h > 100 and x + w <= heat["box"][0] and y + h <= heat["box"][1], heat  # the cells' frame fits the box
    page.screenshot(path=str(artifacts_dir / "report-print.png"), full_page=True)
    page.close()

    # on the screen the same report keeps its zoom sliders, and a browser's print dialog drops them
    page, problems, _ = open_page(browser, out)
    assert problems == [] and len(page.evaluate(SLIDERS)) == len(data["metrics"])
    page.evaluate("window.dispatchEvent(new Event('beforeprint'))")
    assert page.evaluate(SLIDERS) == [] and page.evaluate("document.body.classList.contains('print')")
    page.close()
    page, problems, _ = open_page(browser, out)  # a phone: one chart a row, nothing wider than the screen
    page.set_viewport_size({"width": 390, "height": 844})
    page.wait_for_timeout(200)
    assert problems == [] and page.evaluate("document.documentElement.scrollWidth") <= 390
    page.screenshot(path=str(artifacts_dir / "report-390.png"), full_page=True)
    page.close()


Y_AXES = """() => Object.fromEntries(Array.from(document.querySelectorAll('#curves .chart')).map((el) => {
  const c = echarts.getInstanceByDom(el);
  const axis = c.getModel().getComponent('yAxis', 0).axis;
  return [c.getOption().title[0].text, {name: c.getOption().yAxis[0].name, range: axis.scale.getExtent()}];
}))"""


def test_the_reports_curves_name_their_unit_and_memory_starts_at_zero(browser, tmp_path: Path) -> None:
    run_dir = tmp_path / "proj" / "flat_memory"
    t0 = time.time() - 100
    w = RunWriter(run_dir)
    # host memory flat at 1.24 GB, +7 MB over the run: on an axis from 1.16 it reads as a climb
    memory = [1.236 + 7e-5 * s for s in range(1, 101)]
    w.write([{"step": s, "t": t0 + s, "loss": 3 - s / 100, "step_time": 0.05, "host_rss_gb": m} for s, m in enumerate(memory, 1)])
    w.close("finished")
    out = tmp_path / "flat_memory.html"
    assert main(["report", str(run_dir), "-o", str(out)]) == 0
    page, problems, _ = open_page(browser, out)
    assert problems == []
    axes = page.evaluate(Y_AXES)
    shown = axes["host_rss_gb"]
    assert shown["name"] == "GB" and shown["range"][0] == 0 and shown["range"][1] >= max(memory), shown
    assert axes["step_time"]["name"] == "s" and axes["loss"]["name"] == ""
    page.close()


ROW_HEIGHTS = """() => Array.from(document.querySelectorAll('#layers .chart.heat')).map((el) => {
  const c = echarts.getInstanceByDom(el);
  const grid = c.getModel().getComponent('grid').coordinateSystem.getRect();
  const rows = c.getOption().yAxis[0].data.length;
  const named = c.getModel().getComponent('yAxis', 0).axis.getViewLabels().length;
  return {id: el.id, rows, named, px: grid.height / rows};
})"""


def _sixteen_layers_report(tmp_path: Path, smallest: float = 1e-3) -> Path:
    """The report of a run whose 16 layers were measured every 4th step; each statistic's smallest value is ``smallest``."""
    from mindwatch.store.layerfiles import LAYER_KEY, LayerRow, row_stats

    layers = tuple(f"blocks.{b}.{part}" for b in range(4) for part in ("ln1", "attn.qkv", "attn.proj", "mlp.0"))
    run_dir = tmp_path / "proj" / "sixteen_layers"
    w = RunWriter(run_dir)
    w.set_layers(list(layers))
    t0 = time.time() - 100
    rng = np.random.default_rng(0)
    for s in range(1, 41):
        rec: dict = {"step": s, "t": t0 + s, "loss": 3 - s / 100}
        if s % 4 == 0:
            stats = rng.uniform(max(smallest, 1e-3), 1.0, (len(row_stats(False)), len(layers))).astype(np.float32)
            stats[:, 0] = smallest if s == 4 else stats[:, 0]
            rec[LAYER_KEY] = LayerRow(layers, stats)
        w.write([rec])
    w.close("finished")
    out = tmp_path / "layers.html"
    assert main(["report", str(run_dir), "-o", str(out)]) == 0
    return out


def test_the_pdfs_layer_heat_maps_give_every_layer_a_readable_row(browser, tmp_path: Path, artifacts_dir: Path) -> None:
    out = _sixteen_layers_report(tmp_path)
    page = browser.new_page(viewport={"width": 794, "height": 1123})  # the PDF's layout: report.html#print at A4 width
    page.emulate_media(media="print")
    page.goto(out.resolve().as_uri() + "#print")
    page.wait_for_function("document.readyState === 'complete'", timeout=30_000)
    maps = page.evaluate(ROW_HEIGHTS)
    assert maps and all(m["rows"] == 16 for m in maps), maps
    # 12 px a row at least, every layer named: the labels of 16 layers do not overprint each other
    assert all(m["px"] >= 12 and m["named"] == 16 for m in maps), maps
    page.locator("#layers").screenshot(path=str(artifacts_dir / "report-print-layers.png"))
    page.close()


def test_a_heat_maps_colour_bar_reads_its_ends_without_trailing_zeros(browser, tmp_path: Path) -> None:
    out = _sixteen_layers_report(tmp_path, smallest=1.7e-4)
    page, problems, _ = open_page(browser, out)
    assert problems == []
    ends = page.evaluate(
        """() => { const el = document.getElementById('chart-layers-grad_norm');
                   const vm = echarts.getInstanceByDom(el).getOption().visualMap[0];
                   return [vm.formatter(vm.min), vm.formatter(vm.max)]; }"""
    )
    assert ends[0] == "1.7e-4", ends  # not 1.700e-4: two digits known, two shown (and narrower beside the cells)
    page.close()
