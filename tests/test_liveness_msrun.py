"""Liveness under real ``msrun`` (2 workers), at the moments that matter: a coordinated stop and a restart
of the same run with rank 1 a few seconds late (quiet: no ``rank_lost``), and ``kill -9`` of rank 0 (rank 1
names it, by webhook and email before msrun kills it too). A local HTTP and SMTP server take the messages.
Four launches, ~30 s each here."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiosmtpd.controller import Controller
from test_distributed import Launch, msrun, msrun_to_the_end, only_run_dir, raw_records
from test_distributed_actions import named_last_step, wait_for
from test_notify import Hook
from test_notify_channels import Inbox, free_port

pytestmark = pytest.mark.slow

RESUMED = {"run_name": "llm", "resume": "allow"}


@dataclass
class Channels:
    hook: Hook
    inbox: Inbox
    port: int

    def notify(self) -> list[dict]:
        return [
            {"type": "webhook", "url": f"{self.hook.url}/plain"},
            {"type": "email", "host": "127.0.0.1", "port": self.port, "sender": "mw@localhost", "to": ["ops@localhost"]},
        ]

    def subjects(self) -> list[str]:
        return [str(m["subject"]) for m in self.inbox.messages]

    def posts(self) -> list[dict]:
        return [r["json"] for r in self.hook.requests]

    def lost_mails(self) -> list:
        return [m for m in self.inbox.messages if m["subject"] == "mindwatch ERROR: rank_lost in dist/llm"]

    def lost_posts(self) -> list[dict]:
        return [p for p in self.posts() if p.get("rule") == "rank_lost"]


@pytest.fixture
def channels() -> Iterator[Channels]:
    hook, inbox = Hook(), Inbox()
    ctl = Controller(inbox, hostname="127.0.0.1", port=free_port())
    ctl.start()
    try:
        yield Channels(hook, inbox, ctl.port)
    finally:
        ctl.stop()
        hook.close()


def run_job(tmp: Path, name: str, config: dict, *args: str, expect_ok: bool = True) -> None:
    msrun_to_the_end(tmp / name, "--save-dir", str(tmp / "out"), "--config", json.dumps(config), *args, expect_ok=expect_ok)


def lost_alerts(run_dir: Path, since: float = 0.0) -> list[dict]:
    path = run_dir / "alerts.jsonl"
    found = raw_records(path) if path.exists() else []
    return [a for a in found if a["rule"] == "rank_lost" and a["t"] >= since]


def relaunch_with_rank_1_late(tmp: Path, channels: Channels, run_dir: Path) -> float:
    """The same run again, rank 1 starting its training 4 s after rank 0: returns when it began."""
    channels.hook.requests.clear()
    channels.inbox.messages.clear()
    began = time.time()
    run_job(tmp, "logs2", {**RESUMED, "notify": channels.notify()}, "--steps", "12", "--late-rank", "1", "--late-secs", "4")
    assert lost_alerts(run_dir, began) == [], "a restart never reports the last attempt's processes as lost"
    channels.inbox.wait(1)
    channels.hook.wait(1)
    time.sleep(0.5)
    assert channels.lost_mails() == [] and channels.lost_posts() == []
    assert channels.subjects()[-1] == "mindwatch: dist/llm finished"
    ends = [p for p in channels.posts() if p["event"] == "end"]
    assert len(ends) == 1 and ends[0]["state"] == "finished" and ends[0]["lost_ranks"] == {}
    for rank in (0, 1):
        assert json.loads((run_dir / f"status.rank{rank}.json").read_text())["state"] == "finished"
    return began


def test_a_coordinated_stop_and_a_restart_with_rank_1_late_are_quiet(tmp_path: Path, channels: Channels) -> None:
    stop = {
        **RESUMED,
        "notify": channels.notify(),
        "callback": {"params": {"warn_on_value": {"data_time": 0.5}}},
        "alerts": {"thresholds": {"actions": ["stop"]}},
        "distributed": {"coordination": {"poll_secs": 0.05, "margin_secs": 0.5}},
    }
    spike = ("--pace-secs", "0.02", "--spike-rank", "1", "--spike-at", "60", "--spike-secs", "1.5")
    run_job(tmp_path, "logs1", stop, "--steps", "160", *spike)
    run_dir = only_run_dir(tmp_path / "out" / "dist")
    for rank in (0, 1):
        assert json.loads((run_dir / f"status.rank{rank}.json").read_text())["state"] == "stopped"
    channels.inbox.wait(1)
    deadline = time.monotonic() + 15
    while "mindwatch: dist/llm stopped" not in channels.subjects() and time.monotonic() < deadline:
        time.sleep(0.1)
    ends = [s for s in channels.subjects() if s.startswith("mindwatch: ")]
    assert ends == ["mindwatch: dist/llm stopped"], "a clean coordinated stop is never a lost rank"
    [end] = [p for p in channels.posts() if p["event"] == "end"]
    assert end["state"] == "stopped" and end["lost_ranks"] == {}
    assert lost_alerts(run_dir) == []

    relaunch_with_rank_1_late(tmp_path, channels, run_dir)
    meta = json.loads((run_dir / "meta.json").read_text())
    assert [a["end"] for a in meta["attempts"]] == ["stopped", "finished"]


def test_kill_9_of_rank_0_is_named_by_rank_1_and_the_restart_is_quiet(tmp_path: Path, channels: Channels) -> None:
    out = tmp_path / "out"
    launch = Launch()
    try:
        config = {**RESUMED, "notify": channels.notify()}
        msrun(
            launch,
            tmp_path / "logs1",
            "--save-dir",
            str(out),
            "--steps",
            "2000",
            "--pace-secs",
            "0.02",
            "--config",
            json.dumps(config),
            "--print-steps",
        )
        metrics0 = wait_for(lambda: next(iter(out.glob("dist/llm/metrics.rank0.jsonl")), None), 240)
        run_dir = metrics0.parent
        wait_for(lambda: len(raw_records(metrics0)) >= 30 and (run_dir / "status.rank1.json").exists(), 120)
        pid = json.loads((run_dir / "status.rank0.json").read_text())["pid"]
        os.kill(pid, signal.SIGKILL)
        killed = time.time()
        [lost] = wait_for(lambda: lost_alerts(run_dir) or None, 30)
        # the notification left before msrun's kill (it SIGKILLs rank 1 within a second): by a sender process of
        # its own, on every channel
        deadline = time.monotonic() + 20
        while not (channels.lost_mails() and channels.lost_posts()) and time.monotonic() < deadline:
            time.sleep(0.1)
        launch.wait(60)  # msrun ends the job: the restart comes after it, as a user's would
    finally:
        launch.kill()
    last_step = named_last_step(lost, run_dir, tmp_path / "logs1", dead=0, survivor=1)
    assert lost["rank"] == 0 and lost["reported_by"] == 1 and lost["severity"] == "error"
    assert lost["message"] == f"rank 0 is gone (pid {pid} on host {socket.gethostname()} exited; last step {last_step})"
    liveness_secs = json.loads((run_dir / "meta.json").read_text())["config"]["distributed"]["liveness_secs"]
    assert lost["t"] - killed < liveness_secs + 5.0, "named within liveness_secs (+ 5 s: a loaded machine)"
    status1 = json.loads((run_dir / "status.rank1.json").read_text())
    assert status1["lost_ranks"]["0"]["pid"] == pid, "rank 1 recorded it in its status"
    [mail] = channels.lost_mails()
    assert f"rank 0 is gone (pid {pid}" in mail.get_body(("plain",)).get_content()  # type: ignore[union-attr]
    assert [(p["rank"], p["reported_by"]) for p in channels.lost_posts()] == [(0, 1)]

    relaunch_with_rank_1_late(tmp_path, channels, run_dir)
    meta = json.loads((run_dir / "meta.json").read_text())
    assert [a["end"] for a in meta["attempts"]] == ["killed", "finished"]
