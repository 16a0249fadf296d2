"""What a notification says: an alert, or the end of the run, as a title and paragraphs before any service's format.

Example::

    from mindwatch.sinks.messages import alert_message, markdown
    msg = alert_message(alert, {"project": "gpt", "run": "run_1", "host": "node-7"})
    msg.title            # 'mindwatch WARNING: spike in gpt/run_1'
    markdown(msg)        # what DingTalk, WeCom and Slack show

Runs on each channel's sender thread (:mod:`mindwatch.sinks.sender`): the worker only queues the alert or the
:class:`RunEnd`. A field that is unknown (None) is left out of every message, never shown as ``None``. The run's numbers
in the end-of-run message are its :class:`~mindwatch.analysis.summary.RunSummary`'s, and how a state reads is
:mod:`mindwatch.analysis.state_text`'s.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from mindwatch.alerts.alert import SEVERITIES, Alert, step_text
from mindwatch.analysis.progress import Progress, iterations_text
from mindwatch.analysis.rewinds import RunRewind
from mindwatch.analysis.state_text import ending_words
from mindwatch.analysis.summary import RunSummary, field_label
from mindwatch.units import format_duration, format_number

#: The end-of-run message tells the first this many actions done; alerts.jsonl has them all.
_INTERVENTION_LINES = 5
#: A message of alerts that came together tells the first this many; alerts.jsonl has them all.
_GROUP_LINES = 10


@dataclass(frozen=True)
class Message:
    """What every channel sends, before each service's format: a title, paragraphs, and the plain fields."""

    event: str  # "alert" or "end"
    #: ``the spike alert`` / ``the end-of-run message``: how warnings name it.
    what: str
    title: str
    lines: list[str]
    #: The plain JSON a generic webhook receives: the alert's or the ending's fields plus the run's.
    fields: dict[str, Any]
    link: str | None = None


@dataclass
class RunEnd:
    """How a run ended, as the end-of-run message tells it (:meth:`of` takes the numbers from the run's summary)."""

    state: str
    step: int | None = None
    total_steps: int | None = None
    final_loss: float | None = None
    alerts: int = 0
    duration: float | None = None
    error: str | None = None
    reason: str | None = None
    #: Other ranks that did not end as this one: ``{rank: "no heartbeat after step 40 (killed or lost)"}``
    #: (:func:`mindwatch.analysis.state_text.rank_end_text`).
    lost_ranks: dict[int, str] = field(default_factory=dict)
    #: What this rank's actions did (the ``intervention`` alerts' messages), but a stop, which ``state`` tells.
    interventions: list[str] = field(default_factory=list)
    #: The rewinds this rank made: its steps are fewer than the iterations its framework counted.
    rewinds: list[RunRewind] = field(default_factory=list)

    @classmethod
    def of(
        cls,
        summary: RunSummary,
        state: str,
        *,
        error: str | None = None,
        reason: str | None = None,
        lost_ranks: dict[int, str] | None = None,
    ) -> RunEnd:
        """How the run ended (``state``, ``error``, ``reason``, the other ranks' endings) with ``summary``'s last step,
        planned steps, final loss, alert count and duration."""
        return cls(
            state,
            step=summary.last_step,
            total_steps=summary.total_steps,
            final_loss=summary.final_loss,
            alerts=summary.alert_count,
            duration=summary.duration,
            error=error,
            reason=reason,
            lost_ranks=dict(lost_ranks or {}),
        )


def alert_message(alert: Alert, context: dict[str, Any]) -> Message:
    """An alert as every channel tells it; a field that is None is left out."""
    sev = str(alert.get("severity") or "warning").upper()
    rule = alert.get("rule") or "alert"
    title = f"mindwatch {sev}: {rule}{_in_run(context)}"
    lines = [str(alert["message"])] if alert.get("message") else []
    where = [step_text(alert)]
    if alert.get("rank") is not None:
        where.append(f"rank {alert['rank']}")
    if context.get("host"):
        where.append(f"host {context['host']}")
    lines.append(", ".join(where))
    if alert.get("metric") is not None and (alert.get("value") is not None or alert.get("threshold") is not None):
        reading = str(alert["metric"])
        if alert.get("value") is not None:
            reading += f" = {format_number(alert['value'])}"
        if alert.get("threshold") is not None:
            reading += f" (threshold {format_number(alert['threshold'])})"
        lines.append(reading)
    if alert.get("actions"):
        lines.append("actions: " + ", ".join(map(str, alert["actions"])))
    fields = _known({"event": "alert", **context, **alert})
    return _with_places(Message("alert", f"the {rule} alert", title, lines, fields), context)


