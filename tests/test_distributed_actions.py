"""Actions that one rank asks for are carried out by every rank at the same step (real msrun, 2 workers).

Rank 1's data pipeline stalls for 1.5 s at batch 60 (batch 30 in PyNative; rank 0's does not): a
``data_time`` limit that only rank 1 crosses asks for an action. Every batch takes at least 20 ms on both ranks, so the steps have
a steady rhythm the coordination can plan with. Each launch costs ~30 s here.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

import numpy as np
import pytest

# the msrun launch helpers of the distributed tests (same process-group cleanup)
from conftest import wait_for
from test_distributed import (
    SCRIPT,
    Launch,
    base_env,
    free_port,
    last_printed_step,
    msrun_to_the_end,
    only_run_dir,
    raw_records,
)

import mindwatch
from mindwatch.analysis.summary import summarize_run
from mindwatch.report.html import render_report

pytestmark = pytest.mark.slow

LR = 0.02  # train_dp.py's Momentum learning rate


def launch_with_actions(
    tmp: Path, actions: list[str], *, mode: str = "graph", steps: int = 160, extra: tuple[str, ...] = ()
) -> Path:
    """One msrun job whose only rank-1 limit asks for ``actions``; returns its run dir.

    Rank 1's spike waits until its training has taken every batch before it (train_dp.py), so the step waits the
    whole spike however slow the machine: a PyNative step takes ~90 ms here, several times that on a loaded machine,
    and a queue filled while steps were slow once hid 1.5 s of it.
    """
    pace, spike_at, spike_secs = ("0.02", "60", "1.5") if mode == "graph" else ("0.1", "30", "1.5")
    config = {
        "callback": {"params": {"warn_on_value": {"data_time": 0.5}}},
        "alerts": {"thresholds": {"actions": actions}, "stall_timeout": 8.0},
        "distributed": {"coordination": {"poll_secs": 0.05, "margin_secs": 0.5}},
    }
    msrun_to_the_end(
        tmp / "logs",
        *("--save-dir", str(tmp / "out"), "--steps", str(steps), "--mode", mode),
        *("--pace-secs", pace, "--spike-rank", "1", "--spike-at", spike_at, "--spike-secs", spike_secs),
        *("--save-params", str(tmp / "params"), "--config", json.dumps(config)),
        *extra,
    )
    return only_run_dir(tmp / "out" / "dist")


def interventions(run_dir: Path, action: str) -> dict[int, dict]:
    found = [a for a in raw_records(run_dir / "alerts.jsonl") if a["rule"] == "intervention" and a["actions"] == [action]]
    by_rank = {a["rank"]: a for a in found}
    assert len(by_rank) == len(found) == 2, f"one {action} per rank: {found}"
    return by_rank


def the_rank1_alert(run_dir: Path) -> dict:
    limits = [a for a in raw_records(run_dir / "alerts.jsonl") if a["rule"] == "threshold"]
    assert [a["rank"] for a in limits] == [1], f"only rank 1 crosses the data_time limit: {limits}"
    return limits[0]


@pytest.mark.parametrize(
    ("mode", "loop"), [("graph", ""), ("pynative", ""), ("pynative", "loop_every"), ("pynative", "grad_reducer")]
)
def test_a_stop_that_rank_1_asks_for_stops_both_ranks_at_one_step(tmp_path: Path, mode: str, loop: str) -> None:
    """Through Model.train's callback, and through a loop of its own (start_run, ``ms.jit``: ``--loop``), whose
    signal is summed every ``loop_every`` steps or rides on its gradient reduction (``mw.DistributedGradReducer``)."""
    extra = {"": (), "loop_every": ("--loop",), "grad_reducer": ("--loop", "--signal-in-reducer")}[loop]
    run_dir = launch_with_actions(tmp_path, ["stop"], mode=mode, steps=160 if mode == "graph" else 50, extra=extra)
    alert = the_rank1_alert(run_dir)
    stops = interventions(run_dir, "stop")
    steps = {r: [rec["step"] for rec in raw_records(run_dir / f"metrics.rank{r}.jsonl")] for r in (0, 1)}
    last = steps[0][-1]
    assert steps[1][-1] == last < (160 if mode == "graph" else 50), "both ranks end at the same step, before the data ran out"
    assert stops[0]["step"] == stops[1]["step"] == stops[0]["at_step"] == last
    assert last > alert["step"], "the agreed step lies ahead of the alert"
    for r in (0, 1):
        status = json.loads((run_dir / f"status.rank{r}.json").read_text())
        assert status["state"] == "stopped" and status["last_step"] == last
        assert status["reason"] == f"stopped by mindwatch: {alert['message']}"
    assert mindwatch.open_run(run_dir).state == "stopped"
    assert json.loads((run_dir / "meta.json").read_text())["coordination"] == "collective", "through the step's collective"
    if loop != "loop_every":  # our train cell, or mw.DistributedGradReducer: each rank's own norm, before the reduction
        records = {r: {rec["step"]: rec for rec in raw_records(run_dir / f"metrics.rank{r}.jsonl")} for r in (0, 1)}
        assert all("local_grad_norm" in rec for r in (0, 1) for rec in records[r].values())
        for step, rec in records[0].items():  # the mean of the ranks' gradients is no longer than the mean of their norms
            mean_local = (rec["local_grad_norm"] + records[1][step]["local_grad_norm"]) / 2
            assert rec["grad_norm"] <= mean_local * (1 + 1e-4), step


def test_lr_backoff_and_checkpoint_that_rank_1_asks_for_happen_on_both_ranks_at_one_step(tmp_path: Path) -> None:
    run_dir = launch_with_actions(tmp_path, ["lr_backoff", "checkpoint"])
    the_rank1_alert(run_dir)
    backoffs = interventions(run_dir, "lr_backoff")
    at = backoffs[0]["step"]
    assert backoffs[1]["step"] == at and backoffs[0]["lr_after"] == pytest.approx(LR / 2)
    for r in (0, 1):
        lrs = {rec["step"]: rec["lr"] for rec in raw_records(run_dir / f"metrics.rank{r}.jsonl")}
        assert lrs[at] == pytest.approx(LR) and lrs[at + 1] == pytest.approx(LR / 2), f"rank {r}"
        assert all(v == pytest.approx(LR / 2) for s, v in lrs.items() if s > at)
    # data parallel with one learning rate: the replicas stay identical
    weights = [np.load(tmp_path / f"params.rank{r}.npz") for r in (0, 1)]
    assert sorted(weights[0].files) == sorted(weights[1].files)
    for name in weights[0].files:
        np.testing.assert_allclose(weights[0][name], weights[1][name], rtol=0, atol=1e-6, err_msg=name)
    checkpoints = interventions(run_dir, "checkpoint")
    assert checkpoints[0]["step"] == checkpoints[1]["step"] == at
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
        f"anomaly_rank0_step{at}.ckpt",
        f"anomaly_rank1_step{at}.ckpt",
    ]


# -- a dead rank: kill -9 of rank 1 while rank 0 lives on (a manual dynamic-cluster launch: no msrun to kill it) --


def test_a_killed_rank_is_named_and_with_on_rank_lost_stop_the_survivor_ends_stopped(tmp_path: Path) -> None:
    out = tmp_path / "out"
    port = free_port()
    config = {"distributed": {"on_rank_lost": "stop"}}
    launch = Launch()
    try:
        for i, role in enumerate(("MS_SCHED", "MS_WORKER", "MS_WORKER")):
            env = base_env()
            env.update(MS_ROLE=role, MS_WORKER_NUM="2", MS_SCHED_HOST="127.0.0.1", MS_SCHED_PORT=str(port))
            args = ("--save-dir", str(out), "--steps", "2000", "--pace-secs", "0.02", "--print-steps")
            args += ("--config", json.dumps(config))
            launch.start([sys.executable, str(SCRIPT), *args], env, tmp_path / f"{role}_{i}.log")
        status1 = wait_for(lambda: next(iter(out.glob("dist/*/status.rank1.json")), None), 240)
        run_dir = status1.parent
        wait_for(
            lambda: (run_dir / "metrics.rank1.jsonl").exists() and len(raw_records(run_dir / "metrics.rank1.jsonl")) >= 30, 120
        )
        pid = json.loads(status1.read_text())["pid"]
        os.kill(pid, signal.SIGKILL)
        killed = time.time()
        lost = wait_for(lambda: next((a for a in alerts(run_dir) if a["rule"] == "rank_lost"), None), 30)
        final0 = wait_for(lambda: final_status(run_dir / "status.rank0.json"), 60)
    finally:
        launch.kill()
    host = socket.gethostname()
    run = mindwatch.open_run(run_dir)
    configured = run.meta["config"]["distributed"]  # what this run was configured with
    assert lost["t"] - killed < configured["liveness_secs"] + 5.0, "named within liveness_secs (+ 5 s: a loaded machine)"
    assert lost["rank"] == 1 and lost["reported_by"] == 0
    last_step = named_last_step(lost, run_dir, tmp_path, dead=1, survivor=0)
    assert lost["message"] == f"rank 1 is gone (pid {pid} on host {host} exited; last step {last_step})"
    # on_rank_lost: stop: rank 0 ends stopped, long before MindSpore's 30 s collective timeout
    assert final0["state"] == "stopped" and "rank 1 is gone" in final0["reason"]
    assert final0["updated_at"] - lost["t"] < configured["stop_grace"] + 5.0, "ended within stop_grace (+ 5 s: a loaded machine)"
    assert run.states() == {0: "stopped", 1: "lost"} and run.state == "lost"
    died = f"rank 1 died at step {last_step} (pid {pid} on host {host} exited); the others ended"
    assert summarize_run(run).error.startswith(died)
    assert f"lost a rank: {died}" in render_report([run])  # the report's banner
    from starlette.testclient import TestClient

    from mindwatch.serve.app import create_app

    with TestClient(create_app(out)) as c:  # the dashboard's banner
        status = c.get("/api/run", params={"run": f"dist/{run_dir.name}"}).json()["status"]
    assert status["state"] == "lost" and status["error"].startswith(died)
    assert status["ranks"]["1"]["state"] == "lost"


def named_last_step(lost: dict, run_dir: Path, log_dir: Path, *, dead: int, survivor: int) -> int:
    """A ``rank_lost`` alert's last step, checked against what both ranks did: at least the last step the dead rank's
    writer flushed before kill -9 (the survivor names the step its own worker last saw, which lags the training as
    that writer does), at most the last step the survivor printed (train_dp.py ``--print-steps``), which is at most
    one more than the dead rank printed (the gradient all-reduce holds them together)."""
    written = raw_records(run_dir / f"metrics.rank{dead}.jsonl")[-1]["step"]
    printed, finished = last_printed_step(log_dir, dead), last_printed_step(log_dir, survivor)
    step = lost["step"]
    assert written <= step <= finished <= printed + 1, (written, step, finished, printed)
    return step


def alerts(run_dir: Path) -> list[dict]:
    return raw_records(run_dir / "alerts.jsonl") if (run_dir / "alerts.jsonl").exists() else []


def final_status(path: Path) -> dict | None:
    try:
        st = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return st if st.get("state") in ("stopped", "failed", "finished") else None
