"""A run's state: each rank's from its status file, and the run's across ranks (one precedence for every reader).

Example::

    from mindwatch.store.states import rank_state, run_state

    rank_state({"state": "running", "updated_at": t, "heartbeat_secs": 2})    # "running", or "stale" when old
    run_state(["finished", "failed"])                                         # "failed"
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

#: Final states a run can end in; ``running`` and ``stalled`` are live states.
FINAL_STATES = ("finished", "failed", "stopped")

#: Which rank's state names the run: the first of these any rank is in, else ``finished``.
PRECEDENCE = ("failed", "stalled", "stale", "stopped", "running")


def rank_state(status: dict[str, Any], now: float | None = None) -> str:
    """One rank's state; a live state whose heartbeat is older than a few beats is ``stale``."""
    state = str(status.get("state", "unknown"))
    if state in FINAL_STATES:
        return state
    beat = float(status.get("heartbeat_secs") or 2.0)
    updated = status.get("updated_at")
    if isinstance(updated, (int, float)) and (now or time.time()) - updated > max(10.0, 5 * beat):
        return "stale"
    return state


def run_state(states: Iterable[str]) -> str:
    """The run's state from its ranks' states; ``unknown`` when no rank has a status yet."""
    seen = set(states)
    if not seen:
        return "unknown"
    return next((s for s in PRECEDENCE if s in seen), "finished")
