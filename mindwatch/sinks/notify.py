"""Notifications: alerts and the end of the run, to DingTalk, Feishu/Lark, WeCom, Slack, webhooks and email.

Example::

    # monitor_config:
    #   dashboard_url: http://gpu-node-1:8080          # messages link to the run's page
    #   notify:
    #     - {type: slack, url_env: SLACK_WEBHOOK_URL, min_severity: error, events: [alerts]}
    #     - {type: email, host: smtp.example.com, sender: mw@example.com, to: [ops@example.com]}

    sink = NotifySink(build_channels(config.notify), context={"project": "gpt", "run": "run_1", "rank": 0})
    sink.alert(alert)      # returns at once; a sender thread per channel formats and sends it
    sink.close("failed", error="RuntimeError: ...")   # the end-of-run message, then the senders stop

This module is the sink the worker feeds; what a message says is :mod:`mindwatch.sinks.messages`, where it
goes :mod:`mindwatch.sinks.channels`, and how it leaves (a queue and a thread a channel, retries)
:mod:`mindwatch.sinks.sender`.

A channel gets, by default, every alert of severity ``warning`` and above and the end-of-run message:
one anomaly, one message. What an action did (the ``intervention`` alerts, severity ``info``) goes to
``alerts.jsonl``, the dashboard and the report; a channel sends it on its own only with
``min_severity: info``, and the end-of-run message tells it in a line (``action: saved ...``), or, for a
stop, in its reason (``stopped by mindwatch: loss is nan at step 12``).

The end-of-run message (``events: [end]``, on by default) says how the run ended: finished,
failed (with the error), stopped (with the reason), or, in a multi-rank run, with ranks lost
(rank 0 reads the other ranks' status files when it ends). Only a rank that never wrote a final
state is called lost; one that ended otherwise than this rank (``failed`` while this one finished)
is named with its state, and one that ended the same way (a coordinated stop) is not mentioned. A
process killed outright (``kill -9``, out of memory) cannot send one; its stall alerts and the
dashboard's ``stale`` state are what remains. Its numbers (the last step, the final loss, the duration)
are this rank's :class:`~mindwatch.analysis.summary.RunSummary`'s, made from what the sink holds.

:meth:`NotifySink.urgent` is for an alert that must leave before the launcher kills this process
(``rank_lost``): it goes to a sender process of its own (:mod:`mindwatch.sinks.handoff`) at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mindwatch.alerts.alert import Alert
from mindwatch.analysis.rewinds import run_rewinds
from mindwatch.analysis.state_text import MISSING, died_text, rank_end_text
from mindwatch.analysis.summary import RunSummary, listed
from mindwatch.sinks.channels import Channel
from mindwatch.sinks.messages import RunEnd
from mindwatch.sinks.sender import Item, Sender, takes_alert
from mindwatch.store.layout import RunLayout, read_json
from mindwatch.store.sink import BaseSink
from mindwatch.store.states import FINAL_STATES, lost_ranks, rank_state

log = logging.getLogger("mindwatch")


@dataclass
class _Held:
    """What the sink holds of the run, in the shape a summary's listing is made from
    (:class:`~mindwatch.analysis.summary.RunFacts`): this rank's last record, the alerts it counted."""

    path: Path
    meta: dict[str, Any]
    last_record: dict[int, dict[str, Any]]
    alert_count: int
    statuses: dict[int, dict[str, Any]] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)


