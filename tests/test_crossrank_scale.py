"""What makes rank 0's cross-rank pass and the dashboard's band scale to 1,000 ranks, checked against plain Python."""

from __future__ import annotations

import json
import shutil
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
from conftest import CHROMIUM

from mindwatch.alerts.crossrank import CrossRankWatch, WatchedRun
from mindwatch.alerts.straggler import StragglerRule, medians_of_the_others
from mindwatch.config import load_config
from mindwatch.monitor.role import RankRole
from mindwatch.store.bandfiles import read_band_file
from mindwatch.store.layout import RunLayout, write_json_atomic
from mindwatch.store.writer import RunWriter

if TYPE_CHECKING:
    from playwright.sync_api import Browser


@pytest.mark.parametrize("n", [2, 3, 4, 7, 8, 65])
def test_the_median_of_the_others_is_statistics_median_of_the_rest(n: int) -> None:
    rng = np.random.default_rng(n)
    for values in (rng.standard_normal(n), rng.integers(0, 3, n).astype(float)):  # ties too
        expected = [statistics.median(values[np.arange(n) != i].tolist()) for i in range(n)]
        assert medians_of_the_others(values).tolist() == expected


def test_the_straggler_rule_names_one_slow_rank_among_many() -> None:
    rule = StragglerRule(["data_time"], factor=2.0, min_excess=0.05, count=3)
    fired = []
    for step in range(1, 6):
        ranks = {r: {"data_time": 0.5 if r == 700 else 0.01 + r * 1e-6} for r in range(1024)}
        fired += rule.check({"step": step, "ranks": ranks})
    assert [(a["rank"], a["step"]) for a in fired] == [(700, 3)]
    assert fired[0]["others_median"] == pytest.approx(statistics.median(0.01 + r * 1e-6 for r in range(1024) if r != 700))


def test_rank_0_writes_the_band_and_the_dashboard_answers_from_it_alone(tmp_path: Path) -> None:
    run_dir = tmp_path / "p" / "run_1"
    ranks = 3
    cfg = load_config({"distributed": {"poll_secs": 1e-9}})
    writers = [RunWriter(run_dir, r, flush_secs=1e9) for r in range(ranks)]
    watch = CrossRankWatch(WatchedRun(run_dir, RankRole(0, ranks)), lambda alert: None, cfg.distributed, cooldown_secs=0)
    write_json_atomic(RunLayout(run_dir).meta, {"run_id": "run_1", "project": "p", "world_size": ranks})
    expected = {}
    for step in range(1, 41):
        values = [0.01 * (r + 1) * (1 + step % 5) for r in range(ranks)]
        values[1] = float("nan") if step == 7 else values[1]
        for r in range(ranks):
            writers[r].write([{"step": step, "t": time.time(), "rank": r, "data_time": values[r]}])
        finite = [v for v in values if v == v]
        expected[step] = (min(finite), sum(finite) / len(finite), max(finite), values.index(max(finite)), len(finite))
        if step % 10 == 0:
            watch.poll()
    rows = read_band_file(RunLayout(run_dir), "data_time")
    got = {int(r["step"]): (r["min"], r["mean"], r["max"], int(r["argmax"]), int(r["count"])) for r in rows}
    assert got.keys() == expected.keys()
    for step, want in expected.items():
        assert got[step] == pytest.approx(want), step
    for w in writers:
        w.close()
    # the band file alone answers: no rank's metrics are read
    for r in range(ranks):
        (run_dir / f"metrics.rank{r}.jsonl").unlink()
    from starlette.testclient import TestClient

    from mindwatch.serve.app import create_app

    with TestClient(create_app(tmp_path)) as c:
        body = c.get("/api/band", params={"run": "p/run_1", "metric": "data_time"}).json()
    assert body["ranks"] == [0, 1, 2]
    assert {p[0]: tuple(p[1:]) for p in body["points"]} == {s: pytest.approx(w[:3]) for s, w in expected.items()}
    assert json.loads((run_dir / "status.rank0.json").read_text())["host"]


