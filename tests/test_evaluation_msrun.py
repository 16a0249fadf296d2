"""Early stopping under ``msrun`` with 2 workers: every rank stops at the evaluation the ranks' mean decides.

The reference is MindSpore's own: each rank's callback reads ``eval_results`` at each evaluation; the test takes the
mean over the ranks and counts the documented patience on it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from test_distributed import REPO, VENV_BIN, base_env, free_port, only_run_dir
from test_evaluation import first_stop

import mindwatch

pytestmark = pytest.mark.slow

SCRIPT = REPO / "tests" / "dist_scripts" / "train_eval.py"


def test_early_stopping_stops_every_rank_at_the_evaluation_their_mean_decides(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    cmd = [
        str(VENV_BIN / "msrun"),
        "--worker_num=2",
        "--local_worker_num=2",
        f"--master_port={free_port()}",
        "--join=True",
        f"--log_dir={logs}",
        str(SCRIPT),
        *("--save-dir", str(tmp_path / "out"), "--out", str(tmp_path / "seen")),
    ]
    done = subprocess.run(cmd, env=base_env(), capture_output=True, text=True, timeout=300)
    worker_logs = "".join(p.read_text()[-2000:] for p in sorted(logs.glob("worker_*.log")))
    assert done.returncode == 0, done.stdout[-2000:] + worker_logs

    seen = [json.loads((tmp_path / f"seen.rank{r}.json").read_text()) for r in (0, 1)]
    own = [[r["eval_loss"] for r in s["results"]] for s in seen]
    assert own[0] != own[1], "the ranks' shards must differ"
    n = min(map(len, own))
    mean = np.mean([o[:n] for o in own], axis=0).tolist()
    stop = first_stop(mean, 5)
    assert stop is not None
    per_epoch = seen[0]["at"][0]
    for r in (0, 1):
        assert len(own[r]) == stop + 1, f"rank {r}: no evaluation after the one that decided"
        assert seen[r]["trained"] == (stop + 1) * per_epoch, f"rank {r}: no training step after that epoch"
    run = mindwatch.open_run(only_run_dir(tmp_path / "out" / "eval"))
    for r in (0, 1):
        recorded = run.series("eval/eval_loss", rank=r)
        assert recorded.value.tolist() == pytest.approx(own[r], rel=1e-6), f"rank {r} records its own"
        assert run.statuses[r]["state"] == "stopped"
        assert run.statuses[r]["reason"].startswith("stopped by mindwatch: early stopping: eval/eval_loss has not improved")
    decided = [a for a in run.alerts if a["rule"] == "early_stopping"]
    assert [(a["rank"], a["step"]) for a in decided] == [(0, (stop + 1) * per_epoch)], "rank 0 speaks for the run"
    best = int(np.argmin(mean[: stop + 1]))
    assert decided[0]["best_step"] == (best + 1) * per_epoch and decided[0]["value"] == pytest.approx(mean[stop], rel=1e-6)


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
