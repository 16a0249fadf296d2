"""The attempts of a run: each start of a training into the same run directory, kept in ``meta.json``.

Example::

    from mindwatch.store.attempts import continue_meta
    meta = continue_meta(old_meta, new_meta, run_dir)   # rank 0, when a resumed training starts
    meta["attempts"][-2]["end"]                          # 'finished' | 'failed' | 'stopped' | 'killed'

An attempt is ``{attempt, started_at, first_step, host, pid, command, ended_at, end, last_step}``.
Rank 0 fills ``end`` and ``ended_at`` when it closes. An attempt that never closed (``kill -9``,
a lost host) is settled by the next one from the rank status files it left: a final state there
is kept, a live state (``running``, ``stalled``) is ``killed``, ended at its last heartbeat.
Runs the callback wrote before attempts existed get their first attempt from the old meta fields.
Runs on rank 0's thread at train begin and end; plain functions over dicts and files.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from mindwatch.store.jsonl import read_last_record
from mindwatch.store.layout import RunLayout, read_json
from mindwatch.store.states import FINAL_STATES

#: How an attempt ended: the final states of a rank, and ``killed`` for one that never closed.
ENDS = (*FINAL_STATES, "killed")
_SEVERITY = ("failed", "killed", "stopped", "finished")


def new_attempt(number: int, started_at: float | None = None) -> dict[str, Any]:
    """This process's attempt ``number`` (1-based); ``first_step`` is filled at the first recorded step."""
    return {
        "attempt": number,
        "started_at": started_at if started_at is not None else time.time(),
        "first_step": None,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "command": sys.argv,
        "ended_at": None,
        "end": None,
        "last_step": None,
    }


def continue_meta(old: dict[str, Any], new: dict[str, Any], run_dir: Path, *, before: float) -> dict[str, Any]:
    """The meta of a resumed run: ``old``'s identity and attempts (the last one settled), ``new``'s config.

    ``before``: this launch's start; status files updated later belong to this attempt and are ignored.
    """
    attempts = [dict(a) for a in old.get("attempts") or [] if isinstance(a, dict)]
    if not attempts:  # written before attempts existed: its first attempt is the old meta itself
        first = {**new_attempt(1, old.get("started_at")), "pid": old.get("pid"), "command": old.get("command")}
        first["host"] = (old.get("hosts") or [None])[0]
        first["ended_at"], first["end"] = old.get("ended_at"), old.get("final_state")
        attempts = [first]
    settle(attempts[-1], RunLayout(Path(run_dir)), before=before)
    hosts = list(dict.fromkeys([*(old.get("hosts") or []), *(new.get("hosts") or [])]))
    meta = {**new, "run_id": old.get("run_id", new.get("run_id")), "started_at": old.get("started_at", new.get("started_at"))}
    meta["hosts"] = hosts
    meta["attempts"] = [*attempts, new_attempt(len(attempts) + 1, new.get("started_at"))]
    return meta


def settle(attempt: dict[str, Any], layout: RunLayout, *, before: float) -> None:
    """Fill ``end``, ``ended_at`` and ``last_step`` of an attempt from the rank status files it left."""
    statuses = [s for r in layout.ranks() if (s := read_json(layout.status(r))) is not None]
    number = attempt.get("attempt")
    old = [
        s
        for s in statuses
        if s.get("attempt") == number or (s.get("attempt") is None and float(s.get("updated_at") or 0) < before)
    ]
    if attempt.get("end") not in ENDS:
        states = {str(s.get("state")) for s in old}
        ends = {s if s in FINAL_STATES else "killed" for s in states} or {"killed"}
        attempt["end"] = next(e for e in _SEVERITY if e in ends)
    beats = [float(s["updated_at"]) for s in old if isinstance(s.get("updated_at"), (int, float))]
    if attempt.get("ended_at") is None and beats:
        attempt["ended_at"] = max(beats)
    steps = [s["last_step"] for s in old if isinstance(s.get("last_step"), int)]
    for rank in {s["rank"] for s in old if isinstance(s.get("rank"), int)}:  # records written after the last heartbeat
        last = read_last_record(layout.metrics(rank))
        if last is not None:
            steps.append(last["step"])
    if attempt.get("last_step") is None and steps:
        attempt["last_step"] = max(steps)


def next_attempt(run_dir: Path) -> int:
    """The number the next attempt of the run in ``run_dir`` gets (1 for a new run), as :func:`continue_meta` numbers it."""
    old = read_json(RunLayout(Path(run_dir)).meta)
    if old is None:
        return 1
    attempts = [a for a in old.get("attempts") or [] if isinstance(a, dict)]
    return max(len(attempts), 1) + 1


def this_attempt(meta: dict[str, Any]) -> int | None:
    """The number of the newest attempt in ``meta`` (None: a meta without attempts)."""
    attempts = meta.get("attempts") or []
    number = attempts[-1].get("attempt") if attempts and isinstance(attempts[-1], dict) else None
    return number if isinstance(number, int) else None


def resumed_step(meta: dict[str, Any]) -> int:
    """The last step the run's earlier attempts recorded (a resumed run counts on from it), else 0."""
    attempts = meta.get("attempts") or []
    steps = [a["last_step"] for a in attempts[:-1] if isinstance(a, dict) and isinstance(a.get("last_step"), int)]
    return max(steps, default=0)


def time_lost(attempts: list[dict[str, Any]]) -> float:
    """Seconds between the end of each attempt and the start of the next, summed."""
    lost = 0.0
    for prev, nxt in zip(attempts, attempts[1:], strict=False):
        end, start = prev.get("ended_at"), nxt.get("started_at")
        if isinstance(end, (int, float)) and isinstance(start, (int, float)):
            lost += max(0.0, start - end)
    return lost
