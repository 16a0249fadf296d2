"""A job relaunched at once with the same ``run_name``, as schedulers do (real ``msrun``, 2 workers).

The relaunch never breaks the training and never cries wolf: every rank numbers its steps alike (rank 0 announces
the step the run resumes after), an earlier attempt's files and lingering processes raise no ``rank_lost``, and
the end message names no lost rank.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import psutil
import pytest
from conftest import wait_for
from test_distributed import Launch, Webhooks, msrun, only_run_dir, raw_records

import mindwatch
from mindwatch.store.jsonl import read_last_record

pytestmark = pytest.mark.slow


def relaunch_config(hooks: Webhooks, **more: object) -> str:
    return json.dumps({"run_name": "relaunch", "resume": "allow", "notify": [{"type": "webhook", "url": hooks.url}], **more})


def last_step(metrics: Path) -> int:
    """The step of the last whole record in ``metrics`` (0: none yet); a line being written is not one."""
    return (read_last_record(metrics) or {}).get("step", 0)


def wait_gone(pids: list[int], timeout: float) -> None:
    """Until every one of ``pids`` has exited (the old attempt's lingering workers), up to ``timeout`` s."""
    deadline = time.monotonic() + timeout
    for pid in pids:
        try:
            psutil.Process(pid).wait(max(0.1, deadline - time.monotonic()))
        except psutil.TimeoutExpired:
            os.kill(pid, signal.SIGKILL)
        except psutil.Error:
            pass


def lost_alerts(run_dirs: list[Path], since: float) -> list[dict]:
    alerts = [a for d in run_dirs if (d / "alerts.jsonl").exists() for a in raw_records(d / "alerts.jsonl")]
    return [a for a in alerts if a["rule"] == "rank_lost" and a["t"] >= since]


def relaunch_ends(hooks: Webhooks, rank0_dir: Path) -> list[tuple[str, dict]]:
    """The end messages the relaunch's rank 0 sent: ``(state, lost_ranks)``."""
    pid = json.loads((rank0_dir / "status.rank0.json").read_text())["pid"]
    return [(b["state"], b.get("lost_ranks") or {}) for p, b in hooks.posts if p == pid and b.get("event") == "end"]


def test_a_loop_with_a_folder_per_node_relaunched_after_rank_0_is_killed_numbers_both_ranks_alike(tmp_path: Path) -> None:
    """Attempt 1 is killed at a step that is no multiple of ``loop_every`` (rank 0 -9, then the job); the relaunch
    resumes there on both ranks, though rank 1's folder knows nothing of rank 0's."""
    out, hooks = tmp_path / "out", Webhooks()
    run_dirs = [out / f"rank{r}" / "dist" / "relaunch" for r in (0, 1)]
    common = ("--save-dir", str(out), "--save-dir-per-rank", "--loop", "--mode", "pynative")
    try:
        first = Launch()
        try:
            msrun(
                first, tmp_path / "logs1", *common, "--steps", "2000", "--pace-secs", "0.02", "--config", relaunch_config(hooks)
            )
            wait_for(lambda: last_step(run_dirs[0] / "metrics.rank0.jsonl") >= 33, 240)
            first.remember_children()
            pid0 = json.loads((run_dirs[0] / "status.rank0.json").read_text())["pid"]
            os.kill(pid0, signal.SIGKILL)
        finally:
            first.kill()
        wait_gone(first.alive(), 30)
        # the relaunch's sums fall between resumed steps: every one of them on a step no multiple of loop_every
        resumed = last_step(run_dirs[0] / "metrics.rank0.jsonl")
        every = next(k for k in (7, 8, 9) if resumed % k)
        config = relaunch_config(hooks, distributed={"coordination": {"loop_every": every}})
        relaunched = time.time()
        second = Launch()
        try:
            msrun(second, tmp_path / "logs2", *common, "--steps", "40", "--config", config)
            codes = second.wait(300)
        finally:
            second.kill()
    finally:
        hooks.close()
    assert codes == [0], (tmp_path / "logs2" / "msrun.out").read_text()[-3000:]
    meta = json.loads((run_dirs[0] / "meta.json").read_text())
    assert [a["attempt"] for a in meta["attempts"]] == [1, 2]
    assert meta["attempts"][0]["last_step"] == resumed >= 33, "the run resumes after the last step rank 0 recorded"
    for rank, run_dir in enumerate(run_dirs):
        steps = [r["step"] for r in raw_records(run_dir / f"metrics.rank{rank}.jsonl") if r["t"] >= relaunched]
        assert steps == list(range(resumed + 1, resumed + 41)), f"rank {rank} numbers the relaunch as rank 0 does"
        status = json.loads((run_dir / f"status.rank{rank}.json").read_text())
        assert (status["state"], status["attempt"], status["last_step"]) == ("finished", 2, resumed + 40)
    assert lost_alerts(run_dirs, relaunched) == [], "the relaunch loses no rank"
    assert relaunch_ends(hooks, run_dirs[0]) == [("finished", {})], "a clean end with a folder per node names no lost rank"
    assert mindwatch.open_run(*run_dirs).state == "finished"


@pytest.mark.parametrize("killed", ["the whole job", "only msrun"])
def test_a_relaunch_at_once_after_an_attempt_that_died_at_step_3_is_quiet(tmp_path: Path, killed: str) -> None:
    """The attempt dies right after recording began and the scheduler relaunches at once: no clock tells the two
    attempts apart, their numbers do. When only msrun dies, its workers linger and train on for a while: they write
    nothing into the relaunched run once it has begun."""
    out, hooks = tmp_path / "out", Webhooks()
    run_dir = out / "dist" / "relaunch"
    common = ("--save-dir", str(out), "--mode", "pynative")
    try:
        first = Launch()
        try:
            msrun(first, tmp_path / "logs1", *common, "--steps", "400", "--pace-secs", "0.05", "--config", relaunch_config(hooks))
            wait_for(lambda: min(last_step(run_dir / f"metrics.rank{r}.jsonl") for r in (0, 1)) >= 3, 240)
            first.remember_children()
            old_workers = [p for p in first.alive() if p != first.procs[0].pid]
            if killed == "the whole job":
                first.kill()
            else:
                first.procs[0].kill()
                first.procs[0].wait()
            relaunched = time.time()
            second = Launch()
            try:
                msrun(second, tmp_path / "logs2", *common, "--steps", "30", "--config", relaunch_config(hooks))
                codes = second.wait(300)
            finally:
                second.kill()
            wait_gone(old_workers, 20)  # the lingering workers end (they finish, or hang in a collective: killed)
        finally:
            first.kill()
    finally:
        hooks.close()
    assert codes == [0], (tmp_path / "logs2" / "msrun.out").read_text()[-3000:]
    meta = json.loads((run_dir / "meta.json").read_text())
    assert [a["attempt"] for a in meta["attempts"]] == [1, 2]
    assert lost_alerts([run_dir], relaunched) == [], "no rank_lost for a process of the attempt before"
    for rank in (0, 1):  # Model.train counts the relaunch's steps from 1 (its data starts over): a rewind of the run
        status = json.loads((run_dir / f"status.rank{rank}.json").read_text())
        assert (status["state"], status["attempt"], status["last_step"]) == ("finished", 2, 30), status
    assert relaunch_ends(hooks, run_dir) == [("finished", {})]
    assert all(not body.get("lost_ranks") for _, body in hooks.posts if body.get("event") == "end"), hooks.posts


def test_a_nan_in_a_loop_with_a_folder_per_node_is_two_messages_and_names_no_lost_rank(tmp_path: Path) -> None:
    """The functional loop (its signal on ``mw.DistributedGradReducer``), a folder per node, a NaN in rank 0's labels
    at step 30 with ``nonfinite: {actions: [stop]}``: both ranks stop on that step; each channel hears the alert and
    the end, and the end names no lost rank."""
    out, hooks = tmp_path / "out", Webhooks()
    config = json.dumps({"alerts": {"nonfinite": {"actions": ["stop"]}}, "notify": [{"type": "webhook", "url": hooks.url}]})
    job = Launch()
    try:
        args = ("--save-dir", str(out), "--save-dir-per-rank", "--loop", "--signal-in-reducer", "--mode", "pynative")
        msrun(job, tmp_path / "logs", *args, "--steps", "60", "--nan-rank", "0", "--nan-at", "30", "--config", config)
        codes = job.wait(300)
    finally:
        job.kill()
        hooks.close()
    assert codes == [0], (tmp_path / "logs" / "msrun.out").read_text()[-3000:]
    run_dirs = [only_run_dir(out / f"rank{r}" / "dist") for r in (0, 1)]
    for rank, run_dir in enumerate(run_dirs):
        status = json.loads((run_dir / f"status.rank{rank}.json").read_text())
        assert (status["state"], status["last_step"]) == ("stopped", 30), status
    posted = [(b.get("event"), b.get("rule"), b.get("state")) for _, b in hooks.posts]
    assert posted == [("alert", "nonfinite", None), ("end", None, "stopped")], posted
    assert not hooks.posts[-1][1].get("lost_ranks"), hooks.posts[-1][1]
