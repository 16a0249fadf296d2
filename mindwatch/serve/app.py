"""``mindwatch serve LOGDIR``: the dashboard's web app (Starlette) and the server that runs it (uvicorn).

Example::

    from mindwatch.serve.app import create_app, serve
    app = create_app("monitor_output")                 # an ASGI app (tests use it with httpx)
    serve("monitor_output", host="127.0.0.1", port=8765)

The app only reads run directories under LOGDIR; it never imports MindSpore, so it runs on a
laptop next to a copy (or a network mount) of the run directories.

The page is plain ES modules (static/app.js imports the rest, no build step); it holds no metric name:
``static/vocabulary.js`` reads the vocabulary (:mod:`mindwatch.metrics`) from ``/api/vocabulary``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from importlib import resources
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mindwatch.assets import SHARED_FILES, asset_path, echarts_js
from mindwatch.serve.acting import ControlApi
from mindwatch.serve.api import Api
from mindwatch.serve.auth import TokenGate, is_loopback
from mindwatch.serve.live import LiveHub
from mindwatch.serve.views import BadRequest, Catalog, NotFound
from mindwatch.store.cache import ColumnCache

log = logging.getLogger("mindwatch.serve")

#: The only files the app serves from serve/static besides the API (never a path taken from the request).
STATIC_FILES = {
    "app.js": "text/javascript",
    "api.js": "text/javascript",
    "dom.js": "text/javascript",
    "vocabulary.js": "text/javascript",
    "series.js": "text/javascript",
    "runs_page.js": "text/javascript",
    "run_charts.js": "text/javascript",
    "run_page.js": "text/javascript",
    "run_panels.js": "text/javascript",
    "compare_page.js": "text/javascript",
    "chart_view.js": "text/javascript",
    "layers_view.js": "text/javascript",
    "histograms_view.js": "text/javascript",
    "profiles_view.js": "text/javascript",
    "run_actions.js": "text/javascript",
    "chart_tools.js": "text/javascript",
    "run_notes.js": "text/javascript",
    "style.css": "text/css",
    "index.html": "text/html",
}
_SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:",
}


def _static_dir() -> Path:
    return Path(str(resources.files("mindwatch.serve") / "static"))


def _served_files(echarts: Path) -> dict[str, tuple[Path, str, str]]:
    """Every file under /static/: name -> (path, media type, Cache-Control); the same whitelist for all of them."""
    static = _static_dir()
    files = {name: (static / name, media, "no-cache") for name, media in STATIC_FILES.items()}
    files.update({name: (asset_path(name), "text/javascript", "no-cache") for name in SHARED_FILES})
    files["echarts.min.js"] = (echarts, "text/javascript", "max-age=86400")
    return files


def create_app(
    logdir: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    token: str | None = None,
    poll_secs: float = 0.1,
    cache: ColumnCache | None = None,
    allow_control: bool = False,
) -> ASGIApp:
    """The dashboard for the runs under ``logdir`` (or several: each node's save_dir, one run read as one);
    with ``token``, every request must carry it.

    ``allow_control``: ``POST /api/request`` files a person's request into a live run (needs ``token``).

    ``cache`` keeps the columns of long runs on disk for the next start (see :mod:`mindwatch.store.cache`).

    A ``logdir`` that does not exist yet (the training has not made its ``save_dir``) is listed once it appears.
    """
    if allow_control and not token:
        raise ValueError("a dashboard that takes requests (allow_control) needs a token, even on 127.0.0.1")
    logdirs = [Path(logdir)] if isinstance(logdir, (str, os.PathLike)) else [Path(d) for d in logdir]
    catalog = Catalog(logdirs, cache=cache, missing_ok=True)
    api = Api(catalog)
    control = ControlApi(catalog, allowed=allow_control)
    hub = LiveHub(catalog, poll_secs=poll_secs)
    files = _served_files(echarts_js())  # echarts_js fails at start, with the fix in the message, not on a page view
    app = Starlette(
        routes=[*_file_routes(files), *_api_routes(api, control, hub)],
        exception_handlers={BadRequest: _error_answer(400), NotFound: _error_answer(404), Exception: _server_error},
        lifespan=_lifespan(hub, cache),
    )
    app.state.catalog = catalog
    app.state.hub = hub
    guarded: ASGIApp = _SecurityHeaders(app)
    return TokenGate(guarded, token) if token else guarded


def _file_routes(files: dict[str, tuple[Path, str, str]]) -> list[Route]:
    """The page and its files under /static/ (only those in ``files``: never a path taken from the request)."""

    def page(req: Request) -> Response:
        return FileResponse(files["index.html"][0], media_type="text/html", headers={"Cache-Control": "no-cache"})

    def static_file(req: Request) -> Response:
        name = req.path_params["name"]
        if name not in files:
            return JSONResponse({"error": f"no static file {name[:60]!r}"}, status_code=404)
        path, media, cache_control = files[name]
        return FileResponse(path, media_type=media, headers={"Cache-Control": cache_control})

    return [
        Route("/", page),
        Route("/favicon.ico", lambda req: Response(status_code=204)),
        Route("/static/{name}", static_file),
    ]


def _api_routes(api: Api, control: ControlApi, hub: LiveHub) -> list[Route]:
    """The JSON API, the live stream and, with ``--allow-control``, a person's requests and notes."""

    def live(req: Request) -> Response:
        return hub.runs_stream(req) if req.query_params.get("runs") else hub.run_stream(req)

    return [
        Route("/api/vocabulary", api.vocabulary),
        Route("/api/runs", api.runs),
        Route("/api/run", api.run),
        Route("/api/series", api.series),
        Route("/api/csv", api.csv),
        Route("/api/band", api.band),
        Route("/api/outliers", api.outliers),
        Route("/api/heatmap", api.heatmap),
        Route("/api/alerts", api.alerts),
        Route("/api/histograms", api.histograms),
        Route("/api/compare", api.compare),
        Route("/api/compare/runs", api.compare_runs),
        Route("/api/profiles", api.profiles),
        Route("/api/profile-trace", api.profile_trace),
        Route("/api/live", live),
        Route("/api/control", control.control),
        Route("/api/request", control.request, methods=["GET", "POST"]),
        Route("/api/notes", control.notes, methods=["POST"]),
    ]


def _error_answer(status: int) -> Callable[[Request, Exception], Awaitable[Response]]:
    """A handler that answers an exception with its message as ``{"error": ...}`` and ``status``."""

    async def answer(req: Request, exc: Exception) -> Response:
        return JSONResponse({"error": str(exc)}, status_code=status)

    return answer


async def _server_error(req: Request, exc: Exception) -> Response:
    log.exception("mindwatch serve: %s %s failed", req.method, req.url.path, exc_info=exc)
    return JSONResponse({"error": "internal error; the server log has the details"}, status_code=500)


def _lifespan(hub: LiveHub, cache: ColumnCache | None) -> Callable[[Starlette], AbstractAsyncContextManager[None]]:
    """The live hub's polling, started with the app; at its end the column cache finishes writing for the next start."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await hub.start()
        try:
            yield
        finally:
            await hub.stop()
            if cache is not None:
                cache.join(timeout=10)  # finish writing the column cache for the next start

    return lifespan


class _SecurityHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.headers = [(k.lower().encode(), v.encode()) for k, v in _SECURITY_HEADERS.items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(msg: Message) -> None:
            if msg["type"] == "http.response.start":
                msg = {**msg, "headers": [*msg.get("headers", []), *self.headers]}
            await send(msg)

        await self.app(scope, receive, send_with_headers if scope["type"] == "http" else send)


def check_binding(host: str, token: str | None) -> None:
    """Refuse to expose the dashboard beyond this machine without a token."""
    if not is_loopback(host) and not token:
        raise SystemExit(
            f"mindwatch serve: refusing to listen on {host} without a token: anyone who can reach it could read your runs. "
            "Add --token $(openssl rand -hex 16) (or set MINDWATCH_TOKEN), or use --host 127.0.0.1 and an SSH tunnel."
        )


def serve(
    logdir: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    host: str = "127.0.0.1",
    port: int = 8765,
    token: str | None = None,
    cache: bool = True,
    allow_control: bool = False,
) -> int:
    """Run the dashboard until Ctrl-C; ``allow_control`` with no token makes one up and prints it (Jupyter-style)."""
    import secrets

    import uvicorn

    check_binding(host, token)
    made_up = allow_control and not token
    if made_up:
        token = secrets.token_hex(16)
    try:
        app = create_app(logdir, token=token, cache=ColumnCache() if cache else None, allow_control=allow_control)
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"mindwatch serve: {e}") from None
    shown = f"[{host}]" if ":" in host else host
    dirs = [Path(logdir)] if isinstance(logdir, (str, os.PathLike)) else [Path(d) for d in logdir]
    shown_dirs = ", ".join(str(d.resolve()) for d in dirs)
    print(f"mindwatch serve: dashboard for {shown_dirs} at http://{shown}:{port}/", flush=True)
    for d in dirs:
        if not d.is_dir():
            print(
                f"mindwatch serve: {d.resolve()} does not exist yet; its runs will show as soon as they appear there",
                file=sys.stderr,
                flush=True,
            )
    if made_up:
        print(
            f"mindwatch serve: it takes requests (--allow-control); sign in with http://{shown}:{port}/?token={token}", flush=True
        )
    uvicorn.run(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=1)
    return 0
