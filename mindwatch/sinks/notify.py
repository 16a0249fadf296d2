"""Notifications: alerts and the end of the run, to DingTalk, Feishu/Lark, WeCom, Slack, webhooks and email.

Example::

    # monitor_config:
    #   dashboard_url: http://gpu-node-1:8080          # messages link to the run's page
    #   notify:
    #     - {type: dingtalk, url_env: DINGTALK_URL, secret_env: DINGTALK_SECRET}
    #     - {type: feishu, url_env: FEISHU_URL, secret_env: FEISHU_SECRET}
    #     - {type: slack, url_env: SLACK_WEBHOOK_URL, min_severity: error, events: [alerts]}
    #     - {type: webhook, url: "http://alerts.internal:8080/mindwatch"}
    #     - {type: email, host: smtp.example.com, sender: mw@example.com, to: [ops@example.com],
    #        username_env: SMTP_USER, password_env: SMTP_PASSWORD}

    sink = NotifySink([Slack(url)], context={"project": "gpt", "run": "run_1", "rank": 0})
    sink.alert(alert)      # returns at once; a sender thread per channel formats and sends it
    sink.close("failed", error="RuntimeError: ...")   # the end-of-run message, then the senders stop

A channel gets, by default, every alert of severity ``warning`` and above and the end-of-run message:
one anomaly, one message. What an action did (the ``intervention`` alerts, severity ``info``) goes to
``alerts.jsonl``, the dashboard and the report; a channel sends it on its own only with
``min_severity: info``, and the end-of-run message tells it in a line (``action: saved ...``), or, for a
stop, in its reason (``stopped by mindwatch: loss is nan at step 12``). A field that is unknown (None) is
left out of every message, never shown as ``None``.

Each channel has its own sender thread and a bounded queue, so a dead or slow endpoint
delays only its own messages and never the training: a request times out after
``timeout`` seconds and is retried ``retries`` times with backoff, then dropped with a
warning. Warnings name the channel type and host only; URLs (which hold the service's
token), signing secrets and SMTP passwords are never logged or written anywhere.

The end-of-run message (``events: [end]``, on by default) says how the run ended: finished,
failed (with the error), stopped (with the reason), or, in a multi-rank run, with ranks lost
(rank 0 reads the other ranks' status files when it ends). Only a rank that never wrote a final
state is called lost; one that ended otherwise than this rank (``failed`` while this one finished)
is named with its state, and one that ended the same way (a coordinated stop) is not mentioned. A
process killed outright (``kill -9``, out of memory) cannot send one; its stall alerts and the
dashboard's ``stale`` state are what remains.

:meth:`NotifySink.urgent` is for an alert that must leave before the launcher kills this process
(``rank_lost``): it goes to a sender process of its own (:mod:`mindwatch.sinks.handoff`) at once.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import html
import json
import logging
import queue
import smtplib
import ssl as _ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from email.message import EmailMessage
from pathlib import Path
from typing import Any, Protocol

from mindwatch.alerts.alert import Alert, severity_at_least, step_text
from mindwatch.analysis.progress import Progress
from mindwatch.config import ChannelSettings
from mindwatch.store.layout import RunLayout, read_json
from mindwatch.store.sink import BaseSink
from mindwatch.store.states import FINAL_STATES, rank_state
from mindwatch.units import format_duration, format_number

log = logging.getLogger("mindwatch")

#: A channel's defaults (``min_severity``, ``events``, ``timeout``, ``retries``): the config's, the one owner.
_DEFAULTS = ChannelSettings()


class Refused(Exception):
    """The service refused the message (bad signature, unknown recipient): retrying will not help."""


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
    """How a run ended, as the end-of-run message tells it."""

    state: str
    step: int | None = None
    total_steps: int | None = None
    final_loss: float | None = None
    alerts: int = 0
    duration: float | None = None
    error: str | None = None
    reason: str | None = None
    #: Other ranks that did not finish: ``{rank: "stale after step 40"}``.
    lost_ranks: dict[int, str] = field(default_factory=dict)
    #: What this rank's actions did (the ``intervention`` alerts' messages), but a stop, which ``state`` tells.
    interventions: list[str] = field(default_factory=list)


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


def end_message(end: RunEnd, context: dict[str, Any]) -> Message:
    how = end.state
    # a rank that wrote a final state is described by it ("failed after step 41: ..."): it ended, it is not lost
    gone = sorted(r for r, what in end.lost_ranks.items() if not what.startswith(FINAL_STATES))
    if gone:
        how += f", rank{'s' if len(gone) > 1 else ''} {', '.join(map(str, gone))} lost"
    for state in FINAL_STATES:
        ended = sorted(r for r, what in end.lost_ranks.items() if what.startswith(state))
        if ended:
            how += f", rank{'s' if len(ended) > 1 else ''} {', '.join(map(str, ended))} {state}"
    title = f"mindwatch: {_run_name(context) or 'run'} {how}"
    lines = []
    if end.error:
        lines.append(f"error: {end.error}")
    if end.reason:
        lines.append(f"reason: {end.reason}")
    for rank, what in sorted(end.lost_ranks.items()):
        lines.append(f"rank {rank}: {what}")
    done = "no step recorded" if end.step is None else Progress(end.step, end.total_steps).text(running=False)
    if end.duration is not None:
        done += f", {format_duration(end.duration)}"
    if context.get("host"):
        done += f" on {context['host']}"
    lines.append(done)
    if end.final_loss is not None:
        lines.append(f"final loss {end.final_loss:.4f}")
    lines.append(f"{end.alerts} alert{'' if end.alerts == 1 else 's'}")
    lines += [f"action: {what}" for what in end.interventions[:_INTERVENTION_LINES]]
    if len(end.interventions) > _INTERVENTION_LINES:
        lines.append(f"and {len(end.interventions) - _INTERVENTION_LINES} more actions (alerts.jsonl has them all)")
    fields = _known({"event": "end", **context, **asdict(end), "t": time.time()})
    fields["lost_ranks"] = {str(r): w for r, w in end.lost_ranks.items()}
    return _with_places(Message("end", "the end-of-run message", title, lines, fields), context)


#: The end-of-run message tells the first this many actions done; alerts.jsonl has them all.
_INTERVENTION_LINES = 5


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


def markdown(msg: Message, bold: str = "**") -> str:
    """The message for chat services: a bold title, then one paragraph a line."""
    return "\n\n".join([f"{bold}{msg.title}{bold}", *msg.lines])


class Channel(Protocol):
    """Where messages go; :meth:`deliver` runs on the channel's sender thread."""

    kind: str
    min_severity: str
    events: tuple[str, ...]
    timeout: float
    retries: int

    @property
    def label(self) -> str:
        """``type (host)``: how warnings name the channel without leaking its token."""

    def deliver(self, msg: Message) -> None:
        """Send once; raise :class:`Refused` when retrying cannot help, any ``OSError`` when it may."""

    def secrets(self) -> list[str]:
        """Strings no warning may show."""