def alerts_message(alerts: list[Alert], context: dict[str, Any]) -> Message:
    """Alerts of one rule that came together (one event on several layers or ranks, a slowdown every rank sees) as one
    message: where they are in a line, then each alert's own words. One alert is :func:`alert_message`'s."""
    if len(alerts) == 1:
        return alert_message(alerts[0], context)
    sev = max((str(a.get("severity") or "warning") for a in alerts), key=_severity_rank)
    rule = alerts[0].get("rule") or "alert"
    layers = {a["layer"] for a in alerts if a.get("layer") is not None}
    ranks = sorted({a["rank"] for a in alerts if a.get("rank") is not None})
    spread = [f"{len(layers)} layers" if len(layers) > 1 else "", f"{len(ranks)} ranks" if len(ranks) > 1 else ""]
    title = f"mindwatch {sev.upper()}: {rule} x {len(alerts)}{_in_run(context)}"
    steps = sorted({a["step"] for a in alerts if isinstance(a.get("step"), int)})
    at = (f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}") if steps else "before step 1"
    where = [f"{len(alerts)} {rule} alerts at {at}", *(s for s in spread if s)]
    if len(ranks) == 1:
        where.append(f"rank {ranks[0]}")
    if context.get("host"):
        where.append(f"host {context['host']}")
    lines = [", ".join(where)]
    for a in alerts[:_GROUP_LINES]:
        said = [step_text(a)] + ([f"rank {a['rank']}"] if len(ranks) > 1 and a.get("rank") is not None else [])
        lines.append(f"{a.get('message') or rule} ({', '.join(said)})")
    if len(alerts) > _GROUP_LINES:
        lines.append(f"and {len(alerts) - _GROUP_LINES} more (alerts.jsonl has them all)")
    actions = sorted({str(x) for a in alerts for x in a.get("actions") or []})
    if actions:
        lines.append("actions: " + ", ".join(actions))
    fields = _known({"event": "alerts", **context, "rule": rule, "severity": sev, "count": len(alerts), "alerts": alerts})
    return _with_places(Message("alert", f"the {len(alerts)} {rule} alerts", title, lines, fields), context)


def _severity_rank(severity: str) -> int:
    return SEVERITIES.index(severity) if severity in SEVERITIES else 1


def end_message(end: RunEnd, context: dict[str, Any]) -> Message:
    """The end of the run as every channel tells it: how it ended (and the ranks that did not end so), its numbers."""
    title = f"mindwatch: {_run_name(context) or 'run'} {ending_words(end.state, end.lost_ranks)}"
    lines = []
    if end.error:
        lines.append(f"error: {end.error}")
    if end.reason:
        lines.append(f"reason: {end.reason}")
    for rank, what in sorted(end.lost_ranks.items()):
        lines.append(f"rank {rank}: {what}")
    if end.step is None:
        done = "no step recorded"
    elif end.rewinds:
        done = iterations_text(end.step, end.rewinds)
    else:
        done = Progress(end.step, end.total_steps).text(running=False)
    if end.duration is not None:
        done += f", {format_duration(end.duration)}"
    if context.get("host"):
        done += f" on {context['host']}"
    lines.append(done)
    if end.final_loss is not None:
        lines.append(f"{field_label('final_loss')} {end.final_loss:.4f}")
    lines.append(f"{end.alerts} alert{'' if end.alerts == 1 else 's'}")
    lines += [f"action: {what}" for what in end.interventions[:_INTERVENTION_LINES]]
    if len(end.interventions) > _INTERVENTION_LINES:
        lines.append(f"and {len(end.interventions) - _INTERVENTION_LINES} more actions (alerts.jsonl has them all)")
    fields = _known({"event": "end", **context, **asdict(end), "t": time.time()})
    fields["lost_ranks"] = {str(r): w for r, w in end.lost_ranks.items()}
    if not end.rewinds:
        del fields["rewinds"]
    return _with_places(Message("end", "the end-of-run message", title, lines, fields), context)


def markdown(msg: Message, bold: str = "**") -> str:
    """The message for chat services: a bold title, then one paragraph a line."""
    return "\n\n".join([f"{bold}{msg.title}{bold}", *msg.lines])


def _run_name(context: dict[str, Any]) -> str:
    """``project/run``, or as much of it as ``context`` knows."""
    return "/".join(str(context[k]) for k in ("project", "run") if context.get(k) is not None)


def _in_run(context: dict[str, Any]) -> str:
    name = _run_name(context)
    return f" in {name}" if name else ""


def _known(fields: dict[str, Any]) -> dict[str, Any]:
    """The plain webhook's JSON: a field that is None is left out, as in every other message."""
    return {k: v for k, v in fields.items() if v is not None}


def _with_places(msg: Message, context: dict[str, Any]) -> Message:
    lines = list(msg.lines)
    if context.get("dashboard"):
        lines.append(f"dashboard: {context['dashboard']}")
    if context.get("run_dir"):
        lines.append(f"run directory: {context['run_dir']}")
    return Message(msg.event, msg.what, msg.title, lines, msg.fields, context.get("dashboard"))
