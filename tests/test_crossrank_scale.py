"""What makes rank 0's cross-rank pass and the dashboard's band scale to 1,000 ranks, checked against plain Python."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import numpy as np
import pytest

from mindwatch.alerts.crossrank import CrossRankWatch, StragglerRule, medians_of_the_others
from mindwatch.config import load_config
from mindwatch.store.bandfiles import read_band_file
from mindwatch.store.layout import RunLayout, write_json_atomic
from mindwatch.store.writer import RunWriter


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
    watch = CrossRankWatch(run_dir, ranks, lambda alert: None, cfg.distributed, cooldown_secs=0)
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
