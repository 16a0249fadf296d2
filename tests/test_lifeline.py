"""The lifeline between rank 0 and the other ranks (real sockets, real processes): a process that dies is known at
once on the other side; a clean end ("bye") is never reported."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from mindwatch.alerts.lifeline import LifelineClient, LifelineServer, local_address

CLIENT = """
import os, sys, time
from mindwatch.alerts.lifeline import LifelineClient
c = LifelineClient(sys.argv[1], me={"rank": 3, "pid": os.getpid(), "host": "h3"}, on_gone=lambda who: None)
print("connected", flush=True)
if sys.argv[2] == "bye":
    c.close()
    print("closed", flush=True)
time.sleep(60)
"""


def _client(address: str, how: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", CLIENT, address, how], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "connected"
    if how == "bye":
        assert proc.stdout.readline().strip() == "closed"
    return proc


def _wait(event: threading.Event, secs: float) -> bool:
    return event.wait(secs)


def test_a_rank_killed_with_sigkill_is_reported_by_rank_0_at_once_with_its_pid() -> None:
    gone: list[tuple[int, dict]] = []
    told = threading.Event()

    def on_gone(rank: int, who: dict) -> None:
        gone.append((rank, who))
        told.set()

    server = LifelineServer("127.0.0.1", me={"rank": 0, "pid": os.getpid()}, on_gone=on_gone)
    try:
        proc = _client(server.address, "stay")
        time.sleep(0.2)  # the hello has arrived
        killed = time.monotonic()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert _wait(told, 5), "the kill was not seen"
        assert time.monotonic() - killed < 3.0, "seen at once (milliseconds; a margin for a loaded machine)"
        assert gone == [(3, {"rank": 3, "pid": proc.pid, "host": "h3", "how": "disconnected"})]
    finally:
        server.close()


def test_a_rank_that_says_bye_is_not_reported() -> None:
    told = threading.Event()
    server = LifelineServer("127.0.0.1", me={"rank": 0, "pid": os.getpid()}, on_gone=lambda r, who: told.set())
    try:
        proc = _client(server.address, "bye")
        proc.kill()
        proc.wait()
        assert not _wait(told, 1.0), "a clean end was reported as a lost rank"
    finally:
        server.close()


@pytest.mark.parametrize("how", ["kill", "bye"])
def test_rank_0_killed_is_reported_by_the_client_and_a_clean_close_is_not(how: str) -> None:
    script = """
import os, sys, time
from mindwatch.alerts.lifeline import LifelineServer
s = LifelineServer("127.0.0.1", me={"rank": 0, "pid": os.getpid(), "host": "h0"}, on_gone=lambda r, who: None)
print(s.address, flush=True)
line = sys.stdin.readline()
if line.strip() == "bye":
    s.close()
    print("closed", flush=True)
time.sleep(60)
"""
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    address = proc.stdout.readline().strip()
    told, seen = threading.Event(), []

    def on_gone(who: dict) -> None:
        seen.append(who)
        told.set()

    client = LifelineClient(address, me={"rank": 1, "pid": os.getpid()}, on_gone=on_gone)
    time.sleep(0.2)
    if how == "kill":
        os.kill(proc.pid, signal.SIGKILL)
        assert _wait(told, 5) and seen == [{"rank": 0, "pid": proc.pid, "host": "h0", "how": "disconnected"}]
    else:
        proc.stdin.write("bye\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "closed"
        assert not _wait(told, 1.0), "rank 0's clean end was reported as lost"
    proc.kill()
    proc.wait()
    client.close()


def test_the_address_is_on_the_interface_that_reaches_the_master() -> None:
    assert local_address("127.0.0.1") == "127.0.0.1"
    assert local_address(None) == "127.0.0.1"


def test_rank_0_hears_how_each_rank_ended_and_waits_only_for_those_still_connected() -> None:
    server = LifelineServer("127.0.0.1", me={"rank": 0}, on_gone=lambda r, who: None)
    clients = {r: LifelineClient(server.address, me={"rank": r}, on_gone=lambda who: None) for r in (1, 2)}
    try:
        assert wait_until(lambda: server.ends() == {1: {"state": "running"}, 2: {"state": "running"}})
        clients[1].close({"state": "stopped", "last_step": 40, "reason": "stopped by mindwatch: a NaN"})
        assert not server.wait_for_byes(0.3), "rank 2 has not said how it ended"
        threading.Timer(0.2, lambda: clients[2].close({"state": "finished", "last_step": 41})).start()
        assert server.wait_for_byes(10), "the wait ends with the last bye"
        assert server.ends() == {
            1: {"state": "stopped", "last_step": 40, "reason": "stopped by mindwatch: a NaN"},
            2: {"state": "finished", "last_step": 41},
        }
    finally:
        server.close()


def test_a_rank_sends_rank_0_a_message_on_its_lifeline() -> None:
    got: list[tuple[int, dict]] = []
    server = LifelineServer("127.0.0.1", me={"rank": 0}, on_gone=lambda r, who: None, on_message=lambda r, m: got.append((r, m)))
    client = LifelineClient(server.address, me={"rank": 1}, on_gone=lambda who: None)
    try:
        dump = "Thread 0x1 (most recent call first):\n" + "  File x.py, line 1\n" * 20_000  # ~400 KB, several reads
        assert client.send({"stall": {"rule": "stall", "rank": 1}, "stacks_text": dump})
        assert wait_until(lambda: got)
        assert got == [(1, {"stall": {"rule": "stall", "rank": 1}, "stacks_text": dump})]
    finally:
        client.close()
        server.close()


def wait_until(probe, secs: float = 10.0) -> bool:
    deadline = time.monotonic() + secs
    while time.monotonic() < deadline:
        if probe():
            return True
        time.sleep(0.02)
    return False
