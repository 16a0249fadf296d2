"""Live push over Server-Sent Events: new points, alerts and state changes, resumable without loss.

Example (the browser side)::

    const es = new EventSource(`/api/live?run=${id}&metrics=loss,lr&cursor=${cursor}`);
    es.addEventListener("points", e => ...);   // {rank, metrics: {loss: [[step, t, value], ...]}}
    es.addEventListener("alert", e => ...);    // {alerts: [...]}
    es.addEventListener("state", e => ...);    // the run's status summary (banner)
    es.addEventListener("progress", e => ...); // after new points: /api/run's progress (the header's bar)
    es.addEventListener("reload", e => ...);   // too much to push: fetch the charts again

    new EventSource("/api/live?runs=1")         // the runs page: "runs" events with every summary

Every event's id is a cursor (valid lines per rank and alerts seen, see
:mod:`mindwatch.serve.cursor`). A reconnecting EventSource sends it back as
``Last-Event-ID`` and the stream continues from exactly there: nothing lost, nothing twice.

One poller task (:class:`LiveHub`) reads the watched runs every ``poll_secs`` (files are the
source of truth; there is no other channel from training to the dashboard) and wakes the
streams; each stream then takes what is new past its own cursor. A stream with nothing to
send for ``KEEPALIVE_SECS`` sends a comment line, so clients and proxies see it is alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import numpy as np
from starlette.requests import Request
from starlette.responses import StreamingResponse

from mindwatch.serve.api import _plain_alert, check_metric, progress_info, runs_query, runs_table
from mindwatch.serve.cursor import cursor_of, format_cursor, parse_cursor
from mindwatch.serve.views import BadRequest, Catalog, NotFound, RunView
from mindwatch.store.jsonl import encode_number

log = logging.getLogger("mindwatch.serve")

#: More new lines than this for one client at once: send "reload" instead of the points.
MAX_PUSH_LINES = 5000
KEEPALIVE_SECS = 15.0


class LiveHub:
    """Polls the runs that open pages watch and wakes their streams when anything changed."""

    def __init__(self, catalog: Catalog, poll_secs: float = 0.1, runs_secs: float = 1.0) -> None:
        self.catalog = catalog
        self.poll_secs = poll_secs
        self.runs_secs = runs_secs
        self._watched: dict[str, int] = {}
        self._runs_watchers = 0
        # Bumped on the event loop at every change; the event set then is replaced by a fresh one.
        # No lock: asyncio.Condition's lock, taken by every stream, could be left held for good by a
        # stream cancelled while it waited (a client leaving, under anyio's repeated cancellation), and
        # then the poller and every other stream waited on it forever (seen as clients missing points).
        self._version = 0
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._signatures: dict[str, Any] = {}
        self.runs_summary: list[dict[str, Any]] = []
        self._runs_at = 0.0

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        limiter = anyio.CapacityLimiter(1)  # its own thread: the poll never queues behind the streams' work
        while True:
            try:
                watched = list(self._watched)  # taken here: the streams change it on this loop
                if await anyio.to_thread.run_sync(self._poll, watched, self._runs_watchers > 0, limiter=limiter):
                    self._notify()
            except Exception:
                log.exception("mindwatch serve: live poll failed")
            await asyncio.sleep(self.poll_secs)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _notify(self) -> None:
        """Wake every waiting stream (on the event loop)."""
        self._version += 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _poll(self, run_ids: list[str], runs_page: bool) -> bool:
        changed = False
        now = time.time()
        for run_id in run_ids:
            try:
                changed |= self._poll_run(run_id, now)
            except Exception:  # a broken run dir must not stop the live view of the others
                log.exception("mindwatch serve: live poll of %s failed", run_id)
        if runs_page and now - self._runs_at >= self.runs_secs:
            self._runs_at = now
            try:
                changed |= self._poll_runs_page(now)
            except Exception:
                log.exception("mindwatch serve: live poll of the runs page failed")
        return changed  # every change seen (its signature kept) is signalled, whatever failed besides

    def _poll_runs_page(self, now: float) -> bool:
        summaries = self.catalog.summaries(now)
        runs_sig = [(s["id"], s["state"], s["last_step"], s["alert_count"]) for s in summaries]
        if runs_sig == self._signatures.get("runs page"):
            return False
        self._signatures["runs page"] = runs_sig
        self.runs_summary = summaries
        return True

    def _poll_run(self, run_id: str, now: float) -> bool:
        """Read what is new in one run; True when its streams have something to send."""
        try:
            view = self.catalog.open(run_id)
        except (NotFound, BadRequest):  # the run directory went away
            return False
        new = view.refresh()
        with view.lock:
            status = view.status_summary(now)
            sig = (cursor_of(view), status["state"], tuple(sorted(status["ranks"].items(), key=str)), status["error"])
        if new or self._signatures.get(run_id) != sig:
            self._signatures[run_id] = sig
            return True
        return False

    async def wait(self, version: int, timeout: float) -> int:
        """Wait until something changed after ``version`` (or the timeout); returns the current version."""
        if self._version == version:
            changed = self._changed  # no await since the check: a change cannot slip in between
            with anyio.move_on_after(timeout):
                await changed.wait()
        return self._version

    # -- streams -----------------------------------------------------------------------
    def run_stream(self, req: Request) -> StreamingResponse:
        """``GET /api/live?run=ID[&metrics=a,b][&cursor=C]`` (or ``Last-Event-ID: C``)."""
        run_id = req.query_params.get("run") or ""
        view = self.catalog.open(run_id)  # NotFound / BadRequest before the stream starts
        metrics = [m for m in (req.query_params.get("metrics") or "").split(",") if m]
        for m in metrics:
            check_metric(m, "metrics")
        cursor = parse_cursor(req.headers.get("last-event-id") or req.query_params.get("cursor"))
        return _sse(self._run_events(view, metrics or None, cursor))

    def runs_stream(self, req: Request) -> StreamingResponse:
        """``GET /api/live?runs=1[&columns=..&filter=..&sort=..]``: the runs table (:func:`runs_table`), sent at each change."""
        columns, filter_text, sort = runs_query(req)
        runs_table([], columns, filter_text, sort)  # a bad filter is a 400 before the stream starts
        return _sse(self._runs_events(columns, filter_text, sort))

    async def _runs_events(self, columns: list[str], filter_text: str, sort: str) -> AsyncIterator[str]:
        self._runs_watchers += 1
        try:
            self.runs_summary = await anyio.to_thread.run_sync(self.catalog.summaries)
            version = self._version
            sent: Any = None
            last_sent = time.monotonic()
            while True:
                if self.runs_summary is not sent:
                    sent = self.runs_summary
                    last_sent = time.monotonic()
                    try:
                        table = await anyio.to_thread.run_sync(runs_table, sent, columns, filter_text, sort)
                    except BadRequest as e:  # a name that is ambiguous in a run that appeared later
                        table = {"runs": [], "total": len(sent), "columns": [], "error": str(e), "now": time.time()}
                    yield _event("runs", table)
                elif time.monotonic() - last_sent >= KEEPALIVE_SECS:
                    last_sent = time.monotonic()
                    yield ": keep-alive\n\n"
                version = await self.wait(version, _until_keepalive(last_sent))
        finally:
            self._runs_watchers -= 1

    async def _run_events(
        self, view: RunView, metrics: list[str] | None, cursor: tuple[dict[int, tuple[int, int]], int] | None
    ) -> AsyncIterator[str]:
        self._watched[view.id] = self._watched.get(view.id, 0) + 1
        try:
            now = await anyio.to_thread.run_sync(_refreshed_cursor, view)
            if cursor is None:  # a new client without a cursor starts at "now"
                cursor = parse_cursor(now)
            assert cursor is not None
            ranks, alerts_seen = cursor
            last_state: Any = None
            version = self._version
            last_sent = time.monotonic()
            yield "retry: 1000\n\n"
            while True:
                events, ranks, alerts_seen, last_state = await anyio.to_thread.run_sync(
                    self._delta, view, metrics, ranks, alerts_seen, last_state
                )
                for ev in events:
                    yield ev
                if events:
                    last_sent = time.monotonic()
                elif time.monotonic() - last_sent >= KEEPALIVE_SECS:
                    last_sent = time.monotonic()
                    yield ": keep-alive\n\n"
                version = await self.wait(version, _until_keepalive(last_sent))
        finally:
            self._watched[view.id] -= 1
            if not self._watched[view.id]:
                del self._watched[view.id]

    @staticmethod
    def _delta(
        view: RunView, metrics: list[str] | None, ranks: dict[int, tuple[int, int]], alerts_seen: int, last_state: Any
    ) -> tuple[list[str], dict[int, tuple[int, int]], int, Any]:
        """Events for everything past the cursor, and the new cursor (computed under the run's lock)."""
        events = []
        pushed = False
        with view.lock:
            names = metrics or view.metrics
            ranks = dict(ranks)
            for rank, cols in sorted(view.columns.items()):
                gen, seen = ranks.get(rank, (cols.generation, 0))
                if gen != cols.generation or seen > cols.lines:
                    ranks[rank] = (cols.generation, cols.lines)  # the file was replaced: start the charts over
                    reload = {"rank": rank, "reason": "metrics file replaced"}
                    events.append(_event("reload", reload, format_cursor(ranks, alerts_seen)))
                    continue
                if seen == cols.lines:
                    continue
                ranks[rank] = (gen, cols.lines)
                if cols.lines - seen > MAX_PUSH_LINES:
                    events.append(
                        _event("reload", {"rank": rank, "reason": "too many new points"}, format_cursor(ranks, alerts_seen))
                    )
                    continue
                if cols.rewritten_since(seen):  # a resumed attempt writes steps the charts show: they redraw
                    rewound = {"rank": rank, "reason": "a new attempt rewrote steps"}
                    events.append(_event("reload", rewound, format_cursor(ranks, alerts_seen)))
                    continue
                payload: dict[str, list[list[Any]]] = {}
                for name in names:
                    line, value = cols.column(name)
                    # each step once, in step order: after a rewind the line numbers are no longer sorted
                    new = np.flatnonzero(line >= seen) if cols.rewound else np.arange(int(np.searchsorted(line, seen)), len(line))
                    if not len(new):
                        continue
                    new_lines = line[new]
                    steps = cols.steps[new_lines].tolist()
                    times = cols.time_of_lines(new_lines).tolist()
                    values = value[new].tolist()
                    payload[name] = [
                        [s, (t if t == t else None), encode_number(v)] for s, t, v in zip(steps, times, values, strict=True)
                    ]
                events.append(_event("points", {"rank": rank, "metrics": payload}, format_cursor(ranks, alerts_seen)))
                pushed = True
            if alerts_seen < len(view.alerts):
                new_alerts = [_plain_alert(a) for a in view.alerts[alerts_seen:]]
                alerts_seen = len(view.alerts)
                events.append(_event("alert", {"alerts": new_alerts}, format_cursor(ranks, alerts_seen)))
            status = view.status_summary()
            state_key = (status["state"], json.dumps(status["ranks"], sort_keys=True), status["error"])
            # the header's progress bar moves with the points, and with the state (an ended run has no ETA): the one
            # channel the run page's progress comes by
            if pushed or (state_key != last_state and last_state is not None):
                events.append(_event("progress", progress_info(view, status["state"])))
        if state_key != last_state:
            events.append(_event("state", status))
            last_state = state_key
        return events, ranks, alerts_seen, last_state


def _refreshed_cursor(view: RunView) -> str:
    """Read what is new in ``view``; the cursor of where it is now (a worker thread)."""
    view.refresh()
    with view.lock:
        return cursor_of(view)


def _until_keepalive(last_sent: float) -> float:
    """Seconds to wait for a change before a keep-alive is due (after ``KEEPALIVE_SECS`` of silence, not later)."""
    return max(0.0, last_sent + KEEPALIVE_SECS - time.monotonic())


def _event(name: str, data: dict[str, Any], event_id: str | None = None) -> str:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def _sse(events: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(
        events,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
