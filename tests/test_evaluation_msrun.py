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
