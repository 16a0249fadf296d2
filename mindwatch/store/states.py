"""A run's state: each rank's from its status file, and the run's across ranks (one precedence for every reader).

Example::

    from mindwatch.store.states import rank_state, run_state

    rank_state({"state": "running", "updated_at": t, "heartbeat_secs": 2})    # "running", or "stale" when old
    run_state(["finished", "failed"])                                         # "failed"
    rank_states({0: status0, 1: status1})     # {0: "failed", 1: "lost"}: rank 0 saw rank 1 die

What a state says in words and colours is not here: :mod:`mindwatch.analysis.state_text` and
:mod:`mindwatch.analysis.state_colours`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

#: Final states a run can end in; ``running`` and ``stalled`` are live states.
FINAL_STATES = ("finished", "failed", "stopped")

#: A rank that another rank (rank 0's liveness check) saw die before it wrote a final state.
LOST = "lost"

#: Which rank's state names the run: the first of these any rank is in, else ``finished``.
PRECEDENCE = (LOST, "failed", "stalled", "stale", "stopped", "running")


#: The stale limit is never shorter than this, however often the heartbeat beats.
STALE_AT_LEAST_SECS = 10.0


def stale_after(heartbeat_secs: float) -> float:
    """Seconds without a heartbeat after which a live rank is ``stale`` (and a rank on another host gone): five beats,
    :data:`STALE_AT_LEAST_SECS` at least. Every reader of a heartbeat uses this one limit."""
    return max(STALE_AT_LEAST_SECS, 5 * heartbeat_secs)


def rank_state(status: dict[str, Any], now: float | None = None) -> str:
    """One rank's state; a live state whose heartbeat is older than a few beats is ``stale``."""
    state = str(status.get("state", "unknown"))
    if state in FINAL_STATES:
        return state
    beat = float(status.get("heartbeat_secs") or 2.0)
    updated = status.get("updated_at")
    if isinstance(updated, (int, float)) and (now or time.time()) - updated > stale_after(beat):
        return "stale"
    return state


def run_state(states: Iterable[str]) -> str:
    """The run's state from its ranks' states; ``unknown`` when no rank has a status yet."""
    seen = set(states)
    if not seen:
        return "unknown"
    return next((s for s in PRECEDENCE if s in seen), "finished")


def lost_ranks(statuses: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Ranks that died, as rank 0 recorded them (``lost_ranks`` in its status), unless they wrote a final state."""
    out: dict[int, dict[str, Any]] = {}
    for st in statuses.values():
        for key, info in (st.get("lost_ranks") or {}).items():
            rank = int(key)
            if statuses.get(rank, {}).get("state") not in FINAL_STATES and isinstance(info, dict):
                out[rank] = info
    return out


def rank_states(statuses: dict[int, dict[str, Any]], now: float | None = None) -> dict[int, str]:
    """Each rank's state; a rank another rank saw die is ``lost``."""
    states = {r: rank_state(s, now) for r, s in statuses.items()}
    for rank in lost_ranks(statuses):
        states[rank] = LOST
    return states
