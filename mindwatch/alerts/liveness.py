"""Which ranks are gone: rank 0's fast check of the other ranks' processes (its worker thread).

Example::

    live = RankLiveness(layout, world_size=8)
    for lost in live.check():             # every distributed.liveness_secs
        print(lost.message)               # rank 1 is gone (pid 1234 on host a exited; last step 812)

A rank on this host is gone when its pid (from ``status.rank<R>.json``, which records ``pid`` and
``host``) no longer runs (a signal 0 and ``/proc/<pid>/stat``: a zombie counts as gone). A rank on
another host is gone when its heartbeat is older than ``stale_secs`` (the same limit that makes a
status ``stale``). A rank whose status is final (it finished, stopped or failed and wrote so) is not lost.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from typing import Any

from mindwatch.store.layout import RunLayout, read_json
from mindwatch.store.states import FINAL_STATES


@dataclass(frozen=True)
class LostRank:
    rank: int
    pid: int | None
    host: str | None
    last_step: int | None
    how: str  # "exited" (a local pid) or "silent" (a remote heartbeat)
    t: float

    @property
    def message(self) -> str:
        if self.how == "exited":
            why = f"pid {self.pid} on host {self.host} exited"
        else:
            why = f"pid {self.pid} on host {self.host} sent no heartbeat"
        return f"rank {self.rank} is gone ({why}; last step {self.last_step})"

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


class RankLiveness:
    """See the module docstring. ``check()`` returns each lost rank once."""

    def __init__(self, layout: RunLayout, world_size: int, *, stale_secs: float = 10.0, host: str | None = None) -> None:
        self.layout = layout
        self.world_size = world_size
        self.stale_secs = stale_secs
        self.host = host or socket.gethostname()
        self.lost: dict[int, LostRank] = {}
        self._who: dict[int, tuple[int, str]] = {}  # rank -> (pid, host), from its status file

    def check(self, last_steps: dict[int, int] | None = None, *, remote: bool = False) -> list[LostRank]:
        """Look at every rank but 0: local pids always, remote heartbeats when ``remote`` (they need a file read)."""
        out = []
        for rank in range(1, self.world_size):
            if rank in self.lost:
                continue
            who = self._who.get(rank)
            if who is None:
                st = read_json(self.layout.status(rank))
                if not st or not isinstance(st.get("pid"), int):
                    continue
                who = self._who[rank] = (st["pid"], str(st.get("host") or ""))
            pid, host = who
            local = host == self.host
            if local and pid_running(pid):
                continue
            if not local and not remote:
                continue
            st = read_json(self.layout.status(rank)) or {}
            if st.get("state") in FINAL_STATES:
                continue
            if not local:
                beat = st.get("updated_at")
                if not isinstance(beat, (int, float)) or time.time() - beat <= self.stale_secs:
                    continue
            steps = [s for s in (st.get("last_step"), (last_steps or {}).get(rank)) if isinstance(s, int)]
            lost = LostRank(rank, pid, host, max(steps) if steps else None, "exited" if local else "silent", time.time())
            self.lost[rank] = lost
            out.append(lost)
        return out
