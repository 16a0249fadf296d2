"""Coordinated actions and lost ranks, without MindSpore: the files ranks exchange, driven by hand."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mindwatch.alerts.liveness import RankLiveness, pid_running
from mindwatch.analysis.state_text import lost_sentence
from mindwatch.config import load_config
from mindwatch.monitor.control import Control
from mindwatch.monitor.coordination import ActionCoordinator
from mindwatch.session import RunSession
from mindwatch.store.layout import RunLayout, write_json_atomic
from mindwatch.store.states import rank_states, run_state


def two_ranks(tmp_path: Path, **coordination: float) -> tuple[list[Control], list[ActionCoordinator]]:
    cfg = load_config({"distributed": {"coordination": {"poll_secs": 0.01, **coordination}}}).distributed.coordination
    controls = [Control(coordinated=True) for _ in range(2)]
    coords = [ActionCoordinator(RunLayout(tmp_path), rank=r, world_size=2, control=controls[r], config=cfg) for r in range(2)]
    return controls, coords


def steps(coords: list[ActionCoordinator], upto: int, secs_per_step: float = 0.1) -> None:
    """Both ranks recorded steps 1..upto, the last one just now, ``secs_per_step`` apart."""
    now = time.time()
    for c in coords:
        c.write([{"step": s, "t": now - (upto - s) * secs_per_step} for s in range(1, upto + 1)])


def exchange(coords: list[ActionCoordinator], rounds: int = 3) -> None:
    for _ in range(rounds):
        for c in coords:
            c.tick()
        time.sleep(0.015)


def test_a_request_on_rank_1_is_due_on_every_rank_at_one_step_ahead(tmp_path: Path) -> None:
    controls, coords = two_ranks(tmp_path, margin_secs=1.0)
    recorded = time.time()
    steps(coords, 10)
    controls[1].request({"rule": "threshold", "step": 10, "rank": 1, "actions": ["lr_backoff"]})
    assert not controls[1].pending, "nothing is due before the ranks agree"
    exchange(coords)
    # 1 s ahead at 0.1 s a step: 10 steps (give or take one for the clock's rounding) after the step the ranks are at
    # when rank 0 decides: step 10, plus one for each 0.1 s since it was recorded (they would have trained on meanwhile)
    ran_on = int((time.time() - recorded) / 0.1)
    decision = json.loads((tmp_path / "control" / "decisions.jsonl").read_text())
    assert decision["action"] == "lr_backoff" and decision["requested_by"] == 1
    assert 19 <= decision["at_step"] <= 21 + ran_on, (decision["at_step"], ran_on)
    at = decision["at_step"]
    for control in controls:
        assert control.pending and control.take(at - 1) == []
        [(action, alert)] = control.take(at)
        assert action == "lr_backoff" and alert["coordination"]["at_step"] == at and not control.pending


def test_a_rank_past_the_step_acts_at_once(tmp_path: Path) -> None:
    controls, coords = two_ranks(tmp_path)
    steps(coords, 10)
    controls[0].request({"rule": "spike", "step": 10, "rank": 0, "actions": ["checkpoint"]})
    exchange(coords)
    at = json.loads((tmp_path / "control" / "decisions.jsonl").read_text())["at_step"]
    [(action, alert)] = controls[1].take(at + 3)
    assert action == "checkpoint"
    from mindwatch.mindspore.actions import coordination_fields

    assert coordination_fields(alert["coordination"], at + 3) == {
        "decision": 1,
        "requested_by": 0,
        "at_step": at,
        "late_steps": 3,
    }


def test_the_same_rule_on_both_ranks_makes_one_decision(tmp_path: Path) -> None:
    controls, coords = two_ranks(tmp_path)
    steps(coords, 10)
    for r in (0, 1):
        controls[r].request({"rule": "nonfinite", "step": 10, "rank": r, "actions": ["stop"]})
    exchange(coords)
    lines = [json.loads(x) for x in (tmp_path / "control" / "decisions.jsonl").read_text().splitlines()]
    assert [d.get("action") for d in lines] == ["stop", None] and lines[1]["merged_into"] == lines[0]["seq"]
    for control in controls:
        assert [a for a, _ in control.take(10**6)] == ["stop"]
    assert coords[1]._waiting == {}, "the merged request counts as answered"


def test_without_rank_0_a_request_is_carried_out_alone_after_the_timeout(tmp_path: Path) -> None:
    controls, coords = two_ranks(tmp_path, decide_timeout=0.05)
    steps(coords, 5)
    controls[1].request({"rule": "threshold", "step": 5, "rank": 1, "actions": ["stop"]})
    for _ in range(10):  # rank 0 never looks
        coords[1].tick()
        time.sleep(0.01)
    [(action, alert)] = controls[1].take(6)
    assert action == "stop" and "no decision from rank 0" in alert["coordination"]["alone"]


def test_a_single_process_run_has_no_coordination(tmp_path: Path) -> None:
    session = RunSession.start(load_config({"save_dir": str(tmp_path), "project": "p"}), rank=0, world_size=1)
    try:
        assert session.coordinator is None and not session.control.coordinated and session.monitor.tickers == []
        session.control.request({"rule": "x", "step": 1, "actions": ["stop"]})
        assert session.control.pending and [a for a, _ in session.control.take(1)] == ["stop"]
    finally:
        session.close()
    assert not (session.run_dir / "control").exists()


def test_a_killed_process_on_this_host_is_a_lost_rank(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        status = {"rank": 1, "pid": child.pid, "host": socket.gethostname(), "state": "running", "last_step": 41}
        write_json_atomic(layout.status(1), {**status, "updated_at": time.time()})
        live = RankLiveness(layout, world_size=2)
        assert live.check() == [] and pid_running(child.pid)
        child.kill()
        child.wait()
        [lost] = live.check({1: 42})
    finally:
        child.kill()
    assert lost.message == f"rank 1 is gone (pid {child.pid} on host {socket.gethostname()} exited; last step 42)"
    assert live.check() == [], "each lost rank once"


def test_a_remote_rank_is_lost_when_its_heartbeat_stops(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path)
    old = time.time() - 60
    write_json_atomic(layout.status(1), {"pid": 7, "host": "elsewhere", "state": "running", "last_step": 3, "updated_at": old})
    live = RankLiveness(layout, world_size=2, stale_secs=10)
    assert live.check() == [], "remote heartbeats are read only when asked"
    [lost] = live.check(remote=True)
    assert lost.how == "silent" and "sent no heartbeat" in lost.message


def test_the_run_names_the_rank_that_died_and_when_the_others_ended() -> None:
    statuses = {
        0: {
            "state": "stopped",
            "updated_at": 1001.5,
            "lost_ranks": {"1": {"pid": 4242, "host": "a", "last_step": 812, "how": "exited", "t": 1000.0}},
        },
        1: {"state": "running", "updated_at": 999.0},
    }
    assert rank_states(statuses, now=1002) == {0: "stopped", 1: "lost"}
    assert run_state(rank_states(statuses, now=1002).values()) == "lost"
    assert lost_sentence(statuses) == "rank 1 died at step 812 (pid 4242 on host a exited); the others ended 1.5 s later"
    statuses[1] = {"state": "finished"}  # it wrote its end after all: not lost
    assert lost_sentence(statuses) is None and rank_states(statuses)[1] == "finished"


def test_a_stop_for_a_lost_rank_ends_the_process_only_when_no_step_boundary_comes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mindwatch.session

    exits: list[int] = []
    monkeypatch.setattr(mindwatch.session.os, "_exit", exits.append)
    config = load_config({"save_dir": str(tmp_path), "project": "p", "distributed": {"stop_grace": 0.3}})
    alert = {"rule": "rank_lost", "message": "rank 1 is gone (pid 7 on host a exited; last step 3)", "step": 3}
    # a step boundary comes: the training thread takes the stop, the process lives on
    session = RunSession.start(config, rank=0, world_size=1)
    session.stop_now(alert)
    assert session.control.waiting(alert) and [a for a, _ in session.control.take(4)] == ["stop"]
    time.sleep(0.6)
    assert exits == [] and session.monitor.state == "running"
    session.close("stopped")
    # none comes (the training thread waits in a collective): final status first, then the process ends
    session = RunSession.start(config, rank=0, world_size=1)
    session.stop_now(alert)
    deadline = time.monotonic() + 10
    while not exits and time.monotonic() < deadline:
        time.sleep(0.05)
    assert exits == [1]
    status = json.loads((session.run_dir / "status.rank0.json").read_text())
    assert status["state"] == "stopped" and status["reason"] == f"stopped by mindwatch: {alert['message']}"