class NotifySink(BaseSink):
    """Sink that sends alerts (at or above each channel's ``min_severity``) and the end of the run to the channels;
    what the actions did (``intervention`` alerts) is also a line of the end-of-run message, and no alert of the count.

    ``run_dir`` and ``world_size``: where rank 0 looks, when the run ends, for ranks that did not finish.
    ``handoff``: starts a sender process for an urgent alert (:meth:`urgent`); False when it could not.
    ``rank_ends``: how each other rank ended as rank 0 heard it on the lifeline (``{rank: {"state", "last_step",
    "reason"}}``): it counts before the status files, which may be on another node.
    """

    def __init__(
        self,
        channels: Sequence[Channel],
        *,
        context: dict[str, Any] | None = None,
        capacity: int = 100,
        close_grace: float = 3.0,
        run_dir: str | Path | None = None,
        world_size: int = 1,
        handoff: Callable[[Alert], bool] | None = None,
        rank_ends: Callable[[], dict[int, dict[str, Any]]] | None = None,
    ) -> None:
        self.context = dict(context or {})
        self.handoff = handoff
        self.rank_ends = rank_ends
        self._handed_off: list[Alert] = []  # sent by a sender process already: not again when they come as alerts
        self.close_grace = close_grace
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.world_size = world_size
        #: The step the training ends at, for the end-of-run message; set at train begin.
        self.total_steps: int | None = None
        self.started = time.time()
        self._senders = [Sender(ch, self.context, capacity) for ch in channels]
        self._warned_full: set[str] = set()
        self._last_record: dict[str, Any] | None = None
        self._alerts = 0
        self._interventions: list[str] = []
        self._rewinds: list[Alert] = []  # this rank's rewinds' intervention alerts (analysis.rewinds reads them)

    @property
    def channels(self) -> list[Channel]:
        return [s.channel for s in self._senders]

    def stats(self) -> dict[str, dict[str, int]]:
        """Per channel label: how many messages were sent, given up on, dropped (queue full)."""
        return {s.channel.label: {"sent": s.sent, "failed": s.failed, "dropped": s.dropped} for s in self._senders}

    def urgent(self, alert: Alert) -> None:
        """Send ``alert`` now, from a process that outlives this one (the launcher is about to kill it); when
        the same alert reaches :meth:`alert` later (through alerts.jsonl's sinks) it is counted, not sent again."""
        if self.handoff is not None and self.handoff(alert):
            self._handed_off.append(alert)
            return
        self.alert(alert)
        self._handed_off.append(alert)
        self._alerts -= 1

    def plan(self, total_steps: int | None) -> None:
        self.total_steps = total_steps

    def alert(self, alert: Alert) -> None:
        failed = alert.get("error") is not None  # an action that failed is a warning: an alert of its own
        if alert.get("rule") == "intervention" and (failed or alert.get("actions") != ["stop"]):
            # what an action did is a line of the end-of-run message; a stop is told by the run's state and reason
            self._interventions.append(str(alert.get("message") or ", ".join(alert.get("actions") or [])))
            if alert.get("actions") == ["rewind"]:
                self._rewinds.append(alert)
        if alert.get("rule") != "intervention" or failed:
            self._alerts += 1
        if any(alert is sent for sent in self._handed_off):
            return
        for s in self._senders:
            if takes_alert(s.channel.settings, alert):
                self._put(s, ("alert", alert))

    def _put(self, s: Sender, item: Item) -> None:
        if not s.offer(item) and s.channel.label not in self._warned_full:
            self._warned_full.add(s.channel.label)
            log.warning("mindwatch: %s is not keeping up; alerts for it are dropped", s.channel.label)

    def write(self, records: list[dict[str, Any]]) -> None:
        if records:
            self._last_record = records[-1]

    def flush(self) -> None:
        pass

    def summary(self) -> RunSummary:
        """This rank's run so far, as every view sums a run up: its last record, the alerts counted, its duration."""
        now = time.time()
        held = _Held(
            path=self.run_dir or Path(),
            meta={"started_at": self.started, "ended_at": now, "total_steps": self.total_steps},
            last_record={0: self._last_record} if self._last_record is not None else {},
            alert_count=self._alerts,
        )
        return listed(held, now)

    def ending(self, state: str, error: str | None = None, reason: str | None = None) -> RunEnd:
        """The end-of-run message's facts: this rank's summary, how it ended, the other ranks' endings."""
        lost = self._other_endings(state)
        return RunEnd.of(self.summary(), state, error=error, reason=reason, lost_ranks=lost)

    def _statuses(self) -> dict[int, dict[str, Any]]:
        """Rank 0's status (its liveness check's ``lost_ranks``) and the other ranks': as heard, else their files."""
        heard = self.rank_ends() if self.rank_ends is not None else {}
        layout = RunLayout(self.run_dir) if self.run_dir is not None else None
        out = {}
        for rank in range(self.world_size):
            st = heard.get(rank) or (read_json(layout.status(rank)) if layout else None)
            if st is not None:
                out[rank] = st
        return out

    def _other_endings(self, ending: str) -> dict[int, str]:
        """The ranks but 0 that did not end as this one (``ending``), each in the words of
        :func:`~mindwatch.analysis.state_text.rank_end_text`, or :func:`~mindwatch.analysis.state_text.died_text` for
        one rank 0 saw die."""
        if self.world_size <= 1:
            return {}
        statuses = self._statuses()
        died, out = lost_ranks(statuses), {}
        for rank in range(1, self.world_size):
            st = statuses.get(rank)
            if rank in died:
                out[rank] = died_text(died[rank])
                continue
            if st is None and self.run_dir is None:
                continue  # nothing to go by: say nothing rather than guess
            state = rank_state(st) if st is not None else MISSING
            if state == "finished" or (state == ending and state in FINAL_STATES):
                continue  # it ended as this rank did (a coordinated stop): nothing to tell
            out[rank] = rank_end_text(state, st)
        return out

    def close(self, state: str, error: str | None = None, reason: str | None = None) -> None:
        """Queue the end-of-run message, give the senders up to ``close_grace`` seconds to deliver, then leave them."""
        end = self.ending(state, error, reason)
        end.interventions = list(self._interventions)
        end.rewinds = run_rewinds(self._rewinds)
        for s in self._senders:
            if "end" in s.channel.settings.events:
                self._put(s, ("end", end))
        deadline = time.monotonic() + self.close_grace
        for s in self._senders:
            s.close()
        for s in self._senders:
            left = s.finish(deadline)
            if left is not None:
                log.warning("mindwatch: %s did not answer in time; %d message(s) not delivered", s.channel.label, left)
