"""Liveness across attempts, rank 1 watching rank 0, the end message of a coordinated stop, and the urgent
``rank_lost`` notification that outlives its process (real processes, a real HTTP and SMTP server; no MindSpore)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from aiosmtpd.controller import Controller
from test_notify import CONTEXT, Hook
from test_notify_channels import Inbox, free_port

from mindwatch.alerts.liveness import ExitWatch, RankLiveness
from mindwatch.config import NotifyChannel
from mindwatch.sinks.channels import Webhook
from mindwatch.sinks.notify import NotifySink
from mindwatch.store.layout import RunLayout, write_json_atomic

HOST = socket.gethostname()
REPO = Path(__file__).resolve().parent.parent


def sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def status(pid: int, started_at: float, state: str = "running", attempt: int = 1, **kw: object) -> dict:
    now = time.time()
    return {"pid": pid, "host": HOST, "state": state, "attempt": attempt, "started_at": started_at, "updated_at": now, **kw}


def test_an_earlier_attempts_status_is_not_a_lost_rank_and_the_new_process_is_watched(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path)
    # the last attempt, relaunched at once: killed (its status still says running, written a moment ago) and
    # stopped; its processes are gone. No clock tells it apart from this attempt: its number does.
    dead = sleeper()
    dead.kill()
    dead.wait()
    write_json_atomic(layout.status(1), status(dead.pid, time.time(), attempt=1, last_step=3))
    write_json_atomic(layout.status(2), status(dead.pid, time.time(), state="stopped", attempt=1))
    live = RankLiveness(layout, world_size=3, attempt=2)
    assert live.check(remote=True) == [], "an earlier attempt's processes are not this attempt's lost ranks"
    # a few seconds later, this attempt's ranks come back and take their status files over
    one, two = sleeper(), sleeper()
    try:
        write_json_atomic(layout.status(1), status(one.pid, time.time(), attempt=2))
        write_json_atomic(layout.status(2), status(two.pid, time.time(), attempt=2))
        assert live.check(remote=True) == []
        two.kill()
        two.wait()
        [lost] = live.check({2: 7})
    finally:
        one.kill()
        two.kill()
    assert lost.rank == 2 and lost.pid == two.pid and lost.last_step == 7


def test_a_status_rewritten_by_a_new_process_is_followed_not_reported(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path)
    first, second = sleeper(), sleeper()
    try:
        write_json_atomic(layout.status(0), status(first.pid, time.time()))
        live = RankLiveness(layout, world_size=2, ranks=[0])  # rank 1's view: rank 0
        assert live.check() == []
        write_json_atomic(layout.status(0), status(second.pid, time.time() + 0.5))  # rank 0 restarted in place
        first.kill()
        first.wait()
        assert live.check() == [], "the old pid exited, but a new process is rank 0 now"
        second.kill()
        second.wait()
        [lost] = live.check()
    finally:
        first.kill()
        second.kill()
    assert lost.rank == 0 and lost.pid == second.pid
    assert lost.message.startswith(f"rank 0 is gone (pid {second.pid} on host {HOST} exited")


def test_the_exit_watch_hears_of_an_exit_at_once() -> None:
    heard: list[tuple[int, float]] = []
    done = threading.Event()
    watch = ExitWatch(lambda pid: (heard.append((pid, time.monotonic())), done.set()))
    child = sleeper()
    try:
        watch.watch(child.pid)
        time.sleep(0.2)
        child.kill()
        killed = time.monotonic()
        assert done.wait(5), "no exit heard"
    finally:
        child.kill()
        child.wait()
        watch.close()
    assert heard[0][0] == child.pid and heard[0][1] - killed < 0.1


def test_a_coordinated_stop_is_not_a_lost_rank_in_the_end_message(tmp_path: Path) -> None:
    hook = Hook()
    try:
        write_json_atomic(tmp_path / "status.rank1.json", {"state": "stopped", "last_step": 62, "reason": "stopped by mindwatch"})
        write_json_atomic(tmp_path / "status.rank2.json", {"state": "failed", "last_step": 61, "error": "HCCL timeout"})
        sink = NotifySink(
            [Webhook(NotifyChannel(type="webhook", url=f"{hook.url}/plain"))], context=CONTEXT, run_dir=tmp_path, world_size=3
        )
        sink.close("stopped", reason="stopped by mindwatch")
        end = hook.wait(1)[0]["json"]
    finally:
        hook.close()
    assert end["lost_ranks"] == {"2": "failed after step 61: HCCL timeout"}, "rank 1 stopped as rank 0 did: nothing to tell"
    from mindwatch.sinks.messages import RunEnd, end_message

    title = end_message(RunEnd("stopped", lost_ranks={2: "failed after step 61: HCCL timeout"}), CONTEXT).title
    assert title == "mindwatch: gpt/run_1 stopped, rank 2 failed" and "lost" not in title


SENDER = """
import json, os, signal, sys
from mindwatch.config import load_config
from mindwatch.sinks.channels import build_channels
from mindwatch.sinks.notify import NotifySink
from mindwatch.sinks.handoff import hand_off
cfg = load_config({"notify": json.loads(sys.argv[1])})
context = {"project": "gpt", "run": "run_1", "rank": 1, "host": "node-7"}
sink = NotifySink(build_channels(cfg.notify), context=context, handoff=lambda a: hand_off(cfg.notify, context, a))
alert = {"rule": "rank_lost", "severity": "error", "step": 12, "rank": 0, "message": "rank 0 is gone", "reported_by": 1}
sink.urgent(alert)
sink.alert(alert)  # the same alert again, through the sinks: counted, not sent twice
os.killpg(0, signal.SIGKILL)  # what msrun does to a surviving worker, at once
"""


def test_an_urgent_alert_reaches_every_channel_after_its_process_is_killed(tmp_path: Path) -> None:
    hook, inbox = Hook(), Inbox()
    ctl = Controller(inbox, hostname="127.0.0.1", port=free_port())
    ctl.start()
    try:
        notify = [
            {"type": "webhook", "url": f"{hook.url}/plain"},
            {"type": "email", "host": "127.0.0.1", "port": ctl.port, "sender": "mw@localhost", "to": ["ops@localhost"]},
        ]
        env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        script = textwrap.dedent(SENDER)
        proc = subprocess.run(
            [sys.executable, "-c", script, json.dumps(notify)], env=env, start_new_session=True, timeout=60, check=False
        )
        assert proc.returncode == -signal.SIGKILL
        mails = inbox.wait(1, timeout=20)
        posts = hook.wait(1, timeout=20)
        time.sleep(0.5)
    finally:
        ctl.stop()
        hook.close()
    assert [m["subject"] for m in mails] == ["mindwatch ERROR: rank_lost in gpt/run_1"]
    assert "rank 0 is gone" in mails[0].get_body(("plain",)).get_content()  # type: ignore[union-attr]
    assert [p["json"]["rule"] for p in posts] == ["rank_lost"], "one post: the alert is not sent twice"
