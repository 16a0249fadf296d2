"""In headless Chromium, on runs written by RunWriter: the run page says what a live run waits for before its first
step, an ended run's rate reads as its average, and the chart tools (download, full screen, metric search); and a failed
run (a real MindSpore error too) says what went wrong, not the rules of its error."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from conftest import CHROMIUM
from test_dashboard_browser import wait_for
from test_dashboard_charts_browser import _look_at

from mindwatch.serve.process import DashboardProcess
from mindwatch.store.layout import write_json_atomic
from mindwatch.store.writer import RunWriter

if TYPE_CHECKING:
    from playwright.sync_api import Browser

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


def _finished_run(run_dir: Path, steps: int, t0: float) -> None:
    """A finished run of ``steps`` training records from ``t0`` on."""
    writer = RunWriter(run_dir, 0)
    writer.write(_training_records(steps, t0))
    writer.close("finished")


def _meta(run_dir: Path, **meta: object) -> None:
    write_json_atomic(run_dir / "meta.json", {"run_id": run_dir.name, "project": run_dir.parent.name, **meta})


def test_a_live_run_says_it_waits_for_its_first_step_and_its_first_point_draws_as_a_point(
    tmp_path: Path, artifacts_dir: Path, browser: Browser
) -> None:
    run_dir = tmp_path / "logs" / "p" / "compiling"
    writer = RunWriter(run_dir, 0, flush_secs=60)  # running, no step yet: the graph compiles
    began = time.time() - 42
    _meta(run_dir, started_at=began)
    with DashboardProcess(tmp_path / "logs", port=0) as dash:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{dash.url}#/run/p%2Fcompiling")
        page.wait_for_selector("#run-waiting:not([hidden])", timeout=30_000)
        said = page.inner_text("#run-waiting")
        m = re.fullmatch(r"compiling the graph / waiting for the first step: (\d+) s", said.strip())
        assert m and 42 <= int(m.group(1)) <= time.time() - began + 1, said  # the seconds since started_at, rounded
        wait_for(lambda: int(re.findall(r"\d+", page.inner_text("#run-waiting"))[0]) > int(m.group(1)), 5, "the clock to tick")
        _look_at(page, artifacts_dir, "run_page_compiling")

        writer.write([{"step": 1, "t": time.time(), "loss": 2.5}])
        writer.flush()
        drawn = wait_for(lambda: (d := page.evaluate(LOSS)) and d["points"] > 0 and d, 30, "the first point")
        assert drawn == {"points": 1, "symbol": True}  # one value: a visible point, not an invisible line
        wait_for(lambda: page.is_hidden("#run-waiting"), 10, "the waiting line to go")
        writer.write([{"step": 2, "t": time.time(), "loss": 2.4}])
        writer.flush()
        assert wait_for(lambda: (d := page.evaluate(LOSS)) and d["points"] == 2 and d, 20, "the second point")["symbol"] is False
        assert not errors, errors
        page.close()
    writer.close("finished")


def test_an_ended_run_shows_its_average_rate_labelled_as_such(tmp_path: Path, browser: Browser) -> None:
    t0 = time.time() - 600
    # 300 steps at 10 steps/s, then 200 at 2 steps/s: the last minute says 2, the run's average is 500 / 130 s
    times = [t0 + 0.1 * s for s in range(1, 301)] + [t0 + 30 + 0.5 * s for s in range(1, 201)]
    run_dir = tmp_path / "logs" / "p" / "ended"
    writer = RunWriter(run_dir, 0)
    writer.write([{"step": s, "t": t, "loss": 1.0} for s, t in enumerate(times, start=1)])
    writer.close("stopped")
    _meta(run_dir, started_at=t0, total_steps=1000)
    average = (500 - 1) / (times[-1] - times[0])  # the steps between the first and the last recorded step end
    with DashboardProcess(tmp_path / "logs", port=0) as dash:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{dash.url}#/run/p%2Fended")
        rate = wait_for(lambda: page.query_selector("#progress-rate") and page.inner_text("#progress-rate"), 30, "the rate")
        assert rate.strip() == f"average {average:.3g} steps/s"
        assert page.query_selector("#progress-eta") is None
        page.close()


def test_a_live_runs_header_says_its_newest_step_once_and_fits_a_phone(
    tmp_path: Path, artifacts_dir: Path, browser: Browser
) -> None:
    t0 = time.time() - 30
    run_dir = tmp_path / "logs" / "p" / "a_live_run_with_a_long_name"
    writer = RunWriter(run_dir, 0, flush_secs=60)
    writer.write([{"step": s, "t": t0 + 0.1 * s, "loss": 3.0 - s / 1000} for s in range(1, 151)])
    writer.flush()
    _meta(run_dir, started_at=t0, total_steps=400)
    with DashboardProcess(tmp_path / "logs", port=0) as dash:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{dash.url}#/run/p%2Fa_live_run_with_a_long_name")
        wait_for(lambda: "150/400" in page.inner_text(".run-head"), 30, "the progress at step 150")
        page.wait_for_selector("#run-live.on", timeout=30_000)
        time.sleep(1)  # the stream's first state event came: the next comes with the next heartbeat
        # the points go on before the heartbeat is rewritten (a training writes its status file every flush_secs)
        writer.write([{"step": s, "t": t0 + 0.1 * s, "loss": 3.0 - s / 1000} for s in range(151, 171)])
        wait_for(lambda: "170/400" in page.inner_text(".run-head"), 30, "the pushed points to move the progress")
        head = page.inner_text(".run-head")
        steps = [int(a or b) for a, b in re.findall(r"step (\d+)|(\d+)/400", head)]
        assert steps and set(steps) == {170}, head  # the newest step, not a second one that lags it
        _look_at(page, artifacts_dir, "run_page_live_header")  # at 390 px the header wraps, the page does not overflow
        page.close()
    writer.close("finished")


VISIBLE_CHARTS = """() => [...document.querySelectorAll('#charts > .card, #charts > .layers-view')]
  .filter((f) => !f.hidden && f.offsetParent !== null)
  .map((f) => f.dataset.chart || f.id)"""

SERIES_NAMES = """(id) => {
  const el = document.querySelector(id);
  const c = el && echarts.getInstanceByDom(el);
  return c ? c.getOption().series.filter((s) => s.type === 'line').map((s) => [s.name, s.data.length]) : null;
}"""


def _training_records(steps: int, t0: float) -> list[dict]:
    out = []
    for s in range(1, steps + 1):
        rec = {"step": s, "t": t0 + s * 0.01, "loss": 3.0 / (1 + s / 300) + (0.1 if s % 7 == 0 else 0.0), "lr": 1e-3}
        rec |= {"grad_norm": 1.0 + (s % 5) / 10, "samples_per_second": 64.0 + s % 3, "tokens_per_second": 16384.0 + 50 * (s % 4)}
        if s % 10 == 0:
            rec |= {"grad_norm/blocks.0": 0.5, "grad_norm/blocks.1": 0.25}
        out.append(rec)
    return out


def test_each_chart_downloads_its_png_and_every_point_as_csv_and_goes_full_screen(
    tmp_path: Path, artifacts_dir: Path, browser: Browser
) -> None:
    import csv
    import json

    t0 = time.time() - 3600
    run_dir = tmp_path / "logs" / "p" / "tools"
    _finished_run(run_dir, 3000, t0)
    _meta(run_dir, started_at=t0)
    # the reference: the metrics file itself, read here with json
    in_file = [json.loads(line) for line in (run_dir / "metrics.rank0.jsonl").read_text().splitlines()]
    with DashboardProcess(tmp_path / "logs", port=0) as dash:
        page = browser.new_page(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{dash.url}#/run/p%2Ftools")
        drawn = wait_for(lambda: page.evaluate(SERIES_NAMES, "#chart-loss"), 60, "the loss chart")
        assert drawn[0][0] == "loss" and drawn[0][1] < 3000  # the chart draws thinned points

        # samples/s and tokens/s: a chart each, not twin axes hiding each other
        for chart, metric in (("#chart-throughput", "samples_per_second"), ("#chart-tokens", "tokens_per_second")):
            names = wait_for(lambda c=chart: (n := page.evaluate(SERIES_NAMES, c)) and all(k for _, k in n) and n, 30, chart)
            assert [name for name, _ in names] == [metric]

        with page.expect_download() as got:
            page.click('[data-chart="chart-loss"] .tool-csv')
        rows = list(csv.DictReader(got.value.path().open()))
        assert got.value.suggested_filename == "p_tools_loss.csv"
        assert [(int(r["step"]), float(r["time"]), r["metric"], float(r["value"])) for r in rows] == [
            (rec["step"], rec["t"], "loss", rec["loss"]) for rec in in_file
        ]  # every recorded point, exactly the file's values

        with page.expect_download() as got:
            page.click('[data-chart="chart-tokens"] .tool-png')
        png = got.value.path().read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000 and got.value.suggested_filename == "p_tools_tokens.png"

        page.click('[data-chart="chart-loss"] .tool-full')
        full = "() => document.fullscreenElement && document.fullscreenElement.dataset.chart"
        assert wait_for(lambda: page.evaluate(full), 10, "full screen") == "chart-loss"
        tall = "() => document.querySelector('#chart-loss canvas').getBoundingClientRect().height"
        wait_for(lambda: page.evaluate(tall) > 700, 10, "the chart to fill the screen")
        page.screenshot(path=str(artifacts_dir / "run_page_full_screen.png"))
        page.click('[data-chart="chart-loss"] .tool-full')
        wait_for(lambda: page.evaluate("() => document.fullscreenElement === null"), 10, "full screen to end")
        wait_for(lambda: page.evaluate(tall) < 400, 10, "the chart back in its card")
        assert not errors, errors
        page.close()


def test_the_metric_search_shows_only_the_matching_charts_and_survives_a_reload(
    tmp_path: Path, artifacts_dir: Path, browser: Browser
) -> None:
    run_dir = tmp_path / "logs" / "p" / "search"
    _finished_run(run_dir, 200, time.time() - 600)
    with DashboardProcess(tmp_path / "logs", port=0) as dash:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{dash.url}#/run/p%2Fsearch")
        wait_for(lambda: page.evaluate(SERIES_NAMES, "#chart-loss"), 60, "the loss chart")
        everything = wait_for(lambda: "layers" in (v := page.evaluate(VISIBLE_CHARTS)) and v, 30, "the layers view")
        assert {"chart-loss", "chart-lr", "chart-grad_norm", "chart-throughput", "chart-tokens", "layers"} <= set(everything)

        page.fill("#metric-filter", "norm")  # grad_norm and the per-layer grad_norm/<layer> family
        assert wait_for(lambda: page.evaluate(VISIBLE_CHARTS) == ["chart-grad_norm", "layers"], 10, "the norm charts")
        page.fill("#metric-filter", "BLOCKS.1")  # a layer's name, any case: its family's view
        assert wait_for(lambda: page.evaluate(VISIBLE_CHARTS) == ["layers"], 10, "the layers view alone")
        page.fill("#metric-filter", "tokens samples")  # any of the words
        assert wait_for(lambda: page.evaluate(VISIBLE_CHARTS) == ["chart-throughput", "chart-tokens"], 10, "throughput")
        _look_at(page, artifacts_dir, "run_page_search")
        assert "q=tokens+samples" in page.evaluate("() => location.hash")
        page.reload()
        wait_for(lambda: page.evaluate(SERIES_NAMES, "#chart-tokens"), 60, "the tokens chart again")
        assert page.input_value("#metric-filter") == "tokens samples"
        assert wait_for(lambda: page.evaluate(VISIBLE_CHARTS) == ["chart-throughput", "chart-tokens"], 10, "the same charts")
        page.fill("#metric-filter", "perplexity")
        wait_for(lambda: page.evaluate(VISIBLE_CHARTS) == [], 10, "no chart")
        assert "no chart has a metric matching" in page.inner_text("#charts")
        page.fill("#metric-filter", "")
        assert wait_for(lambda: set(page.evaluate(VISIBLE_CHARTS)) == set(everything), 10, "every chart again")
        page.close()


def test_a_rename_and_a_note_from_the_run_page_survive_a_reload_and_show_everywhere(
    tmp_path: Path, artifacts_dir: Path, browser: Browser
) -> None:
    import json
    import subprocess
    import sys

    from test_dashboard_control_browser import TOKEN, serve

    run_dir = tmp_path / "logs" / "p" / "run_7"
    _finished_run(run_dir, 50, time.time() - 100)
    _meta(run_dir, started_at=time.time() - 100)
    proc, url = serve(tmp_path / "logs", "--allow-control")
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{url}/?token={TOKEN}")  # the sign-in link sets the cookie
        page.goto(f"{url}/#/run/p%2Frun_7")
        page.wait_for_selector("#run-rename:visible", timeout=30_000)
        answers = iter(["lr 3e-4 baseline", "loss flat after step 30"])
        page.on("dialog", lambda d: d.accept(next(answers)))
        page.click("#run-rename")
        wait_for(lambda: page.inner_text("#run-title").startswith("lr 3e-4 baseline"), 10, "the new name")
        page.click("#run-annotate")
        wait_for(lambda: page.inner_text("#run-note") == "loss flat after step 30", 10, "the note")
        page.reload()
        wait_for(lambda: page.inner_text("#run-title") == "lr 3e-4 baseline p/run_7", 30, "the name after a reload")
        assert page.inner_text("#run-note") == "loss flat after step 30"
        _look_at(page, artifacts_dir, "run_page_named")
        page.goto(f"{url}/#/")
        cell = wait_for(lambda: page.query_selector('tr[data-run="p/run_7"] td.run-name'), 30, "the runs table")
        assert cell.inner_text().split("\n") == ["lr 3e-4 baseline run_7", "loss flat after step 30"]
        _look_at(page, artifacts_dir, "runs_page_named")
        page.close()
    finally:
        proc.terminate()
        proc.wait(10)
    listed = subprocess.run(
        [sys.executable, "-m", "mindwatch.cli", "runs", str(tmp_path / "logs"), "--json"], capture_output=True, text=True
    )
    row = json.loads(listed.stdout)[0]
    assert (row["run_id"], row["name"], row["note"]) == ("run_7", "lr 3e-4 baseline", "loss flat after step 30")
    assert not (tmp_path / "logs" / "p" / "run_7").with_name("lr 3e-4 baseline").exists()  # the id (the folder) stays


def test_the_header_shows_tflops_per_device_and_mfu_beside_the_rate(
    tmp_path: Path, artifacts_dir: Path, browser: Browser
) -> None:
    import numpy as np

    now = time.time()
    # a live run: 80 steps at 40 TFLOPS over a minute ago, then the last minute's 120 steps at 150-156 TFLOPS
    times = [now - 100.25 + 0.5 * s for s in range(1, 81)] + [now - 59.75 + 0.5 * s for s in range(120)]
    tflops = [40.0] * 80 + [150.0 + s % 7 for s in range(120)]
    peak = 989.0
    live = tmp_path / "logs" / "p" / "llm"
    writer = RunWriter(live, 0, flush_secs=60)  # running
    pairs = enumerate(zip(times, tflops, strict=True), start=1)
    writer.write([{"step": s, "t": t, "loss": 2.0, "tflops": f, "mfu": 100 * f / peak} for s, (t, f) in pairs])
    writer.flush()
    _meta(live, started_at=now - 120, total_steps=1000)
    t, v = np.array(times), np.array(tflops)
    recent = float(np.median(v[t >= t[-1] - 60]))  # the same last minute as the steps/s beside it
    # an ended run on a device of no known peak: TFLOPS, no MFU, the median of all its steps but the first (it compiles)
    ended = tmp_path / "logs" / "p" / "cpu"
    done = RunWriter(ended, 0)
    cpu = [9.0, 0.5, 0.4, 0.6, 0.45]
    done.write([{"step": s, "t": now - 50 + s, "loss": 1.0, "tflops": f} for s, f in enumerate(cpu, start=1)])
    done.close("finished")
    _meta(ended, started_at=now - 60)
    with DashboardProcess(tmp_path / "logs", port=0) as dash:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{dash.url}#/run/p%2Fllm")
        said = wait_for(lambda: page.query_selector("#progress-tflops") and page.inner_text("#progress-tflops"), 30, "TFLOPS")
        assert said.strip() == f"· {recent:.3g} TFLOPS · MFU {100 * recent / peak:.1f} %"
        assert page.query_selector("#progress-rate") is not None  # beside the steps/s
        names = wait_for(lambda: page.evaluate(SERIES_NAMES, "#chart-flops"), 30, "the TFLOPS chart")
        assert [n for n, _ in names] == ["tflops", "mfu"]
        _look_at(page, artifacts_dir, "run_page_tflops")

        page.set_viewport_size({"width": 1400, "height": 1000})
        page.goto(f"{dash.url}#/run/p%2Fcpu")
        page.wait_for_selector("#progress-rate")
        said = wait_for(lambda: page.query_selector("#progress-tflops") and page.inner_text("#progress-tflops"), 30, "TFLOPS")
        assert said.strip() == f"· {float(np.median(cpu[1:])):.3g} TFLOPS"
        assert not errors, errors
        page.close()
    writer.close("finished")


def test_a_failed_runs_long_error_wraps_inside_its_banner_on_a_phone(
    tmp_path: Path, artifacts_dir: Path, browser: Browser
) -> None:
    error = (
        "RuntimeError: Exception thrown from user defined Python function in dataset. " + "-" * 60 + " Traceback: File "
        '"/work/main/.venv/lib/python3.11/site-packages/mindspore/dataset/engine/datasets_user_defined.py", line 136 '
        "OSError: corrupt shard: cannot read sample 64 " + "-" * 60 + " mindspore/ccsrc/minddata/dataset/generator_op.cc(383)."
    )
    run_dir = tmp_path / "logs" / "p" / "failed"
    writer = RunWriter(run_dir, 0)
    writer.write([{"step": s, "t": time.time() - 10 + s, "loss": 2.0} for s in range(1, 9)])
    writer.close("failed", error=error)
    with DashboardProcess(tmp_path / "logs", port=0) as dash:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{dash.url}#/run/p%2Ffailed")
        wait_for(lambda: "corrupt shard" in (page.text_content("#banner") or ""), 30, "the error in the banner")
        _look_at(page, artifacts_dir, "run_page_failed_banner")  # at 390 px the paths wrap: the page does not overflow
        banner = page.evaluate("() => { const b = document.querySelector('#banner').getBoundingClientRect(); return b.right; }")
        assert banner <= 390, banner
        page.close()


#: A kernel error as MindSpore prints it: its exception line, rules around each section's heading, the C++ stack last.
KERNEL_ERROR = "\n".join([
    "RuntimeError: ", "-" * 50, "- Kernel error:", "-" * 50,
    "The kernel Add failed to launch: out of memory on device 0 while allocating 2.0 GB", "",
    "-" * 50, "- C++ Call Stack: (For framework developers)", "-" * 50, "mindspore/ccsrc/kernel/add.cc:42 Launch",
])  # fmt: skip


_SHAPE_ERROR = """
import sys
import mindspore as ms
import numpy as np
from mindspore import dataset as ds
from mindspore import nn
from mindspore.train import Model

