"""The runs table on the server: config, tag and summary columns, the check-language filter, sorting, JSON-safe values."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from mindwatch.analysis.summary import list_run as listing
from mindwatch.checks.evaluate import evaluate
from mindwatch.checks.language import RuleError, parse_rule
from mindwatch.checks.listing import RunFilter, flatten, run_columns
from mindwatch.serve.app import create_app
from mindwatch.store.layout import write_json_atomic
from mindwatch.store.reader import open_run
from mindwatch.store.writer import RunWriter

LOSSES = {
    "a": [3.0, 1.2, 1.6, 1.4],
    "b": [2.5, 2.0, 2.2, 2.1],
    "c": [2.0, 0.9, float("nan"), float("nan")],
}
CONFIGS = {
    "a": {"optimizer": {"lr": 1e-2, "name": "adamw"}, "batch_size": 8, "layers": [1, 2]},
    "b": {"optimizer": {"lr": 1e-4, "name": "sgd"}, "batch_size": 16},
    "c": {"optimizer": {"lr": 3e-3, "name": "adamw"}},
}


@pytest.fixture
def logdir(tmp_path: Path) -> Path:
    for name, losses in LOSSES.items():
        d = tmp_path / "logs" / "team" / name
        w = RunWriter(d, 0)
        w.write([{"step": s, "t": 1e9 + s, "loss": v} for s, v in enumerate(losses, start=1)])
        w.close("finished")
        meta = {"run_id": name, "project": "team", "started_at": 1e9, "tags": {"mode": "graph" if name != "b" else "pynative"}}
        write_json_atomic(d / "meta.json", {**meta, "config": CONFIGS[name]})
    return tmp_path / "logs"


def rows(logdir: Path) -> dict[str, dict]:  # type: ignore[type-arg]
    return {p.name: run_columns(listing(p).to_dict()) for p in sorted((logdir / "team").iterdir())}


def test_columns_are_config_paths_tags_and_the_summary_checked_against_the_records(logdir: Path) -> None:
    r = rows(logdir)
    assert flatten(CONFIGS["a"]) == {"optimizer.lr": 1e-2, "optimizer.name": "adamw", "batch_size": 8, "layers": "[1, 2]"}
    assert r["a"]["config.optimizer.lr"] == 1e-2 and r["a"]["tag.mode"] == "graph"
    for name, losses in LOSSES.items():
        finite = [v for v in losses if math.isfinite(v)]
        assert r[name]["best_loss"] == min(finite)
        assert r[name]["steps"] == len(losses)
        # the final loss agrees with what `mindwatch check` reads from the metrics
        run_final = evaluate(open_run(logdir / "team" / name), "final(loss) == final(loss)").values["final(loss)"]
        assert r[name]["final_loss"] == pytest.approx(run_final, nan_ok=True)


def test_the_filter_reads_config_keys_by_leaf_or_path_and_the_summary(logdir: Path) -> None:
    r = rows(logdir)

    def kept(rule: str) -> list[str]:
        f = RunFilter(rule)
        return [n for n, row in r.items() if f(row)]

    assert kept("lr > 1e-3") == ["a", "c"]
    assert kept("optimizer.lr > 1e-3 and final(loss) < 2") == ["a"]  # c's final loss is NaN: compares false
    assert kept("config.optimizer.name == 'adamw' and min(loss) < 1") == ["c"]
    assert kept("mode == 'pynative' or batch_size >= 16") == ["b"]
    assert kept("steps() == 4 and alerts() == 0 and state() == 'finished'") == ["a", "b", "c"]
    assert kept("batch_size > 0") == ["a", "b"]  # c has no batch_size: missing, not kept
    with pytest.raises(RuleError, match="other functions need `mindwatch check`"):
        kept("max(grad_norm) < 10")
    with pytest.raises(RuleError, match="expected a value"):
        RunFilter("lr >")
    # `mindwatch check` still says where a metric goes
    with pytest.raises(RuleError, match=r"metrics go inside a function, e.g. final\(loss\)"):
        parse_rule("loss < 2")


def test_api_runs_filters_sorts_with_missing_last_and_answers_a_bad_filter_with_400(logdir: Path) -> None:
    c = TestClient(create_app(logdir))  # type: ignore[arg-type]
    body = c.get("/api/runs", params={"columns": "config.batch_size,final_loss", "sort": "-config.batch_size"}).json()
    assert [r["run_id"] for r in body["runs"]] == ["b", "a", "c"]  # 16, 8, then the run without the key
    assert body["runs"][2]["values"] == {"config.batch_size": None, "final_loss": "nan"}  # NaN travels as a string
    assert "config.optimizer.lr" in body["columns"] and "tag.mode" in body["columns"] and body["total"] == 3
    assert "config" not in body["runs"][0]
    up = c.get("/api/runs", params={"sort": "best_loss", "filter": "name == 'adamw'"}).json()
    assert [r["run_id"] for r in up["runs"]] == ["c", "a"]
    bad = c.get("/api/runs", params={"filter": "lr >> 2"})
    assert bad.status_code == 400 and "filter:" in bad.json()["error"]
