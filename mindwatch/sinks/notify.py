"""Webhook notifications for alerts: DingTalk, WeCom, Slack and plain JSON.

Example::

    # monitor_config:
    #   notify:
    #     - {type: dingtalk, url_env: DINGTALK_URL, secret_env: DINGTALK_SECRET}
    #     - {type: slack, url_env: SLACK_WEBHOOK_URL, min_severity: warning}
    #     - {type: webhook, url: "http://alerts.internal:8080/mindwatch"}

    sink = NotifySink([Slack(url)], context={"project": "gpt", "run": "run_1", "rank": 0})
    sink.alert(alert)      # returns at once; a sender thread per channel posts it

Each channel has its own sender thread and a bounded queue, so a dead or slow endpoint
delays only its own messages and never the training: a request times out after
``timeout`` seconds and is retried ``retries`` times with backoff, then dropped with a
warning. Warnings name the channel type and host only; the URL (which holds the
service's token) and the DingTalk secret are never logged or written anywhere.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import logging
import queue
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

from mindwatch.alerts.alert import Alert, severity_at_least, step_text

log = logging.getLogger("mindwatch")


class Webhook:
    """Plain JSON: the alert's fields plus the run's (``project``, ``run``, ``rank``, ``host``) in one object."""

    kind = "webhook"

    def __init__(self, url: str, *, timeout: float = 5.0, retries: int = 2, min_severity: str = "info") -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"a {self.kind} URL must start with http:// or https://")
        self.url = url
        self.timeout, self.retries, self.min_severity = timeout, retries, min_severity

    @property
    def label(self) -> str:
        """``type (host)``: how warnings name the channel without leaking its token."""
        return f"{self.kind} ({urllib.parse.urlsplit(self.url).hostname})"

    def payload(self, alert: Alert, context: dict[str, Any]) -> dict[str, Any]:
        return {**context, **alert}

    def request_url(self) -> str:
        return self.url

    def check_response(self, body: bytes) -> str | None:
        """The service's complaint in a 2xx answer, or None when it took the message."""
        return None

    def _secrets(self) -> list[str]:
        return [self.url]


def alert_text(alert: Alert, context: dict[str, Any], *, bold: str = "**") -> tuple[str, str]:
    """A title and a markdown body for chat services."""
    sev = str(alert.get("severity", "warning")).upper()
    title = f"mindwatch {sev}: {alert.get('rule')} in {context.get('project')}/{context.get('run')}"
    lines = [
        f"{bold}{title}{bold}",
        str(alert.get("message", "")),
        f"{step_text(alert)}, rank {alert.get('rank')}, host {context.get('host')}",
    ]
    if alert.get("metric") is not None:
        lines.append(f"{alert['metric']} = {alert.get('value')} (threshold {alert.get('threshold')})")
    if alert.get("actions"):
        lines.append("actions: " + ", ".join(alert["actions"]))
    if context.get("run_dir"):
        lines.append(f"run directory: {context['run_dir']}")
    return title, "\n\n".join(lines)


class DingTalk(Webhook):
    """A DingTalk custom robot; with ``secret`` ("加签") each request is signed (timestamp + HMAC-SHA256)."""

    kind = "dingtalk"

    def __init__(self, url: str, *, secret: str | None = None, **kw: Any) -> None:
        super().__init__(url, **kw)
        self.secret = secret

    def payload(self, alert: Alert, context: dict[str, Any]) -> dict[str, Any]:
        title, text = alert_text(alert, context)
        return {"msgtype": "markdown", "markdown": {"title": title, "text": text}}

    def request_url(self) -> str:
        if not self.secret:
            return self.url
        timestamp, sign = dingtalk_sign(self.secret)
        sep = "&" if "?" in self.url else "?"
        return f"{self.url}{sep}timestamp={timestamp}&sign={urllib.parse.quote_plus(sign)}"

    def check_response(self, body: bytes) -> str | None:
        return _errcode(body)

    def _secrets(self) -> list[str]:
        return [self.url, *([self.secret] if self.secret else [])]


def dingtalk_sign(secret: str, timestamp_ms: int | None = None) -> tuple[str, str]:
    """DingTalk's signature: ``base64(HMAC-SHA256(key=secret, msg=f"{timestamp}\\n{secret}"))``, timestamp in ms."""
    timestamp = str(timestamp_ms if timestamp_ms is not None else round(time.time() * 1000))
    digest = hmac.new(secret.encode("utf-8"), f"{timestamp}\n{secret}".encode(), hashlib.sha256).digest()
    return timestamp, base64.b64encode(digest).decode("ascii")


class WeCom(Webhook):
    """A WeCom (企业微信) group robot: a markdown message."""

    kind = "wecom"

    def payload(self, alert: Alert, context: dict[str, Any]) -> dict[str, Any]:
        _title, text = alert_text(alert, context)
        return {"msgtype": "markdown", "markdown": {"content": text}}

    def check_response(self, body: bytes) -> str | None:
        return _errcode(body)


class Slack(Webhook):
    """A Slack incoming webhook: ``{"text": ...}`` in Slack's mrkdwn."""

    kind = "slack"

    def payload(self, alert: Alert, context: dict[str, Any]) -> dict[str, Any]:
        _title, text = alert_text(alert, context, bold="*")
        return {"text": text}


def _errcode(body: bytes) -> str | None:
    try:
        answer = json.loads(body or b"{}")
    except ValueError:
        return None
    if isinstance(answer, dict) and answer.get("errcode", 0) != 0:
        return f"errcode {answer.get('errcode')}: {answer.get('errmsg')}"
    return None


