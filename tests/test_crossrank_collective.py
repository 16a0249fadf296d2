"""Across ranks through the train step's own collective (real msrun, 2 workers, our train cell).

A NaN that every rank sees (the all-reduced gradients) stops every rank on its step with finite weights;
one bad batch is one alert and one message; ranks without a shared save_dir train from step 1 and still
act together. Each launch costs ~30 s here.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

import mindspore as ms
import numpy as np
import pytest
from conftest import CHROMIUM
from test_distributed import Launch, Webhooks, msrun, only_run_dir, raw_records

import mindwatch
from mindwatch.analysis.batches import flagged_batches

if TYPE_CHECKING:
    from playwright.sync_api import Browser

pytestmark = pytest.mark.slow


def launch(tmp: Path, *args: str, config: dict, steps: int = 80, mode: str = "graph") -> None:
    job = Launch()
    try:
        msrun(
            job,
            tmp / "logs",
            "--save-dir",
            str(tmp / "out"),
            "--steps",
            str(steps),
            "--mode",
            mode,
            "--config",
            json.dumps(config),
            *args,
        )
        codes = job.wait(300)
        assert codes == [0], f"msrun failed ({codes}):\n{(tmp / 'logs' / 'msrun.out').read_text()[-3000:]}"
    finally:
        job.kill()


def steps_of(run_dir: Path, rank: int) -> list[int]:
    return [rec["step"] for rec in raw_records(run_dir / f"metrics.rank{rank}.jsonl")]


@pytest.mark.parametrize("mode", ["graph", "pynative"])
def test_a_nan_in_one_ranks_labels_stops_every_rank_on_that_step_and_every_checkpoint_is_finite(
    tmp_path: Path, mode: str
) -> None:
    hooks = Webhooks()
    try:
        config = {
            "interval": 60,
            # a checkpoint every 5 steps slows those steps for real: throughput_drop may name it, which is not this test
            "alerts": {"nonfinite": {"actions": ["stop", "checkpoint"]}, "throughput_drop": {"enabled": False}},
            "notify": [{"type": "webhook", "url": hooks.url}],
        }
        ckpt = tmp_path / "ckpt"
        launch(
            tmp_path, "--nan-rank", "1", "--nan-at", "40", "--ckpt-dir", str(ckpt), "--ckpt-every", "5", config=config, mode=mode
        )
    finally:
        hooks.close()
    run_dir = only_run_dir(tmp_path / "out" / "dist")
    for rank in (0, 1):
        assert steps_of(run_dir, rank)[-1] == 40, f"rank {rank} ran on past the NaN step"
        status = json.loads((run_dir / f"status.rank{rank}.json").read_text())
        assert status["state"] == "stopped" and status["last_step"] == 40
    saved = sorted(ckpt.rglob("*.ckpt")) + sorted((run_dir / "checkpoints").glob("*.ckpt"))
    assert len(saved) >= 2 * 8 + 2, saved  # every 5 steps up to 40 on both ranks, the end's, and each rank's anomaly one
    for path in saved:
        for name, value in ms.load_checkpoint(str(path)).items():
            assert np.isfinite(value.asnumpy()).all(), f"{path.name}: {name} is not finite"
    nonfinite = [a for a in raw_records(run_dir / "alerts.jsonl") if a["rule"] == "nonfinite"]
    assert [(a["rank"], a["step"], a["metric"]) for a in nonfinite] == [(0, 40, "grad_norm")], "one alert for the run"
    assert nonfinite[0]["source_rank"] == 1, "rank 1's own gradient norm was the NaN one"
    posted = [(body.get("event"), body.get("rule"), body.get("actions")) for _, body in hooks.posts]
    assert posted == [("alert", "nonfinite", ["stop", "checkpoint"]), ("end", None, None)], "one anomaly, two messages"
    end = hooks.posts[-1][1]
    assert end["state"] == "stopped" and not end.get("lost_ranks"), f"both ranks stopped together, none lost: {end}"


FED_RANK_1_AT_60 = [100000 + i for i in range(59 * 8, 60 * 8)]  # train_dp.py's ids: rank * 100000 + sample index


@dataclass
class BadBatchJob:
    """One msrun job, two trainings: rank 1's inputs of step 60 are x30 (clipped), in a shared folder, then with each
    rank in its own (AdamWeightDecay, per-layer statistics, an ids column)."""

    out: Path
    posts: list[dict]

    @property
    def shared(self) -> Path:
        return only_run_dir(self.out / "dist")

    def own(self, rank: int) -> Path:
        return only_run_dir(self.out / f"rank{rank}" / "dist_own")


@pytest.fixture(scope="module")
def bad_batch_job(tmp_path_factory: pytest.TempPathFactory) -> BadBatchJob:
    tmp = tmp_path_factory.mktemp("bad_batch")
    hooks = Webhooks()
    try:
        config = {
            "interval": 60,
            "alerts": {"spike": {"metrics": ["grad_norm"], "count": 1, "warmup": 10}},
            "notify": [{"type": "webhook", "url": hooks.url}],
        }
        args = ("--scale-rank", "1", "--scale-at", "60", "--scale-by", "30", "--max-grad-norm", "1.0", "--ids")
        launch(tmp, *args, "--adamw", "--layer-stats", "--then-per-rank", config=config)
    finally:
        hooks.close()
    return BadBatchJob(tmp / "out", [body for _, body in hooks.posts])


def test_one_bad_batch_on_one_rank_is_one_alert_that_names_that_rank_and_its_batch(bad_batch_job: BadBatchJob) -> None:
    """The all-reduced grad_norm spikes alike on both ranks, and the one alert (rank 0's) names rank 1 as its source,
    with the ids the data fed rank 1 at step 60: in a shared folder, and with each rank in its own (the ids reach
    rank 0 over the lifeline)."""
    job = bad_batch_job
    own = {rank: job.own(rank) for rank in (0, 1)}
    assert not (own[0] / "metrics.rank1.jsonl").exists(), "rank 1's records stay in its own folder"
    for run_dir, other in ((job.shared, job.shared), (own[0], own[1])):
        spikes = [a for a in raw_records(run_dir / "alerts.jsonl") if a["rule"] == "spike"]
        assert [(a["rank"], a["step"], a["source_rank"]) for a in spikes] == [(0, 60, 1)], spikes
        assert spikes[0]["sample_ids"] == FED_RANK_1_AT_60 and spikes[0]["batch"] == 59, spikes[0]
        records = {r: raw_records((run_dir if r == 0 else other) / f"metrics.rank{r}.jsonl") for r in (0, 1)}
        local = {r: {rec["step"]: rec["local_grad_norm"] for rec in records[r]} for r in (0, 1)}
        grad = {rec["step"]: rec["grad_norm"] for rec in records[0]}
        for r, stands_out in ((1, True), (0, False)):
            ratio = local[r][60] / np.median([local[r][s] for s in range(40, 60)])
            assert (ratio > 5) if stands_out else (ratio < 2), (r, ratio)
        for step in grad:  # the mean of the ranks' gradients is no longer than the mean of their norms
            assert grad[step] <= (local[0][step] + local[1][step]) / 2 * (1 + 1e-4), step
        flagged = flagged_batches(mindwatch.open_run(run_dir).alerts)
        assert [(b.step, b.rank, b.sample_ids) for b in flagged] == [(60, 1, FED_RANK_1_AT_60)]
    posted = [b for b in job.posts if b.get("event") == "alert" and b.get("rule") == "spike"]
    assert [(b["rank"], b["step"]) for b in posted] == [(0, 60)] * 2, f"one message for one bad batch, per training: {posted}"
    from starlette.testclient import TestClient

    from mindwatch.serve.app import create_app

    with TestClient(create_app(job.out / "rank0", cache=None)) as client:  # node 0's folder alone
        body = client.get("/api/band", params={"run": f"dist_own/{own[0].name}", "metric": "local_grad_norm"}).json()
    points = {p[0]: p[1:] for p in body["points"]}
    rank_1 = {rec["step"]: rec["local_grad_norm"] for rec in raw_records(own[1] / "metrics.rank1.jsonl")}
    assert points[60][2] == pytest.approx(rank_1[60], rel=1e-5), "the band's max at step 60 is rank 1's own norm"


@pytest.mark.parametrize("loop", [False, True])
def test_without_a_shared_save_dir_both_ranks_train_from_step_1_and_stop_together(tmp_path: Path, loop: bool) -> None:
    """Each rank records under its own folder (a multi-node job without a shared file system); rank 1's data_time
    limit alone asks for a stop. Through Model.train with our train cell, and through a loop of its own (``--loop``).

    A bug of mindwatch's own on rank 1 (its recording raises at steps 20 and 21; in the loop, also the code just before
    its own sum of the signal at steps 30 and 31) changes none of it: both ranks train every step, their collectives
    stay in step, they stop together."""
    config = {
        "callback": {"params": {"warn_on_value": {"data_time": 0.5}}},
        "alerts": {"thresholds": {"actions": ["stop"]}},
        "distributed": {"rendezvous_timeout": 300},
    }
    launch(
        tmp_path,
        *("--save-dir-per-rank", "--pace-secs", "0.02", "--spike-rank", "1", "--spike-at", "60", "--spike-secs", "1.5"),
        *(("--loop", "--mode", "pynative") if loop else ()),
        *("--fault-rank", "1", "--fault", "record:20,21", *(("--fault", "sum:30,31") if loop else ())),
        config=config,
        steps=160,
    )
    dirs = {rank: only_run_dir(tmp_path / "out" / f"rank{rank}" / "dist") for rank in (0, 1)}
    assert dirs[0].name == dirs[1].name, "one run id on every node"
    first = {rank: raw_records(dirs[rank] / f"metrics.rank{rank}.jsonl")[0] for rank in (0, 1)}
    assert first[0]["step"] == first[1]["step"] == 1
    started = json.loads((dirs[0] / "status.rank0.json").read_text())["started_at"]
    # a rank that waited at start for a file it cannot see would hold every rank's step 1 back by rendezvous_timeout
    assert first[0]["t"] - started < config["distributed"]["rendezvous_timeout"], "rank 1 waited at start"
    last = {rank: steps_of(dirs[rank], rank)[-1] for rank in (0, 1)}
    assert last[0] == last[1] < 160, "both ranks stopped at one step, before the data ran out"
    assert steps_of(dirs[0], 0) == list(range(1, last[0] + 1))
    assert steps_of(dirs[1], 1) == [s for s in range(1, last[1] + 1) if s not in (20, 21)], "the faults lost 2 records"
    rank_1 = (tmp_path / "logs" / "worker_1.log").read_text(errors="replace")
    assert rank_1.count("mindwatch: could not record step") == 1, "said once, then counted"
    assert "injected fault in the record of step 20" in rank_1 and "Traceback" in rank_1
    assert ("more steps could not be recorded" if loop else "more step could not be recorded") in rank_1
    for rank in (0, 1):
        status = json.loads((dirs[rank] / f"status.rank{rank}.json").read_text())
        assert status["state"] == "stopped" and status["last_step"] == last[rank]
    limit = [a for a in raw_records(dirs[1] / "alerts.jsonl") if a["rule"] == "threshold"]
    assert limit and limit[0]["rank"] == 1
    # rank 1's alert reached rank 0 over the lifeline with the request: its reason is that alert, not a placeholder
    reasons = [json.loads((dirs[r] / f"status.rank{r}.json").read_text())["reason"] for r in (0, 1)]
    assert reasons == [f"stopped by mindwatch: {limit[0]['message']}"] * 2, reasons
    assert json.loads((dirs[0] / "meta.json").read_text())["coordination"] == "collective"
    assert mindwatch.open_run(dirs[1]).state == "stopped"
    both = mindwatch.open_run(dirs[0], dirs[1])  # the two nodes' folders read as one run
    assert both.ranks == [0, 1] and both.state == "stopped" and both.meta["world_size"] == 2
    assert both.series("data_time", rank=1).step.tolist() == steps_of(dirs[1], 1)
    assert any(a["rule"] == "threshold" and a["rank"] == 1 for a in both.alerts)
    from starlette.testclient import TestClient

    from mindwatch.serve.app import create_app

    with TestClient(create_app([tmp_path / "out" / "rank0", tmp_path / "out" / "rank1"], cache=None)) as client:
        runs = client.get("/api/runs").json()
        listed = runs["runs"] if isinstance(runs, dict) else runs
        assert [r["id"] for r in listed] == [f"dist/{dirs[0].name}"], "one run over both folders"
        assert listed[0]["ranks"] in (2, [0, 1])


def test_without_a_shared_save_dir_rank_0_names_the_straggler_and_draws_the_band(tmp_path: Path) -> None:
    """Each rank in its own folder; rank 1's data pipeline takes 0.4 s a batch (more than a loaded machine's
    step, which would hide a shorter wait behind the prefetch: at 0.15 s, a machine at load 7 saw no data time).
    Rank 0 sees no file of rank 1, yet names it a straggler and writes the data-time band from the timings every
    step's collective brings: the band's max at each step is rank 1's own recorded data time (read from rank 1's
    folder)."""
    launch(tmp_path, "--save-dir-per-rank", "--slow-rank", "1", "--slow-secs", "0.4", config={}, steps=30)
    dirs = {rank: only_run_dir(tmp_path / "out" / f"rank{rank}" / "dist") for rank in (0, 1)}
    assert not (dirs[0] / "metrics.rank1.jsonl").exists(), "rank 1's records stay on its own node"
    stragglers = [a for a in raw_records(dirs[0] / "alerts.jsonl") if a["rule"] == "straggler"]
    assert stragglers, f"no straggler alert in rank 0's folder: {raw_records(dirs[0] / 'alerts.jsonl')}"
    assert {a["rank"] for a in stragglers} == {1} and stragglers[0]["metric"] == "data_time"
    assert stragglers[0]["value"] > 0.1 and stragglers[0]["reported_by"] == 0
    own = {r: {rec["step"]: rec["data_time"] for rec in raw_records(dirs[r] / f"metrics.rank{r}.jsonl")} for r in (0, 1)}
    from starlette.testclient import TestClient

    from mindwatch.serve.app import create_app

    with TestClient(create_app(tmp_path / "out" / "rank0", cache=None)) as client:  # node 0's folder alone
        body = client.get("/api/band", params={"run": f"dist/{dirs[0].name}", "metric": "data_time"}).json()
    assert body["ranks"] == [0, 1]
    points = {p[0]: p[1:] for p in body["points"]}
    assert len(points) >= 25, "every step but the last (its timings would go out with a next step)"
    for step, (lo, mean, hi) in points.items():
        values = [own[0][step], own[1][step]]
        assert (lo, mean, hi) == pytest.approx((min(values), sum(values) / 2, max(values)), rel=1e-5, abs=1e-6), step
    slow = [s for s in points if own[1][s] > 0.1]  # once the prefetch ran dry, rank 1 waits for its data
    assert len(slow) >= 5 and all(points[s][2] == pytest.approx(own[1][s], rel=1e-5) for s in slow), slow


LOCAL_NORMS = """() => {
  const el = document.querySelector('#chart-grad_norm');
  const c = el && echarts.getInstanceByDom(el);
  if (!c) return null;
  return Object.fromEntries(c.getOption().series.filter((s) => s.type === 'line')
    .map((s) => [s.name, s.data.filter((p) => p[1] !== '-')]));
}"""

LAYERS_HEAT = """() => {
  const c = echarts.getInstanceByDom(document.querySelector('#chart-layers'));
  if (!c) return null;
  const o = c.getOption();
  return {title: o.title[0].text, rows: o.yAxis[0].data, cells: o.series[0].data.length};
}"""


@pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason="Debian's chromium is not installed (scripts/setup.sh)")
def test_the_run_page_and_the_report_show_each_ranks_local_norm_and_the_moments_heat_map(
    bad_batch_job: BadBatchJob, tmp_path: Path, artifacts_dir: Path, browser: Browser
) -> None:
    from test_dashboard_browser import wait_for

    from mindwatch.cli import main
    from mindwatch.serve.process import DashboardProcess

    run_dir = bad_batch_job.shared
    local = {r: {rec["step"]: rec["local_grad_norm"] for rec in raw_records(run_dir / f"metrics.rank{r}.jsonl")} for r in (0, 1)}
    head = json.loads((run_dir / "layers.rank0" / "layers.json").read_text())
    assert head["stats"][-2:] == ["adam_m_norm", "adam_v_norm"]
    with DashboardProcess(bad_batch_job.out, port=0) as dash:
        page = browser.new_page(viewport={"width": 1400, "height": 1200})
        page.goto(f"{dash.url}#/run/{quote('dist/' + run_dir.name, safe='')}?rank=all")  # every rank's lines
        card = wait_for(
            lambda: (
                (v := page.evaluate(LOCAL_NORMS)) and all(len(v.get(f"local_grad_norm r{r}", [])) >= 10 for r in (0, 1)) and v
            ),
            60,
            "each rank's local gradient norm in the gradient-norm card",
        )
        for r in (0, 1):  # each rank's own values (the points the chart keeps)
            points = {int(x): y for x, y in card[f"local_grad_norm r{r}"]}
            assert len(points) >= 10 and all(y == pytest.approx(local[r][x], rel=1e-5) for x, y in points.items()), r
        top = max(card["local_grad_norm r1"], key=lambda p: p[1])
        assert int(top[0]) == 60 and top[1] == pytest.approx(local[1][60], rel=1e-5), "rank 1's spike is drawn"
        page.select_option("#layer-stat", "adam_v_norm")
        heat = wait_for(lambda: (v := page.evaluate(LAYERS_HEAT)) and "Adam v" in v["title"] and v["cells"] and v, 30, "the map")
        assert sorted(heat["rows"]) == sorted(head["layers"])
        page.query_selector("#chart-layers").scroll_into_view_if_needed()
        page.screenshot(path=str(artifacts_dir / "run_page_local_norms_and_moments_1400.png"), full_page=True)
    out = tmp_path / "report.html"
    assert main(["report", str(run_dir), "-o", str(out)]) == 0
    html = out.read_text()
    data = json.loads(re.search(r'<script id="mindwatch-data" type="application/json">(.*?)</script>', html, re.S).group(1))
    rows = np.fromfile(run_dir / "layers.rank0" / "values.f32", "<f4").reshape(-1, len(head["stats"]), len(head["layers"]))
    for k, stat in ((3, "adam_m_norm"), (4, "adam_v_norm")):
        assert data["layers"]["last"][stat] == pytest.approx(rows[-1, k].tolist(), rel=1e-6), stat
        assert [m[0] for m in data["layers"]["maps"]].count(stat) == 1, "a heat map of it"
    chart = next(m for m in data["metrics"] if m["name"] == "local_grad_norm")
    assert [s["label"] for s in chart["series"]] == ["rank 0", "rank 1"], "a line per rank"
    top = max(chart["series"][1]["points"], key=lambda p: p[1])
    assert top[0] == 60 and top[1] == pytest.approx(local[1][60], rel=1e-5)