class Webhook:
    """Plain JSON: the alert's (or the ending's) fields plus the run's (``project``, ``run``, ``rank``, ``host``)."""

    kind = "webhook"

    def __init__(
        self,
        url: str,
        *,
        timeout: float = _DEFAULTS.timeout,
        retries: int = _DEFAULTS.retries,
        min_severity: str = _DEFAULTS.min_severity,
        events: Sequence[str] = tuple(_DEFAULTS.events),
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"a {self.kind} URL must start with http:// or https://")
        self.url = url
        self.timeout, self.retries, self.min_severity, self.events = timeout, retries, min_severity, tuple(events)

    @property
    def label(self) -> str:
        return f"{self.kind} ({urllib.parse.urlsplit(self.url).hostname})"

    def body(self, msg: Message) -> dict[str, Any]:
        return msg.fields

    def request_url(self) -> str:
        return self.url

    def check_response(self, body: bytes) -> str | None:
        """The service's complaint in a 2xx answer, or None when it took the message."""
        return None

    def deliver(self, msg: Message) -> None:
        data = json.dumps(self.body(msg), default=str).encode("utf-8")
        req = urllib.request.Request(self.request_url(), data=data, headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # noqa: S310 (http/https checked at construction)
                complaint = self.check_response(resp.read(65536))
        except urllib.error.HTTPError as e:
            if 400 <= e.code < 500 and e.code != 429:
                raise Refused(f"HTTP {e.code}") from None
            raise OSError(f"HTTP {e.code}") from None
        if complaint is not None:
            raise Refused(complaint)  # a 200 with an error code (bad signature, keyword missing): permanent

    def secrets(self) -> list[str]:
        return [self.url]


class DingTalk(Webhook):
    """A DingTalk custom robot; with ``secret`` ("加签") each request is signed (timestamp + HMAC-SHA256)."""

    kind = "dingtalk"

    def __init__(self, url: str, *, secret: str | None = None, **kw: Any) -> None:
        super().__init__(url, **kw)
        self.secret = secret

    def body(self, msg: Message) -> dict[str, Any]:
        return {"msgtype": "markdown", "markdown": {"title": msg.title, "text": markdown(msg)}}

    def request_url(self) -> str:
        if not self.secret:
            return self.url
        timestamp, sign = dingtalk_sign(self.secret)
        sep = "&" if "?" in self.url else "?"
        return f"{self.url}{sep}timestamp={timestamp}&sign={urllib.parse.quote_plus(sign)}"

    def check_response(self, body: bytes) -> str | None:
        return _errcode(body)

    def secrets(self) -> list[str]:
        return [self.url, *([self.secret] if self.secret else [])]


def dingtalk_sign(secret: str, timestamp_ms: int | None = None) -> tuple[str, str]:
    """DingTalk's signature: ``base64(HMAC-SHA256(key=secret, msg=f"{timestamp}\\n{secret}"))``, timestamp in ms."""
    timestamp = str(timestamp_ms if timestamp_ms is not None else round(time.time() * 1000))
    digest = hmac.new(secret.encode("utf-8"), f"{timestamp}\n{secret}".encode(), hashlib.sha256).digest()
    return timestamp, base64.b64encode(digest).decode("ascii")


class Feishu(Webhook):
    """A Feishu/Lark custom bot: a rich-text ("post") message; with ``secret`` ("签名校验") the body is signed."""

    kind = "feishu"

    def __init__(self, url: str, *, secret: str | None = None, **kw: Any) -> None:
        super().__init__(url, **kw)
        self.secret = secret

    def body(self, msg: Message) -> dict[str, Any]:
        content: list[list[dict[str, str]]] = [[{"tag": "text", "text": line}] for line in msg.lines]
        if msg.link:
            content.append([{"tag": "a", "text": "open the run's dashboard", "href": msg.link}])
        out: dict[str, Any] = {"msg_type": "post", "content": {"post": {"zh_cn": {"title": msg.title, "content": content}}}}
        if self.secret:
            out["timestamp"], out["sign"] = feishu_sign(self.secret)
        return out

    def check_response(self, body: bytes) -> str | None:
        try:
            answer = json.loads(body or b"{}")
        except ValueError:
            return None
        code = answer.get("code", answer.get("StatusCode", 0)) if isinstance(answer, dict) else 0
        return None if code == 0 else f"code {code}: {answer.get('msg', answer.get('StatusMessage'))}"

    def secrets(self) -> list[str]:
        return [self.url, *([self.secret] if self.secret else [])]


def feishu_sign(secret: str, timestamp_s: int | None = None) -> tuple[str, str]:
    """Feishu's signature: ``base64(HMAC-SHA256(key=f"{timestamp}\\n{secret}", msg=b""))``, timestamp in seconds."""
    timestamp = str(timestamp_s if timestamp_s is not None else int(time.time()))
    digest = hmac.new(f"{timestamp}\n{secret}".encode(), b"", hashlib.sha256).digest()
    return timestamp, base64.b64encode(digest).decode("ascii")


class WeCom(Webhook):
    """A WeCom (企业微信) group robot: a markdown message."""

    kind = "wecom"

    def body(self, msg: Message) -> dict[str, Any]:
        return {"msgtype": "markdown", "markdown": {"content": markdown(msg)}}

    def check_response(self, body: bytes) -> str | None:
        return _errcode(body)


class Slack(Webhook):
    """A Slack incoming webhook: ``{"text": ...}`` in Slack's mrkdwn."""

    kind = "slack"

    def body(self, msg: Message) -> dict[str, Any]:
        return {"text": markdown(msg, bold="*")}


def _errcode(body: bytes) -> str | None:
    try:
        answer = json.loads(body or b"{}")
    except ValueError:
        return None
    if isinstance(answer, dict) and answer.get("errcode", 0) != 0:
        return f"errcode {answer.get('errcode')}: {answer.get('errmsg')}"
    return None


class Email:
    """Email through SMTP: plain text and HTML. ``starttls="auto"`` upgrades when the server offers STARTTLS."""

    kind = "email"

    def __init__(
        self,
        host: str,
        *,
        sender: str,
        to: Sequence[str],
        port: int | None = None,
        starttls: str | bool = "auto",
        ssl: bool = False,
        username: str | None = None,
        password: str | None = None,
        timeout: float = _DEFAULTS.timeout,
        retries: int = _DEFAULTS.retries,
        min_severity: str = _DEFAULTS.min_severity,
        events: Sequence[str] = tuple(_DEFAULTS.events),
        tls_context: _ssl.SSLContext | None = None,
    ) -> None:
        if not to:
            raise ValueError("an email channel needs at least one address in 'to'")
        self.host, self.port, self.sender, self.to = host, port, sender, list(to)
        self.starttls, self.ssl = starttls, ssl
        self.username, self.password = username, password
        self.timeout, self.retries, self.min_severity, self.events = timeout, retries, min_severity, tuple(events)
        self.tls_context = tls_context  # None: the system's trusted certificates

    @property
    def label(self) -> str:
        return f"email ({self.host})"

    def email(self, msg: Message) -> EmailMessage:
        em = EmailMessage()
        em["Subject"] = msg.title
        em["From"] = self.sender
        em["To"] = ", ".join(self.to)
        em.set_content("\n\n".join(msg.lines) + "\n")
        paragraphs = "".join(f"<p>{_html_line(line, msg.link)}</p>" for line in msg.lines)
        em.add_alternative(f"<html><body><h3>{html.escape(msg.title)}</h3>{paragraphs}</body></html>", subtype="html")
        return em

    def deliver(self, msg: Message) -> None:
        tls = self.tls_context or _ssl.create_default_context()
        try:
            if self.ssl:
                conn: smtplib.SMTP = smtplib.SMTP_SSL(self.host, self.port or 465, timeout=self.timeout, context=tls)
            else:
                conn = smtplib.SMTP(self.host, self.port or 25, timeout=self.timeout)
            with conn:
                conn.ehlo()
                if not self.ssl and (self.starttls is True or (self.starttls == "auto" and conn.has_extn("starttls"))):
                    conn.starttls(context=tls)
                    conn.ehlo()
                if self.username is not None:
                    conn.login(self.username, self.password or "")
                conn.send_message(self.email(msg))
        except smtplib.SMTPNotSupportedError:
            raise Refused("the server does not offer STARTTLS (starttls: true)") from None
        except (smtplib.SMTPAuthenticationError, smtplib.SMTPRecipientsRefused) as e:
            raise Refused(_smtp_text(e)) from None
        except smtplib.SMTPResponseException as e:
            if e.smtp_code >= 500:
                raise Refused(_smtp_text(e)) from None
            raise OSError(_smtp_text(e)) from None

    def secrets(self) -> list[str]:
        return [s for s in (self.password,) if s]


def _smtp_text(e: smtplib.SMTPException) -> str:
    if isinstance(e, smtplib.SMTPRecipientsRefused):
        return "recipients refused: " + ", ".join(f"{a} ({c})" for a, (c, _m) in e.recipients.items())
    if isinstance(e, smtplib.SMTPResponseException):
        text = e.smtp_error.decode("utf-8", "replace") if isinstance(e.smtp_error, bytes) else str(e.smtp_error)
        return f"SMTP {e.smtp_code}: {text}"
    return str(e)


def _html_line(line: str, link: str | None) -> str:
    if link and line.endswith(link):
        head = line[: -len(link)]
        return f'{html.escape(head)}<a href="{html.escape(link, quote=True)}">{html.escape(link)}</a>'
    return html.escape(line)


WEBHOOKS: dict[str, type[Webhook]] = {c.kind: c for c in (Webhook, DingTalk, Feishu, WeCom, Slack)}

#: A sender's work: an alert or an ending, formatted on the sender's thread (the worker only queues it).
_Item = tuple[str, Any]


class _Sender:
    """One channel's queue and thread."""

    def __init__(self, channel: Channel, context: dict[str, Any], capacity: int) -> None:
        self.channel = channel
        self.context = context
        self.queue: queue.Queue[_Item | None] = queue.Queue(capacity)
        self.sent = 0
        self.failed = 0
        self.dropped = 0
        self.busy = False
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"mindwatch-notify-{channel.kind}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            self.busy = True
            try:
                kind, what = item
                self._send(alert_message(what, self.context) if kind == "alert" else end_message(what, self.context))
            finally:
                self.busy = False

    def _send(self, msg: Message) -> None:
        ch = self.channel
        error = ""
        for attempt in range(ch.retries + 1):
            if attempt and self.stopping.wait(min(0.5 * 2 ** (attempt - 1), 5.0)):
                break  # closing: no more waiting
            try:
                ch.deliver(msg)
            except Refused as e:
                error = str(e)
                break  # the service refuses this message: retrying will not help
            except (OSError, ValueError) as e:  # timeouts, refused connections, SMTP errors are OSErrors
                error = str(getattr(e, "reason", None) or e) or type(e).__name__
                continue
            self.sent += 1
            return
        self.failed += 1
        log.warning(
            "mindwatch: gave up sending %s to %s after %d tries: %s; training continues",
            msg.what,
            ch.label,
            attempt + 1,
            self._scrub(error),
        )

    def _scrub(self, text: str) -> str:
        for secret in self.channel.secrets():
            if secret:
                text = text.replace(secret, "***")
        return text


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
        self._senders = [_Sender(ch, self.context, capacity) for ch in channels]
        self._warned_full: set[str] = set()
        self._last_step: int | None = None
        self._final_loss: float | None = None
        self._alerts = 0
        self._interventions: list[str] = []

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
        if alert.get("rule") != "intervention" or failed:
            self._alerts += 1
        if any(alert is sent for sent in self._handed_off):
            return
        for s in self._senders:
            if "alerts" in s.channel.events and severity_at_least(alert, s.channel.min_severity):
                self._put(s, ("alert", alert))

    def _put(self, s: _Sender, item: _Item) -> None:
        try:
            s.queue.put_nowait(item)
        except queue.Full:
            s.dropped += 1
            if s.channel.label not in self._warned_full:
                self._warned_full.add(s.channel.label)
                log.warning("mindwatch: %s is not keeping up; alerts for it are dropped", s.channel.label)

    def write(self, records: list[dict[str, Any]]) -> None:
        for rec in records:
            step, loss = rec.get("step"), rec.get("loss")
            if isinstance(step, int):
                self._last_step = step
            if isinstance(loss, (int, float)):
                self._final_loss = float(loss)

    def flush(self) -> None:
        pass

    def ending(self, state: str, error: str | None = None, reason: str | None = None) -> RunEnd:
        """The end-of-run message's facts: this rank's last step and loss, the alerts seen, the other ranks' states."""
        return RunEnd(
            state=state,
            step=self._last_step,
            total_steps=self.total_steps,
            final_loss=self._final_loss,
            alerts=self._alerts,
            duration=time.time() - self.started,
            error=error,
            reason=reason,
            lost_ranks=self._lost_ranks(state),
        )

    def _lost_ranks(self, ending: str) -> dict[int, str]:
        if self.world_size <= 1:
            return {}
        heard = self.rank_ends() if self.rank_ends is not None else {}
        layout, out = (RunLayout(self.run_dir) if self.run_dir is not None else None), {}
        died = ((read_json(layout.status(0)) if layout else None) or {}).get("lost_ranks") or {}  # rank 0's liveness
        for rank in range(1, self.world_size):
            st = heard.get(rank) or (read_json(layout.status(rank)) if layout else None)
            if str(rank) in died and (st or {}).get("state") not in FINAL_STATES:
                d = died[str(rank)]
                where = ", ".join(f"{k} {d[k]}" for k in ("pid", "host") if d.get(k) is not None)
                at = f" at step {d['last_step']}" if d.get("last_step") is not None else ""
                out[rank] = f"died{at}" + (f" ({where.replace(', host', ' on host')})" if where else "")
                continue
            if st is None and layout is None:
                continue  # nothing to go by: say nothing rather than guess
            state = rank_state(st) if st is not None else "missing"
            if state == "finished" or (state == ending and state in FINAL_STATES):
                continue  # it ended as this rank did (a coordinated stop): nothing to tell
            after = f" after step {st['last_step']}" if st and isinstance(st.get("last_step"), int) else ""
            why = f": {st.get('error') or st.get('reason')}" if st and (st.get("error") or st.get("reason")) else ""
            out[rank] = {
                "stale": f"no heartbeat{after} (killed or lost)",
                "missing": "never wrote its status",
                "running": f"still running{after}",
            }.get(state, f"{state}{after}{why}")
        return out

    def close(self, state: str, error: str | None = None, reason: str | None = None) -> None:
        """Queue the end-of-run message, give the senders up to ``close_grace`` seconds to deliver, then leave them."""
        end = self.ending(state, error, reason)
        end.interventions = list(self._interventions)
        for s in self._senders:
            if "end" in s.channel.events:
                self._put(s, ("end", end))
        deadline = time.monotonic() + self.close_grace
        for s in self._senders:
            with contextlib.suppress(queue.Full):
                s.queue.put_nowait(None)
        for s in self._senders:
            s.thread.join(max(0.0, deadline - time.monotonic()))
            if s.thread.is_alive():
                s.stopping.set()
                left = s.queue.qsize() + int(s.busy)
                log.warning("mindwatch: %s did not answer in time; %d message(s) not delivered", s.channel.label, left)


def build_channels(configs: Sequence[Any], environ: dict[str, str] | None = None) -> list[Channel]:
    """Channels from the ``notify:`` section; URLs, secrets and SMTP logins from the environment where named."""
    import os

    env = os.environ if environ is None else environ
    out: list[Channel] = []
    for c in configs:
        common: dict[str, Any] = {"timeout": c.timeout, "retries": c.retries, "min_severity": c.min_severity, "events": c.events}
        if c.type == "email":
            login: dict[str, Any] = {}
            if c.username_env is not None:
                user, password = env.get(c.username_env), env.get(c.password_env or "")
                if user is None or password is None:
                    missing = c.username_env if user is None else c.password_env
                    log.warning("mindwatch: notify channel email: environment variable %s is not set; channel off", missing)
                    continue
                login = {"username": user, "password": password}
            kw: dict[str, Any] = {"port": c.port, "sender": c.sender, "to": c.to, "starttls": c.starttls, "ssl": c.ssl}
            out.append(Email(c.host, **kw, **login, **common))
            continue
        url = c.url if c.url is not None else env.get(c.url_env or "")
        if not url:
            log.warning("mindwatch: notify channel %s: environment variable %s is not set; channel off", c.type, c.url_env)
            continue
        if c.type in ("dingtalk", "feishu"):
            secret = c.secret if c.secret is not None else (env.get(c.secret_env) if c.secret_env else None)
            if c.secret_env and not secret:
                log.warning(
                    "mindwatch: notify channel %s: environment variable %s is not set; sending unsigned", c.type, c.secret_env
                )
            common["secret"] = secret
        try:
            out.append(WEBHOOKS[c.type](url, **common))
        except ValueError as e:
            log.warning("mindwatch: notify channel %s is off: %s", c.type, e)
    return out