CHANNELS: dict[str, type[Webhook]] = {c.kind: c for c in (Webhook, DingTalk, WeCom, Slack)}


class _Sender:
    """One channel's queue and thread."""

    def __init__(self, channel: Webhook, context: dict[str, Any], capacity: int) -> None:
        self.channel = channel
        self.context = context
        self.queue: queue.Queue[Alert | None] = queue.Queue(capacity)
        self.sent = 0
        self.failed = 0
        self.dropped = 0
        self.busy = False
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"mindwatch-notify-{channel.kind}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            alert = self.queue.get()
            if alert is None:
                return
            self.busy = True
            try:
                self._send(alert)
            finally:
                self.busy = False

    def _send(self, alert: Alert) -> None:
        ch = self.channel
        data = json.dumps(ch.payload(alert, self.context), default=str).encode("utf-8")
        error = ""
        for attempt in range(ch.retries + 1):
            if attempt and self.stopping.wait(min(0.5 * 2 ** (attempt - 1), 5.0)):
                break  # closing: no more waiting
            req = urllib.request.Request(ch.request_url(), data=data, headers={"Content-Type": "application/json"}, method="POST")
            try:
                with urllib.request.urlopen(req, timeout=ch.timeout) as resp:  # noqa: S310 (http/https checked at construction)
                    complaint = ch.check_response(resp.read(65536))
            except urllib.error.HTTPError as e:
                error = f"HTTP {e.code}"
                if 400 <= e.code < 500 and e.code != 429:
                    break  # the service refuses this message: retrying will not help
                continue
            except (OSError, ValueError) as e:  # timeouts are OSErrors
                error = str(getattr(e, "reason", None) or e) or type(e).__name__
                continue
            if complaint is None:
                self.sent += 1
                return
            error = complaint
            break  # a 200 with an error code (bad signature, keyword missing): permanent
        self.failed += 1
        log.warning(
            "mindwatch: gave up sending the %s alert to %s after %d tries: %s; training continues",
            alert.get("rule"),
            ch.label,
            attempt + 1,
            self._scrub(error),
        )

    def _scrub(self, text: str) -> str:
        for secret in self.channel._secrets():
            if secret:
                text = text.replace(secret, "***")
        return text


class NotifySink:
    """Sink that sends every alert (at or above each channel's ``min_severity``) to the channels."""

    def __init__(
        self, channels: Sequence[Webhook], *, context: dict[str, Any] | None = None, capacity: int = 100, close_grace: float = 3.0
    ) -> None:
        self.context = dict(context or {})
        self.close_grace = close_grace
        self._senders = [_Sender(ch, self.context, capacity) for ch in channels]
        self._warned_full: set[str] = set()

    @property
    def channels(self) -> list[Webhook]:
        return [s.channel for s in self._senders]

    def stats(self) -> dict[str, dict[str, int]]:
        """Per channel label: how many alerts were sent, given up on, dropped (queue full)."""
        return {s.channel.label: {"sent": s.sent, "failed": s.failed, "dropped": s.dropped} for s in self._senders}

    def alert(self, alert: Alert) -> None:
        for s in self._senders:
            if not severity_at_least(alert, s.channel.min_severity):
                continue
            try:
                s.queue.put_nowait(alert)
            except queue.Full:
                s.dropped += 1
                if s.channel.label not in self._warned_full:
                    self._warned_full.add(s.channel.label)
                    log.warning("mindwatch: %s is not keeping up; alerts for it are dropped", s.channel.label)

    def write(self, records: list[dict[str, Any]]) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self, state: str, error: str | None = None, reason: str | None = None) -> None:
        """Give the senders up to ``close_grace`` seconds to deliver what is queued, then leave them (daemon threads)."""
        deadline = time.monotonic() + self.close_grace
        for s in self._senders:
            with contextlib.suppress(queue.Full):
                s.queue.put_nowait(None)
        for s in self._senders:
            s.thread.join(max(0.0, deadline - time.monotonic()))
            if s.thread.is_alive():
                s.stopping.set()
                left = s.queue.qsize() + int(s.busy)
                log.warning("mindwatch: %s did not answer in time; %d alert(s) not delivered", s.channel.label, left)


def build_channels(configs: Sequence[Any], environ: dict[str, str] | None = None) -> list[Webhook]:
    """Channels from the ``notify:`` section; URLs and secrets from the environment where named (``url_env``)."""
    import os

    env = os.environ if environ is None else environ
    out: list[Webhook] = []
    for c in configs:
        url = c.url if c.url is not None else env.get(c.url_env or "")
        if not url:
            log.warning("mindwatch: notify channel %s: environment variable %s is not set; channel off", c.type, c.url_env)
            continue
        kw: dict[str, Any] = {"timeout": c.timeout, "retries": c.retries, "min_severity": c.min_severity}
        if c.type == "dingtalk":
            secret = c.secret if c.secret is not None else (env.get(c.secret_env) if c.secret_env else None)
            if c.secret_env and not secret:
                log.warning(
                    "mindwatch: notify channel dingtalk: environment variable %s is not set; sending unsigned", c.secret_env
                )
            kw["secret"] = secret
        try:
            out.append(CHANNELS[c.type](url, **kw))
        except ValueError as e:
            log.warning("mindwatch: notify channel %s is off: %s", c.type, e)
    return out
