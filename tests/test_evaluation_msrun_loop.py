"""Evaluations in a loop of your own under ``msrun`` with 2 workers (a module of its own, so that the suite runs it
beside the ``Model.fit`` launches of test_evaluation_msrun.py, not after them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_distributed import only_run_dir
from test_evaluation import first_stop

import mindwatch

pytestmark = pytest.mark.slow


def test_a_loop_that_evaluates_on_rank_0_alone_is_not_held_by_a_collective(tmp_path: Path) -> None:
    """Without early stopping nothing acts on an evaluation: rank 0's ``run.eval`` calls no collective the other rank
    would have to join, and both ranks train to the end."""
    from test_distributed import msrun_to_the_end

    msrun_to_the_end(tmp_path / "logs", "--save-dir", str(tmp_path / "out"), "--steps", "20", "--loop", "--eval-rank", "0")
    run = mindwatch.open_run(only_run_dir(tmp_path / "out" / "dist"))
    assert run.series("eval/loss", rank=0).step.tolist() == [5, 10, 15, 20]
    assert not len(run.series("eval/loss", rank=1)) and run.statuses[1]["state"] == "finished"
    assert run.statuses[0]["state"] == "finished" and run.series("loss", rank=1).step.tolist()[-1] == 20


def test_a_loops_early_stop_lands_on_both_ranks_each_in_its_own_folder_and_a_relaunch_is_quiet(tmp_path: Path) -> None:
    """A loop under msrun, each rank recording in a folder of its own (no shared file system), every rank evaluating:
    early stopping on rank 0's evaluation stops both ranks at the same step, the one whose evaluation decided. A
    relaunch of the same run (the same run name) continues its step numbers and judges its own evaluations afresh: it
    stops 20 steps on, as the first did, with one alert of its own."""
    from test_distributed import msrun_to_the_end, raw_records

    scripted = [0.9, 0.7, 0.8, 0.75, 0.72, 0.6, 0.5, 0.4]  # the 3rd and 4th do not beat 0.7: patience 2 stops at the 4th
    stop = first_stop(scripted, 2)
    config = {"run_name": "evaluated", "alerts": {"early_stopping": {"patience": 2}}}
    for launch in ("first", "again"):
        msrun_to_the_end(
            tmp_path / f"logs_{launch}",
            *("--save-dir", str(tmp_path / "out"), "--steps", "40", "--loop", "--save-dir-per-rank"),
            *("--eval-scripted", json.dumps(scripted), "--config", json.dumps(config)),
        )
    for r in (0, 1):
        run_dir = tmp_path / "out" / f"rank{r}" / "dist" / "evaluated"
        steps = [rec["step"] for rec in raw_records(run_dir / f"metrics.rank{r}.jsonl") if "loss" in rec]
        decided = 5 * (stop + 1)
        assert steps == list(range(1, 2 * decided + 1)), f"rank {r}: each training stops {decided} steps in"
        status = json.loads((run_dir / f"status.rank{r}.json").read_text())
        assert status["state"] == "stopped" and "early stopping: eval/loss has not improved for 2" in status["reason"]
        evals = [rec["eval/loss"] for rec in raw_records(run_dir / f"metrics.rank{r}.jsonl") if "eval/loss" in rec]
        assert evals == pytest.approx([v + r / 100 for v in scripted[: stop + 1]] * 2), f"rank {r} records its own"
    alerts = raw_records(tmp_path / "out" / "rank0" / "dist" / "evaluated" / "alerts.jsonl")
    assert [a["rule"] for a in alerts if a["rule"] == "early_stopping"] == ["early_stopping"] * 2, "one a training"