from mindwatch.mindspore import MonitorCallback

save_dir, fail_at = sys.argv[1], int(sys.argv[2])
ms.set_context(mode=ms.PYNATIVE_MODE)
net = nn.Dense(8, 1)
batches = [(np.ones((4, 5 if i == fail_at else 8), np.float32), np.ones((4, 1), np.float32)) for i in range(8)]
mon = MonitorCallback({"save_dir": save_dir, "project": "p", "run_name": "shape", "interval": 1})
try:
    model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), learning_rate=0.01))
    model.train(1, ds.GeneratorDataset(batches, ["x", "y"], shuffle=False), callbacks=[mon], dataset_sink_mode=False)
except ValueError as e:
    if "MatMul" not in str(e):
        raise
    print(mon.run_dir)
else:
    sys.exit("the training did not fail")
"""


def _train_into_a_shape_error(save_dir: Path, fail_at: int) -> Path:
    """A real training whose batch ``fail_at`` has 5 features for a layer of 8: MindSpore's own error ends it. In a
    process of its own: a PyNative op that fails inside a gradient leaves that process's executor broken for the
    trainings after it."""
    done = subprocess.run(
        [sys.executable, "-c", _SHAPE_ERROR, str(save_dir), str(fail_at)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return Path(done.stdout.strip().splitlines()[-1])


def test_a_failed_run_says_what_went_wrong_not_the_rules_of_its_error(tmp_path: Path, browser: Browser) -> None:
    logs = tmp_path / "logs"
    shape = _train_into_a_shape_error(logs, fail_at=4)
    error = json.loads((shape / "status.rank0.json").read_text())["error"]
    said = error.split("\n")[0]  # ValueError: For 'MatMul' the input dimensions must be equal, ...
    assert said.startswith("ValueError: For 'MatMul'") and "C++ Call Stack" in error  # MindSpore's own, stack and all
    writer = RunWriter(logs / "p" / "kernel", 0)
    writer.write([{"step": s, "t": time.time() - 10 + s, "loss": 2.0} for s in range(1, 9)])
    writer.close("failed", error=KERNEL_ERROR)
    kernel = "RuntimeError: Kernel error: The kernel Add failed to launch: out of memory on device 0 while allocating 2.0 GB"
    with DashboardProcess(logs, port=0) as dash:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        for run, headline in (("shape", said), ("kernel", kernel)):
            page.goto(f"{dash.url}#/run/p%2F{run}")
            wait_for(lambda: "Failed at step" in (page.text_content("#banner") or ""), 30, "the banner")
            banner = page.inner_text("#banner")
            assert headline in banner and "---" not in banner and "C++" not in banner, banner
            whole = json.loads((logs / "p" / run / "status.rank0.json").read_text())["error"]
            assert page.get_attribute("#banner", "title") == whole  # the whole error on hover
        page.goto(f"{dash.url}#/")  # the runs table: the same words, the whole error on hover
        wait_for(lambda: page.query_selector('#runs-table tr[data-run="p/kernel"] .err'), 30, "the runs table")
        for run, headline in (("shape", said), ("kernel", kernel)):
            assert page.inner_text(f'#runs-table tr[data-run="p/{run}"] .err').strip() == f"⚠ {headline}"
        page.goto(f"{dash.url}#/compare?runs=p/shape,p/kernel")  # the compare page's summary
        wait_for(lambda: page.query_selector('#summary-table tr[data-row="error"] td'), 30, "the summary")
        for run, headline in (("shape", said), ("kernel", kernel)):
            assert page.inner_text(f'#summary-table tr[data-row="error"] td[data-run="p/{run}"]').strip() == headline
        page.close()
