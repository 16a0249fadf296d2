"""Who may see the dashboard: everyone on loopback, only token holders when it is exposed.

Example::

    app = TokenGate(app, token="s3cret")    # Authorization: Bearer s3cret, or the cookie set by /login

``GET /login`` shows a one-field form; ``POST /login`` with the right token sets an HttpOnly,
SameSite=Strict cookie (EventSource cannot send headers, so the browser needs the cookie).
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import re
from urllib.parse import parse_qs

from starlette.types import ASGIApp, Receive, Scope, Send

COOKIE = "mindwatch_token"
_NEED_TOKEN = "this dashboard needs a token: send 'Authorization: Bearer <token>' or sign in at /login"
_TOKEN = re.compile(r"[A-Za-z0-9._~+/=-]{8,256}")

_LOGIN_PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>mindwatch: sign in</title>
<link rel="stylesheet" href="/static/style.css"></head><body class="login">
<form method="post" action="/login"><h1>mindwatch</h1>
<p>This dashboard needs the token given to <code>mindwatch serve --token</code>.</p>
<input type="password" name="token" placeholder="token" autofocus required>
<button type="submit">Sign in</button>{error}</form></body></html>"""


def is_loopback(host: str) -> bool:
    """True for 127.0.0.1, ::1, localhost and the rest of 127.0.0.0/8."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class TokenGate:
    """ASGI middleware: lets a request through only with the token (header or cookie)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        if not _TOKEN.fullmatch(token or ""):
            raise ValueError(
                "the dashboard token must be at least 8 characters of letters, digits or ._~+/=-; "
                "e.g. --token $(openssl rand -hex 16)"
            )
        self.app = app
        self.token = token.encode()

    def _allowed(self, scope: Scope) -> bool:
        headers = dict(scope.get("headers") or [])
        auth = headers.get(b"authorization", b"")
        if auth[:7].lower() == b"bearer " and hmac.compare_digest(auth[7:].strip(), self.token):
            return True
        for part in headers.get(b"cookie", b"").split(b";"):
            name, _, value = part.strip().partition(b"=")
            if name == COOKIE.encode() and hmac.compare_digest(value, self.token):
                return True
        return False

    def _query_token(self, scope: Scope) -> bool:
        given = (parse_qs(scope.get("query_string", b"").decode("utf-8", "replace")).get("token") or [""])[0]
        return hmac.compare_digest(given.encode(), self.token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        if path == "/login":
            await self._login(scope, receive, send)
        elif path == "/static/style.css" or self._allowed(scope):
            await self.app(scope, receive, send)
        elif path == "/" and self._query_token(scope):  # the link printed at start (Jupyter-style): set the cookie
            cookie = f"{COOKIE}={self.token.decode()}; HttpOnly; SameSite=Strict; Path=/".encode()
            await _respond(send, 303, b"", b"text/plain", [(b"location", b"/"), (b"set-cookie", cookie)])
        elif path.startswith("/api/"):
            body = json.dumps({"error": _NEED_TOKEN})
            await _respond(send, 401, body.encode(), b"application/json", [(b"www-authenticate", b"Bearer")])
        else:
            await _respond(send, 303, b"", b"text/plain", [(b"location", b"/login")])

    async def _login(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] == "POST":
            body = b""
            while True:
                msg = await receive()
                body += msg.get("body", b"")
                if len(body) > 4096:
                    await _respond(send, 413, b"form too large", b"text/plain")
                    return
                if not msg.get("more_body"):
                    break
            token = (parse_qs(body.decode("utf-8", "replace")).get("token") or [""])[0].encode()
            if hmac.compare_digest(token, self.token):
                cookie = f"{COOKIE}={self.token.decode()}; HttpOnly; SameSite=Strict; Path=/".encode()
                await _respond(send, 303, b"", b"text/plain", [(b"location", b"/"), (b"set-cookie", cookie)])
                return
            page = _LOGIN_PAGE.format(error='<p class="error">Wrong token.</p>')
            await _respond(send, 401, page.encode(), b"text/html; charset=utf-8")
            return
        await _respond(send, 200, _LOGIN_PAGE.format(error="").encode(), b"text/html; charset=utf-8")


async def _respond(
    send: Send, status: int, body: bytes, content_type: bytes, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode()), *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
