"""Where notifications go: DingTalk, Feishu/Lark, WeCom, Slack, a plain webhook, email; each built from its section.

Example::

    # monitor_config:
    #   notify:
    #     - {type: dingtalk, url_env: DINGTALK_URL, secret_env: DINGTALK_SECRET}
    #     - {type: feishu, url_env: FEISHU_URL, secret_env: FEISHU_SECRET}
    #     - {type: slack, url_env: SLACK_WEBHOOK_URL, min_severity: error, events: [alerts]}
    #     - {type: webhook, url: "http://alerts.internal:8080/mindwatch"}
    #     - {type: email, host: smtp.example.com, sender: mw@example.com, to: [ops@example.com],
    #        username_env: SMTP_USER, password_env: SMTP_PASSWORD}

    channels = build_channels(config.notify)     # URLs, secrets and SMTP logins read from the environment
    Slack(NotifyChannel(type="slack", url=url, retries=0))   # one channel by hand: the same validated section

A channel's settings (``min_severity``, ``events``, ``timeout``, ``retries``) are its section's,
:class:`mindwatch.config.ChannelSettings`: the config is the one owner of their defaults and of the
channel types. :meth:`Channel.deliver` runs on the channel's sender thread (:mod:`mindwatch.sinks.sender`),
sends once, and raises :class:`Refused` when retrying cannot help. Warnings name the channel type and host
only (:attr:`Channel.label`); URLs (which hold the service's token), signing secrets and SMTP passwords
are never logged or written anywhere.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import html
import json
import logging
import os
import smtplib
import ssl as _ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from email.message import EmailMessage
from typing import Any, Protocol

from mindwatch.config import ChannelSettings, EmailChannel, NotifyChannel, WebhookType, http_url
from mindwatch.sinks.messages import Message, markdown

log = logging.getLogger("mindwatch")


class Refused(Exception):
    """The service refused the message (bad signature, unknown recipient): retrying will not help."""


class Channel(Protocol):
    """Where messages go; :meth:`deliver` runs on the channel's sender thread."""

    @property
    def settings(self) -> ChannelSettings:
        """The channel's section of ``notify:``: which alerts and events it gets, its timeout and retries."""

    @property
    def kind(self) -> str:
        """The channel's type (``slack``, ``email``): its section's."""

    @property
    def label(self) -> str:
        """``type (host)``: how warnings name the channel without leaking its token."""

    def deliver(self, msg: Message) -> None:
        """Send once; raise :class:`Refused` when retrying cannot help, any ``OSError`` when it may."""

    def secrets(self) -> list[str]:
        """Strings no warning may show."""


class Webhook:
    """Plain JSON: the alert's (or the ending's) fields plus the run's (``project``, ``run``, ``rank``, ``host``).

    ``settings.url`` is the URL to post to: :func:`build_channels` fills it from ``url_env``.
    """

    def __init__(self, settings: NotifyChannel) -> None:
        if settings.url is None:
            raise ValueError(f"a {settings.type} channel needs its URL: build_channels reads it from {settings.url_env}")
        self.settings = settings
        self.url = settings.url
        self.secret = settings.secret

    @property
    def kind(self) -> str:
        return self.settings.type

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
            with urllib.request.urlopen(req, timeout=self.settings.timeout) as resp:  # noqa: S310 (http/https: config.http_url)
                complaint = self.check_response(resp.read(65536))
        except urllib.error.HTTPError as e:
            if 400 <= e.code < 500 and e.code != 429:
                raise Refused(f"HTTP {e.code}") from None
            raise OSError(f"HTTP {e.code}") from None
        if complaint is not None:
            raise Refused(complaint)  # a 200 with an error code (bad signature, keyword missing): permanent

    def secrets(self) -> list[str]:
        return [self.url, *([self.secret] if self.secret else [])]


class DingTalk(Webhook):
    """A DingTalk custom robot; with ``secret`` ("加签") each request is signed (timestamp + HMAC-SHA256)."""

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


def dingtalk_sign(secret: str, timestamp_ms: int | None = None) -> tuple[str, str]:
    """DingTalk's signature: ``base64(HMAC-SHA256(key=secret, msg=f"{timestamp}\\n{secret}"))``, timestamp in ms."""
    timestamp = str(timestamp_ms if timestamp_ms is not None else round(time.time() * 1000))
    digest = hmac.new(secret.encode("utf-8"), f"{timestamp}\n{secret}".encode(), hashlib.sha256).digest()
    return timestamp, base64.b64encode(digest).decode("ascii")


class Feishu(Webhook):
    """A Feishu/Lark custom bot: a rich-text ("post") message; with ``secret`` ("签名校验") the body is signed."""

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