def many_ranks_run(logdir: Path, ranks: int = 40, slow: tuple[int, ...] = (23, 31)) -> Path:
    """A finished run of ``ranks`` ranks (band files written by rank 0's watch) where ``slow`` ranks take longer."""
    run_dir = logdir / "p" / "many"
    cfg = load_config({"distributed": {"poll_secs": 1e-9}})
    writers = [RunWriter(run_dir, r, flush_secs=1e9) for r in range(ranks)]
    write_json_atomic(RunLayout(run_dir).meta, {"run_id": "many", "project": "p", "world_size": ranks})
    watch = CrossRankWatch(WatchedRun(run_dir, RankRole(0, ranks)), lambda alert: None, cfg.distributed, cooldown_secs=0)
    for step in range(1, 31):
        for r, w in enumerate(writers):
            extra = 0.05 * (slow.index(r) + 1) if r in slow and step % 3 else 0.0
            w.write([{"step": step, "t": time.time(), "rank": r, "loss": 2.0 - step / 100, "step_time": 0.1 + r * 1e-4 + extra}])
    watch.poll()
    for w in writers:
        w.close("finished")
    return run_dir


def test_the_outliers_are_the_ranks_most_often_at_the_edge_of_the_band(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    from mindwatch.serve.app import create_app

    many_ranks_run(tmp_path)
    with TestClient(create_app(tmp_path)) as c:
        body = c.get("/api/outliers", params={"run": "p/many", "metric": "step_time", "k": 3}).json()
    # rank 31 is the slowest on 20 steps, rank 39 (0.1039 s) on the other 10 and rank 0 always the fastest: 30 times
    assert body["ranks"] == [0, 31, 39] and body["times"] == [30, 20, 10]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason="Debian's chromium is not installed (scripts/setup.sh)")
def test_with_many_ranks_the_run_page_draws_the_top_outliers_and_any_rank_by_number(tmp_path: Path, browser: Browser) -> None:
    from mindwatch.serve.process import DashboardProcess

    many_ranks_run(tmp_path / "logs")
    names = """() => {
      const c = echarts.getInstanceByDom(document.querySelector('#chart-time'));
      return c ? c.getOption().series.map((s) => s.name).filter((n) => n.startsWith('step_time r')) : [];  // lines and band
    }"""
    with DashboardProcess(tmp_path / "logs", port=0) as dash:
        page = browser.new_page(viewport={"width": 1300, "height": 1000})
        page.goto(f"{dash.url}#/run/p%2Fmany")
        page.wait_for_function("() => document.querySelector('#chart-time') !== null", timeout=60_000)
        # the lines come first, the band right after them (its own query): wait for both
        page.wait_for_function(f"() => ({names})().includes('step_time r0 range')", timeout=60_000)
        assert page.input_value("#rank") == "top"
        shown = page.evaluate(names)
        assert "step_time r0 range" in shown, "the band across all 40 ranks is drawn behind the lines"
        lines = [n for n in shown if not n.endswith((" min", " range"))]
        assert sorted(lines) == ["step_time r0", "step_time r31", "step_time r39"], "the ranks /api/outliers names"
        page.fill("#rank-pick", "7")
        page.dispatch_event("#rank-pick", "change")
        page.wait_for_function("() => document.querySelector('#rank').value === '7'", timeout=60_000)
        one_line = """() => {
          const c = echarts.getInstanceByDom(document.querySelector('#chart-time'));
          const s = c && c.getOption().series.filter((x) => x.name === 'step_time');
          return s && s.length === 1 && s[0].data.length ? s[0].data[0][1] : null;
        }"""
        page.wait_for_function(f"() => ({one_line})() !== null", timeout=60_000)
        assert page.evaluate(one_line) == pytest.approx(0.1 + 7e-4), "rank 7's own step_time, alone"
