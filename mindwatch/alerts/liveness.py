"""Which ranks are gone: rank 0's fast check of the other ranks' processes, and rank 1's of rank 0 (worker threads).

Example::

    live = RankLiveness(layout, world_size=8)          # rank 0 watches ranks 1..7
    live = RankLiveness(layout, world_size=8, ranks=[0])  # rank 1 watches rank 0
    for lost in live.check():             # every distributed.liveness_secs
        print(lost.message)               # rank 1 is gone (pid 1234 on host a exited; last step 812)

A rank on this host is gone when its pid (from ``status.rank<R>.json``, which records ``pid`` and
``host``) no longer runs (a signal 0 and ``/proc/<pid>/stat``: a zombie counts as gone). A rank on
another host is gone when its heartbeat is older than ``stale_secs`` (the same limit that makes a
status ``stale``). A rank whose status is final (it finished, stopped or failed and wrote so) is not lost.

Attempts are told apart by their number, not by clocks: every status file names the ``attempt`` of the
run it belongs to (``meta.json``'s ``attempts``; rank 0 announces it to the other ranks), and a status of
another attempt (an earlier one that a relaunch with the same ``run_name`` left, or a later one) says
nothing about this one. A rank that has not written this attempt's status yet (it comes back a few
seconds late) is not lost: it is not there yet. When a new process of this attempt takes a rank's status
over, the watch follows the new pid. Without a known attempt (``attempt=None``) every status counts.

A local rank's exit is seen at once where Linux gives a pidfd (:class:`ExitWatch`): the worker is
woken and the check runs within milliseconds, not at its next ``liveness_secs``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mindwatch.analysis.state_text import gone_sentence
from mindwatch.store.jsonl import last_record
from mindwatch.store.layout import RunLayout, read_json
from mindwatch.store.states import FINAL_STATES, STALE_AT_LEAST_SECS

log = logging.getLogger("mindwatch")


@dataclass(frozen=True)
class LostRank:
    rank: int
    pid: int | None
    host: str | None
    last_step: int | None
    #: "exited" (a local pid), "silent" (a remote heartbeat), "disconnected" (its lifeline closed) or "unreachable"
    #: (its host stopped answering the lifeline's keep-alive)
    how: str
    t: float

    @property
    def message(self) -> str:
        return gone_sentence(self.rank, self.as_record())

    def as_record(self) -> dict[str, Any]:
        return {"pid": self.pid, "host": self.host, "last_step": self.last_step, "how": self.how, "t": self.t}


def pid_running(pid: int) -> bool:
    """Whether process ``pid`` on this host still runs (a zombie does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True  # no /proc: the signal said it exists
    return state not in (b"Z", b"X")


def of_attempt(status: dict[str, Any], attempt: int | None) -> bool:
    """Whether a status file was written by a process of ``attempt`` (None: any attempt counts). A status that names
    no attempt counts too: a rank that could not learn it (``MINDWATCH_RUN_ID`` set, no rendezvous) is still watched."""
    return attempt is None or status.get("attempt") in (attempt, None)


@dataclass(frozen=True)
class _Process:
    pid: int
    host: str
    attempt: Any


class RankLiveness:
    """See the module docstring. ``check()`` returns each lost rank once.

    ``ranks``: the ranks to watch (default: every rank but 0, rank 0's view). ``attempt``: this attempt's number;
    statuses of other attempts are ignored. ``exits``: an :class:`ExitWatch` told each local pid as it is learnt.
    """

    def __init__(
        self,
        layout: RunLayout,
        world_size: int,
        *,
        stale_secs: float = STALE_AT_LEAST_SECS,
        host: str | None = None,
        ranks: Iterable[int] | None = None,
        attempt: int | None = None,
        exits: ExitWatch | None = None,
    ) -> None:
        self.layout = layout
        self.world_size = world_size
        self.stale_secs = stale_secs
        self.host = host or socket.gethostname()
        self.ranks = list(ranks) if ranks is not None else list(range(1, world_size))
        self.attempt = attempt
        self.exits = exits
        self.lost: dict[int, LostRank] = {}
        self._who: dict[int, _Process] = {}  # rank -> this attempt's process, from its status file

    def _learn(self, rank: int, st: dict[str, Any] | None) -> _Process | None:
        """This attempt's process of ``rank`` from its status (None while the status is missing or an earlier attempt's)."""
        if not st or not isinstance(st.get("pid"), int) or not of_attempt(st, self.attempt):
            return None
        who = _Process(st["pid"], str(st.get("host") or ""), st.get("attempt"))
        if self._who.get(rank) != who:
            self._who[rank] = who
            if self.exits is not None and who.host == self.host:
                self.exits.watch(who.pid)
        return who

    def watches_pid(self, rank: int) -> bool:
        """Whether ``rank``'s process runs on this host and its pid is known (its exit is then seen, and said, by pid)."""
        who = self._who.get(rank)
        return who is not None and who.host == self.host

    def check(self, last_steps: dict[int, int] | None = None, *, remote: bool = False) -> list[LostRank]:
        """Look at the watched ranks: local pids always, remote heartbeats when ``remote`` (they need a file read)."""
        out = []
        for rank in self.ranks:
            if rank in self.lost:
                continue
            who = self._who.get(rank) or self._learn(rank, read_json(self.layout.status(rank)))
            if who is None:
                continue
            local = who.host == self.host
            if local and pid_running(who.pid):
                continue
            if not local and not remote:
                continue
            st = read_json(self.layout.status(rank)) or {}
            if self._learn(rank, st) != who:
                continue  # a new process took the rank over (or the status is gone): look again next time
            if st.get("state") in FINAL_STATES:
                continue
            if not local:
                beat = st.get("updated_at")
                if not isinstance(beat, (int, float)) or time.time() - beat <= self.stale_secs:
                    continue
            recorded = (last_record(tail_of(self.layout.metrics(rank))) or {}).get("step")
            steps = [s for s in (st.get("last_step"), (last_steps or {}).get(rank), recorded) if isinstance(s, int)]
            how = "exited" if local else "silent"
            lost = LostRank(rank, who.pid, who.host, max(steps) if steps else None, how, time.time())
            self.lost[rank] = lost
            out.append(lost)
        return out


def tail_of(path: Path, size: int = 1 << 16) -> bytes:
    """The last ``size`` bytes of a file (b"" when it cannot be read): where its last record is."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - size))
            return f.read()
    except OSError:
        return b""


class ExitWatch:
    """A thread that learns of a local process's exit the moment it happens (a pidfd per pid, Linux 5.3+).

    ``on_exit(pid)`` runs on this thread; keep it short (wake the worker). Where pidfds are missing
    (another OS, an old kernel) it does nothing and the periodic check alone finds the exit.
    """

    def __init__(self, on_exit: Callable[[int], None]) -> None:
        self.on_exit = on_exit
        self.available = hasattr(os, "pidfd_open") and hasattr(select, "poll")
        self._poll = select.poll() if self.available else None
        self._fds: dict[int, int] = {}  # fd -> pid
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake_r, self._wake_w = os.pipe() if self.available else (-1, -1)
        self._thread: threading.Thread | None = None

    def watch(self, pid: int) -> None:
        if not self.available or self._poll is None or self._stop.is_set():
            return
        try:
            fd = os.pidfd_open(pid)
        except OSError:  # gone already (the check sees it), or no pidfd here
            return
        with self._lock:
            self._fds[fd] = pid
            self._poll.register(fd, select.POLLIN)
            if self._thread is None:
                self._poll.register(self._wake_r, select.POLLIN)
                self._thread = threading.Thread(target=self._run, name="mindwatch-exits", daemon=True)
                self._thread.start()
                return
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")  # a poll() under way watches the fds it began with: start it again

    def _run(self) -> None:
        assert self._poll is not None
        while not self._stop.is_set():
            try:
                events = self._poll.poll()
            except OSError:
                return
            for fd, _ in events:
                if fd == self._wake_r:
                    with contextlib.suppress(OSError):
                        os.read(self._wake_r, 512)
                    continue
                with self._lock:
                    pid = self._fds.pop(fd, None)
                    with contextlib.suppress(KeyError, ValueError):
                        self._poll.unregister(fd)
                    with contextlib.suppress(OSError):
                        os.close(fd)
                if pid is not None:
                    try:
                        self.on_exit(pid)
                    except Exception as e:  # a broken callback must not end the watch
                        log.warning("mindwatch: exit watch callback failed: %r", e)

    def close(self) -> None:
        if not self.available or self._stop.is_set():
            return
        self._stop.set()
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        if self._thread is not None:
            self._thread.join(1.0)
        with self._lock:
            for fd in list(self._fds):
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._fds.clear()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