def feishu_sign(secret: str, timestamp_s: int | None = None) -> tuple[str, str]:
    """Feishu's signature: ``base64(HMAC-SHA256(key=f"{timestamp}\\n{secret}", msg=b""))``, timestamp in seconds."""
    timestamp = str(timestamp_s if timestamp_s is not None else int(time.time()))
    digest = hmac.new(f"{timestamp}\n{secret}".encode(), b"", hashlib.sha256).digest()
    return timestamp, base64.b64encode(digest).decode("ascii")


class WeCom(Webhook):
    """A WeCom (企业微信) group robot: a markdown message."""

    def body(self, msg: Message) -> dict[str, Any]:
        return {"msgtype": "markdown", "markdown": {"content": markdown(msg)}}

    def check_response(self, body: bytes) -> str | None:
        return _errcode(body)


class Slack(Webhook):
    """A Slack incoming webhook: ``{"text": ...}`` in Slack's mrkdwn."""

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


#: The class that posts to each webhook type (:data:`mindwatch.config.WebhookType` names them).
WEBHOOKS: dict[WebhookType, type[Webhook]] = {
    "dingtalk": DingTalk,
    "feishu": Feishu,
    "wecom": WeCom,
    "slack": Slack,
    "webhook": Webhook,
}


class Email:
    """Email through SMTP: plain text and HTML. ``starttls="auto"`` upgrades when the server offers STARTTLS.

    ``login``: the SMTP user name and password (:func:`build_channels` reads them from ``username_env`` and
    ``password_env``). ``tls_context``: None trusts the system's certificates.
    """

    def __init__(
        self, settings: EmailChannel, *, login: tuple[str, str] | None = None, tls_context: _ssl.SSLContext | None = None
    ) -> None:
        self.settings = settings
        self.login = login
        self.tls_context = tls_context

    @property
    def kind(self) -> str:
        return self.settings.type

    @property
    def label(self) -> str:
        return f"{self.kind} ({self.settings.host})"

    def email(self, msg: Message) -> EmailMessage:
        em = EmailMessage()
        em["Subject"] = msg.title
        em["From"] = self.settings.sender
        em["To"] = ", ".join(self.settings.to)
        em.set_content("\n\n".join(msg.lines) + "\n")
        paragraphs = "".join(f"<p>{_html_line(line, msg.link)}</p>" for line in msg.lines)
        em.add_alternative(f"<html><body><h3>{html.escape(msg.title)}</h3>{paragraphs}</body></html>", subtype="html")
        return em

    def deliver(self, msg: Message) -> None:
        s, tls = self.settings, self.tls_context or _ssl.create_default_context()
        try:
            if s.ssl:
                conn: smtplib.SMTP = smtplib.SMTP_SSL(s.host, s.smtp_port, timeout=s.timeout, context=tls)
            else:
                conn = smtplib.SMTP(s.host, s.smtp_port, timeout=s.timeout)
            with conn:
                conn.ehlo()
                if not s.ssl and (s.starttls is True or (s.starttls == "auto" and conn.has_extn("starttls"))):
                    conn.starttls(context=tls)
                    conn.ehlo()
                if self.login is not None:
                    conn.login(*self.login)
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
        return [self.login[1]] if self.login and self.login[1] else []


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


def build_channels(configs: Sequence[NotifyChannel | EmailChannel], environ: Mapping[str, str] | None = None) -> list[Channel]:
    """Channels from the ``notify:`` section; URLs, secrets and SMTP logins from the environment where named. A channel
    whose variable is not set is left out, with a warning (a signing secret's: the channel sends unsigned)."""
    env = os.environ if environ is None else environ
    out: list[Channel] = []
    for c in configs:
        if isinstance(c, EmailChannel):
            login = None
            if c.username_env is not None:
                user, password = env.get(c.username_env), env.get(c.password_env or "")
                if user is None or password is None:
                    missing = c.username_env if user is None else c.password_env
                    log.warning("mindwatch: notify channel email: environment variable %s is not set; channel off", missing)
                    continue
                login = (user, password)
            out.append(Email(c, login=login))
            continue
        url = c.url if c.url is not None else env.get(c.url_env or "")
        if not url:
            log.warning("mindwatch: notify channel %s: environment variable %s is not set; channel off", c.type, c.url_env)
            continue
        secret = c.secret if c.secret is not None else (env.get(c.secret_env) if c.secret_env else None)
        if c.secret_env and not secret:
            log.warning(
                "mindwatch: notify channel %s: environment variable %s is not set; sending unsigned", c.type, c.secret_env
            )
        try:
            out.append(WEBHOOKS[c.type](c.model_copy(update={"url": http_url(url), "secret": secret})))
        except ValueError as e:
            log.warning("mindwatch: notify channel %s is off: %s", c.type, e)
    return out
