"""Coordinated actions: every rank of a multi-rank run carries out an action at the same step.

Example::

    control = Control(coordinated=True)
    coord = ActionCoordinator(layout, rank=1, world_size=8, control=control, config=cfg.distributed)
    Monitor([writer, ..., coord])        # a sink: the worker calls tick() every loop, off the training thread

The protocol (docs/distributed.md, "Coordinated actions"), all through the shared run directory:

1. A rule on rank R asks for an action: the coordinated :class:`~mindwatch.monitor.control.Control`
   keeps it in its outbox. Rank R's worker writes ``control/request.rank<R>.<n>.json`` (temp file +
   rename). Rank 0 handles its own requests in memory.
2. Rank 0's worker lists ``control/`` every ``poll_secs``. For a new request it picks the step
   ``S = (the furthest step any rank is known to have reached) + margin``, the margin being
   ``margin_secs`` (at least 3 x ``poll_secs``) in steps of the measured step time, and at least
   ``min_margin_steps``; it appends ``{"seq", "action", "at_step": S, "alert", "covers"}`` to
   ``control/decisions.jsonl`` (one writer, append-only). A request for an action the same rule already
   has a decision for, not yet carried out, is merged into it (a line with ``merged_into``).
3. Every rank's worker reads the new lines of ``decisions.jsonl`` every ``poll_secs`` (one ``stat``
   when nothing is new) and files the action on its Control for step S. The training thread, which
   checks ``control.pending`` at every step end anyway, acts after step S.

A rank already past S when the decision reaches it acts at its next step boundary and records how
late it was (``late_steps`` in its intervention alert). A request that no decision covers within
``decide_timeout`` seconds (rank 0 gone) is carried out by the requesting rank alone, with a warning.
Decisions with ``"now": true`` (a lost rank, ``on_rank_lost: stop``) are due at once.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import re
import statistics
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mindwatch.monitor.control import Alert, Control
from mindwatch.store.jsonl import JsonlTail, encode_line
from mindwatch.store.layout import RunLayout, read_json, write_json_atomic

if TYPE_CHECKING:
    from mindwatch.config import CoordinationSettings

log = logging.getLogger("mindwatch")

_REQUEST = re.compile(r"^request\.rank(\d+)\.(\d+)\.json$")


class ActionCoordinator:
    """One rank's side of the protocol in the module docstring; rank 0 also decides. A Monitor sink."""

    def __init__(
        self,
        layout: RunLayout,
        *,
        rank: int,
        world_size: int,
        control: Control,
        config: CoordinationSettings,
        on_now: Callable[[Alert], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.layout = layout
        self.on_now = on_now
        self.rank = rank
        self.world_size = world_size
        self.control = control
        self.poll_secs = config.poll_secs
        self.margin_secs = max(config.margin_secs, 3 * config.poll_secs)
        self.min_margin_steps = config.min_margin_steps
        self.decide_timeout = config.decide_timeout
        self.clock = clock
        self.decisions_seen = 0
        #: Step and wall time of this rank's newest record, and recent seconds per step.
        self.last_step: int | None = None
        self._last_t: float | None = None
        self._step_secs: deque[float] = deque(maxlen=20)
        self._last_poll = -1e18
        self._numbers = itertools.count(1)
        #: Requests this rank sent that no decision covers yet: id -> (sent at, action, alert).
        self._waiting: dict[str, tuple[float, str, Alert]] = {}
        layout.control.mkdir(parents=True, exist_ok=True)
        self._decisions = JsonlTail(layout.decisions)
        self._decisions.offset = _size(layout.decisions)  # a resumed run's old decisions are not news
        # rank 0: requests already handled, the next decision number, open decisions per (action, rule)
        self._handled: set[str] = set(os.listdir(layout.control)) if rank == 0 else set()
        self._seq = itertools.count(_count_lines(layout.decisions) + 1)
        self._open: dict[tuple[str, Any], tuple[int, int]] = {}  # -> (seq, at_step)

    # -- sink interface (the worker thread) -------------------------------------------
    def write(self, records: list[dict[str, Any]]) -> None:
        for rec in records:
            step, t = rec.get("step"), rec.get("t")
            if not isinstance(step, int) or not isinstance(t, (int, float)):
                continue
            if self.last_step is not None and self._last_t is not None and step > self.last_step and t > self._last_t:
                self._step_secs.append((t - self._last_t) / (step - self.last_step))
            if self.last_step is None or step >= self.last_step:
                self.last_step, self._last_t = step, t

    def tick(self) -> None:
        """Every worker loop: send new requests at once; read requests and decisions every ``poll_secs``."""
        if self.control.outgoing_waiting:
            self._send(self.control.outgoing())
        now = self.clock()
        if now - self._last_poll < self.poll_secs:
            return
        self._last_poll = now
        if self.rank == 0:
            self._decide_requests()
        self._read_decisions()
        self._act_alone_when_unanswered(now)

    def flush(self) -> None:
        self.tick()

    def close(self, state: str, error: str | None = None, reason: str | None = None) -> None:
        pass

    # -- every rank ------------------------------------------------------------------
    def _send(self, requests: list[tuple[str, Alert]]) -> None:
        for action, alert in requests:
            if self.rank == 0:
                self._decide(action, alert, requester=0, request_id=None)
                continue
            n = next(self._numbers)
            request_id = f"rank{self.rank}.{n}"
            body = {"rank": self.rank, "n": n, "action": action, "alert": alert, "step": self.known_step(), "t": time.time()}
            try:
                write_json_atomic(self.layout.request(self.rank, n), body)
            except OSError as e:
                log.warning("mindwatch: cannot write the %s request (%s); rank %d acts alone", action, e, self.rank)
                self.control.schedule(action, {**alert, "coordination": {"alone": f"cannot write the request: {e}"}})
                continue
            self._waiting[request_id] = (self.clock(), action, alert)

    def _read_decisions(self) -> None:
        for d in self._decisions.read_new():
            self.decisions_seen += 1
            for request_id in d.get("covers") or ():
                self._waiting.pop(request_id, None)
            action = d.get("action")
            if not action or "merged_into" in d:
                continue
            info = {k: d.get(k) for k in ("seq", "at_step", "requested_by", "now")}
            if d.get("now"):
                alert = {**(d.get("alert") or {}), "coordination": info}
                if action == "stop" and self.on_now is not None:
                    self.on_now(alert)  # maybe no step boundary comes: the session may end the process
                else:
                    self.control.schedule(action, alert)
                continue
            at_step = d.get("at_step")
            known = self.known_step()
            if isinstance(at_step, int) and known is not None and known > at_step:
                log.warning(
                    "mindwatch: rank %d is at step %d, past step %d that decision %s chose for %s: it acts at once",
                    self.rank,
                    known,
                    at_step,
                    d.get("seq"),
                    action,
                )
            self.control.schedule(action, {**(d.get("alert") or {}), "coordination": info}, at_step)

    def _act_alone_when_unanswered(self, now: float) -> None:
        for request_id, (sent, action, alert) in list(self._waiting.items()):
            if now - sent < self.decide_timeout:
                continue
            del self._waiting[request_id]
            why = f"no decision from rank 0 within {self.decide_timeout:g} s"
            log.warning("mindwatch: %s for the %s request %s: rank %d acts alone", why, action, request_id, self.rank)
            self.control.schedule(action, {**alert, "coordination": {"alone": why}})

    def known_step(self) -> int | None:
        """This rank's step now, extrapolated from its newest record by the step time (records may be sparse)."""
        if self.last_step is None or self._last_t is None:
            return self.last_step
        secs = self.step_secs()
        ahead = int((time.time() - self._last_t) / secs) if secs else 0
        return self.last_step + max(0, ahead)

    def step_secs(self) -> float | None:
        return statistics.median(self._step_secs) if self._step_secs else None

    # -- rank 0 ------------------------------------------------------------------------
    def _decide_requests(self) -> None:
        try:
            names = os.listdir(self.layout.control)
        except OSError:
            return
        for name in sorted(names):
            m = _REQUEST.match(name)
            if not m or name in self._handled:
                continue
            body = read_json(self.layout.control / name)
            if body is None:
                continue  # not complete yet (atomic rename: only on a strange file system)
            self._handled.add(name)
            alert = body.get("alert") or {}
            step = body.get("step")
            self._decide(
                str(body.get("action")),
                alert,
                requester=int(m.group(1)),
                request_id=f"rank{m.group(1)}.{m.group(2)}",
                their_step=step if isinstance(step, int) else None,
            )

    def _decide(
        self, action: str, alert: Alert, *, requester: int, request_id: str | None, their_step: int | None = None
    ) -> None:
        known = max((s for s in (self.known_step(), their_step, alert.get("step")) if isinstance(s, int)), default=0)
        covers = [request_id] if request_id else []
        key = (action, alert.get("rule"))
        open_decision = self._open.get(key)
        if open_decision is not None and (open_decision[1] >= known or action == "stop"):
            self._publish({"seq": next(self._seq), "merged_into": open_decision[0], "covers": covers, "requested_by": requester})
            return
        at_step = known + self.margin_steps()
        seq = next(self._seq)
        self._open[key] = (seq, at_step)
        self._publish(
            {
                "seq": seq,
                "t": time.time(),
                "action": action,
                "at_step": at_step,
                "requested_by": requester,
                "covers": covers,
                "alert": alert,
            }
        )
        log.info("mindwatch: every rank carries out %s after step %d (asked by rank %d)", action, at_step, requester)

    def publish_now(self, action: str, alert: Alert) -> None:
        """Rank 0: every rank carries out ``action`` at once (a lost rank: no step boundary can be agreed)."""
        self._publish(
            {"seq": next(self._seq), "t": time.time(), "action": action, "now": True, "requested_by": 0, "alert": alert}
        )

    def margin_steps(self) -> int:
        secs = self.step_secs()
        if not secs:
            return self.min_margin_steps
        return max(self.min_margin_steps, math.ceil(self.margin_secs / secs))

    def _publish(self, decision: dict[str, Any]) -> None:
        try:
            with open(self.layout.decisions, "ab") as f:
                f.write(encode_line(decision))
        except OSError as e:
            log.warning("mindwatch: cannot publish decision %s (%s)", decision.get("seq"), e)


def _size(path: os.PathLike[str]) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _count_lines(path: os.PathLike[str]) -> int:
    with contextlib.suppress(OSError), open(path, "rb") as f:
        return f.read().count(b"\n")
    return 0
