"""The dashboard's side of a person's requests (stop, checkpoint, lr, batch, profile): ``POST /api/request`` files one.

Example::

    control = ControlApi(catalog, allowed=True)       # mindwatch serve --allow-control (a token is always set then)
    POST /api/request?run=proj/run_1  {"action": "stop", "reason": "diverged"}  -> {"id": ..., "requested_by": ...}
    POST /api/request?run=proj/run_1  {"action": "batch", "size": 64}           -> the same (a DynamicBatch's size)
    POST /api/request?run=proj/run_1  {"action": "profile", "steps": 5}         -> the same (MindSpore's profiler)
    GET  /api/request?run=proj/run_1&id=<id>                                    -> the training's answer (or null)
    POST /api/notes?run=proj/run_1    {"name": "baseline", "note": "..."}       -> the run's notes.json

A run's name and note (:mod:`mindwatch.store.notes`) are writes too, under the same permission.
Without ``--allow-control`` the dashboard writes nothing: the POSTs answer 403 and ``GET /api/control`` says
``{"allowed": false}``, so the page shows no button. The request is the same file ``mindwatch stop`` writes
(:mod:`mindwatch.store.requests`); who asked is the dashboard's user@host and the browser's address.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from mindwatch.serve.api import run_param
from mindwatch.serve.views import BadRequest, Catalog
from mindwatch.store.notes import write_notes
from mindwatch.store.requests import RequestError, file_request, read_answer, requester

#: The requests the dashboard's buttons make (``set`` stays in the CLI): action -> its button (``factor``: a factor
#: field; ``size``: a batch size field; ``steps``: a field of steps to profile, empty for the run's ``profile.steps``).
BUTTONS: dict[str, dict[str, Any]] = {
    "stop": {"label": "Stop"},
    "checkpoint": {"label": "Checkpoint"},
    "lr": {"label": "LR ×", "factor": 0.5, "confirm": "multiply the learning rate by"},
    "rewind": {"label": "Rewind"},
    "batch": {"label": "Batch size", "size": True, "confirm": "set the batch size to"},
    "profile": {"label": "Profile", "steps": True, "confirm": "profile the next steps:"},
}


class ControlApi:
    def __init__(self, catalog: Catalog, *, allowed: bool) -> None:
        self.catalog = catalog
        self.allowed = allowed

    def control(self, req: Request) -> JSONResponse:
        buttons = [{"action": a, **b} for a, b in BUTTONS.items()] if self.allowed else []
        return JSONResponse({"allowed": self.allowed, "actions": buttons})

    async def _json_body(self, req: Request) -> dict[str, Any]:
        if req.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            raise BadRequest("send the request as application/json")
        try:
            body: Any = json.loads((await req.body())[:8192] or b"{}")
        except ValueError:
            raise BadRequest("the request body is not JSON") from None
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        return body

    def _refused(self) -> JSONResponse:
        return JSONResponse(
            {"error": "this dashboard takes no requests: start it with mindwatch serve --allow-control"}, status_code=403
        )

    async def notes(self, req: Request) -> JSONResponse:
        """``POST /api/notes?run=ID {"name"?, "note"?}``: rename the run or note on it (``""`` removes one)."""
        if not self.allowed:
            return self._refused()
        body = await self._json_body(req)
        texts = {k: body[k] for k in ("name", "note") if k in body}
        if not texts or not all(isinstance(v, str) for v in texts.values()):
            raise BadRequest('send {"name": "..."} and/or {"note": "..."} (strings; "" removes one)')
        view = run_param(req, self.catalog)
        client = req.client.host if req.client else "?"
        try:
            notes = write_notes(view.path, **texts, by=f"{requester()} (dashboard, from {client})")
        except ValueError as e:
            raise BadRequest(str(e)) from None
        return JSONResponse(notes)

    async def request(self, req: Request) -> JSONResponse:
        if req.method == "GET":
            view = run_param(req, self.catalog)
            rid = req.query_params.get("id") or ""
            if not rid.replace("_", "").isalnum():
                raise BadRequest("id is required: the id POST /api/request answered")
            return JSONResponse({"answer": read_answer(view.path, rid)})
        if not self.allowed:
            return self._refused()
        body = await self._json_body(req)
        if body.get("action") not in BUTTONS:
            raise BadRequest(f"action must be one of {', '.join(BUTTONS)}")
        view = run_param(req, self.catalog)
        factor = body.get("factor")
        reason = body.get("reason")
        client = req.client.host if req.client else "?"
        try:
            filed = file_request(
                view.path,
                body["action"],
                reason=str(reason)[:500] if reason else None,
                factor=float(factor) if isinstance(factor, (int, float, str)) and str(factor).strip() else None,
                size=body.get("size"),
                steps=_steps(body.get("steps")) if body["action"] == "profile" else None,
                requested_by=f"{requester()} (dashboard, from {client})",
            )
        except ValueError as e:  # RequestError, or a factor or steps that are no number
            status = 409 if isinstance(e, RequestError) and "not running" in str(e) else 400
            return JSONResponse({"error": str(e)}, status_code=status)
        return JSONResponse(filed)


def _steps(raw: Any) -> int | None:
    """A profile's steps from the request body (a number or its text; absent: the run's ``profile.steps``)."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    text = str(raw).strip()
    if isinstance(raw, bool) or not text.isdigit():
        raise BadRequest(f"steps takes a whole number of steps to profile, 1 to 1000, not {text[:40]!r}")
    return int(text)
