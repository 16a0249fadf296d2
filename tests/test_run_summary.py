"""The runs page, the report and ``mindwatch runs`` say the same about a run: best loss, ranks, state, max grad norm."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from starlette.testclient import TestClient

from mindwatch.analysis.summary import list_run as listing
from mindwatch.analysis.summary import summarize_run
from mindwatch.report.html import write_report
from mindwatch.serve.app import create_app
from mindwatch.store.layout import write_json_atomic
from mindwatch.store.reader import open_run
from mindwatch.store.writer import RunWriter

NAN = float("nan")
#: rank -> the losses it writes; rank 1's lowest is lower than rank 0's, and rank 0 has a NaN.
LOSSES = {0: [3.0, 2.0, NAN, 1.5, 1.8], 1: [2.9, 1.1, 0.9, 1.0, 1.2]}
GRAD_NORMS = [2.0, 1.3e4, NAN, float("inf"), 5.0]


def write_run(run_dir: Path, losses: dict[int, list[float]], state: str = "finished") -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(run_dir / "meta.json", {"run_id": run_dir.name, "project": "p", "world_size": len(losses)})
    t = time.time()
    for rank, values in losses.items():
        w = RunWriter(run_dir, rank=rank)
        w.write([{"step": i + 1, "t": t + i, "rank": rank, "loss": v, "grad_norm": GRAD_NORMS[i]} for i, v in enumerate(values)])
        w.close(state)


def lowest_finite(values: list[float]) -> float:
    return min(v for v in values if math.isfinite(v))


def test_every_view_says_the_same_best_loss_ranks_and_state(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    write_run(logs / "p" / "two", LOSSES)
    write_run(logs / "p" / "one", {0: LOSSES[1]}, state="stopped")
    expected = {"two": (lowest_finite(LOSSES[0]), 2, "finished"), "one": (lowest_finite(LOSSES[1]), 1, "stopped")}
    with TestClient(create_app(logs)) as c:  # type: ignore[arg-type]
        page = {r["run_id"]: r for r in c.get("/api/runs").json()["runs"]}
    for name, (best, ranks, state) in expected.items():
        run = open_run(logs / "p" / name)
        full, cheap = summarize_run(run), listing(run.path)
        assert full.best_loss == cheap.best_loss == page[name]["best_loss"] == best  # the lowest rank's lowest finite loss
        assert full.state == cheap.state == page[name]["state"] == state
        assert full.world_size == cheap.world_size == page[name]["world_size"] == ranks
        html = write_report([run], tmp_path / f"{name}.html")[0].read_text()
        row = html[html.index(">ranks<") :][:200]
        assert f">{ranks}</td>" in row.split("</tr>")[0], row  # "1" for a one-rank run, not the rank's number 0


def test_the_largest_grad_norm_is_the_largest_finite_one(tmp_path: Path) -> None:
    write_run(tmp_path / "p" / "run", {0: LOSSES[0]})
    s = summarize_run(open_run(tmp_path / "p" / "run"))
    finite = [v for v in GRAD_NORMS if math.isfinite(v)]
    assert (s.max_grad_norm, s.max_grad_norm_step) == (max(finite), GRAD_NORMS.index(max(finite)) + 1)
    assert json.dumps(s.to_dict(), allow_nan=False)  # nothing non-finite in the summary's numbers


def test_the_dashboard_and_the_report_draw_the_same_curve(tmp_path: Path) -> None:
    import re

    from mindwatch.report.html import render_report

    logs = tmp_path / "logs"
    write_run(logs / "p" / "one", {0: LOSSES[0]})
    expected = [[i + 1, v if math.isfinite(v) else None] for i, v in enumerate(LOSSES[0])]  # what was written
    with TestClient(create_app(logs)) as c:  # type: ignore[arg-type]
        api = c.get("/api/series", params={"run": "p/one", "metric": "loss"}).json()
    html = render_report([open_run(logs / "p" / "one")])
    data = json.loads(re.search(r'<script id="mindwatch-data" type="application/json">(.*?)</script>', html, re.S).group(1))
    (loss,) = [m for m in data["metrics"] if m["name"] == "loss"]
    assert api["points"] == loss["series"][0]["points"] == expected
    assert api["nonfinite"] == loss["series"][0]["nonfinite"] == [[3, "nan"]]  # one wire shape


#: rank -> its evaluations after steps 2 and 4: (eval/loss, eval/accuracy); rank 0's second eval/loss is NaN.
EVALS = {0: [(0.9, 0.55), (NAN, 0.6)], 1: [(0.8, 0.5), (0.7, 0.65)]}


def write_evaluated_run(run_dir: Path, evals: dict[int, list[tuple[float, float]]], config: dict | None = None) -> None:
    """Train steps 1-4 with a loss, an evaluation after steps 2 and 4 (the last record of the file: no loss in it)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    meta = {"run_id": run_dir.name, "project": "p", "world_size": len(evals), "config": config or {}}
    write_json_atomic(run_dir / "meta.json", meta)
    t = time.time()
    for rank, results in evals.items():
        w = RunWriter(run_dir, rank=rank, **{f"eval_{k}": v for k, v in (config or {}).get("evaluation", {}).items()})
        records = []
        for step in range(1, 5):
            records.append({"step": step, "t": t + step, "rank": rank, "epoch": (step + 1) // 2, "loss": LOSSES[rank][step]})
            if step % 2 == 0:
                loss, accuracy = results[step // 2 - 1]
                records.append(
                    {"step": step, "t": t + step, "rank": rank, "epoch": step // 2, "eval/loss": loss, "eval/accuracy": accuracy}
                )
        w.write(records)
        w.close("finished")


def test_every_view_says_the_same_best_evaluation_and_the_final_loss_survives_it(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    write_evaluated_run(logs / "p" / "two", EVALS)  # rank 0's best eval/loss (0.9) is the one listed, as its best loss
    write_evaluated_run(logs / "p" / "acc", {0: EVALS[1]}, {"evaluation": {"primary": "accuracy", "mode": None}})
    expected = {"two": ("eval/loss", 0.9, 2, 1, "min"), "acc": ("eval/accuracy", 0.65, 4, 2, "max")}
    with TestClient(create_app(logs)) as c:  # type: ignore[arg-type]
        body = c.get("/api/runs", params={"columns": "best_eval", "sort": "best_eval"}).json()
        down = c.get("/api/runs", params={"sort": "-best_eval", "filter": "best_eval > 0.7"}).json()
    page = {r["run_id"]: r for r in body["runs"]}
    assert [r["run_id"] for r in body["runs"]] == ["acc", "two"] and [r["run_id"] for r in down["runs"]] == ["two"]
    assert body["labels"]["best_eval"] == "best eval"
    for name, (metric, value, step, epoch, mode) in expected.items():
        run = open_run(logs / "p" / name)
        full, cheap, shown = summarize_run(run), listing(run.path), page[name]
        for s in (full.to_dict(), cheap.to_dict(), shown):
            assert [s[f] for f in ("best_eval_metric", "best_eval", "best_eval_step", "best_eval_epoch", "best_eval_mode")] == [
                metric,
                value,
                step,
                epoch,
                mode,
            ]
        assert shown["values"]["best_eval"] == value and shown["value_notes"] == {"best_eval": metric}  # the cell names it
        # the last record is an evaluation's: the final loss is the last train step's all the same
        assert full.final_loss == cheap.final_loss == shown["final_loss"] == LOSSES[0][4]
        html = write_report([run], tmp_path / f"{name}.html")[0].read_text()
        row = html[html.index('<tr data-key="best eval">') :].split("</tr>")[0]
        assert f"{value:g} ({metric}, step {step}, epoch {epoch})" in row, row
