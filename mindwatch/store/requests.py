"""A person's requests to a live run and the training's answers: small JSON files under ``control/``.

Example::

    from mindwatch.store.requests import file_request, wait_answer
    req = file_request(run_dir, "lr", factor=0.5, reason="loss climbs")   # the CLI or the dashboard
    wait_answer(run_dir, req["id"], timeout=30)    # {"state": "taken", "step": 812, ...} (None: no answer yet)

A request is ``control/requests/<id>.json`` (temp + rename): ``id``, ``action`` (one of :data:`REQUESTS`),
``reason``, ``requested_by`` (user@host), ``t``, and ``factor`` (``lr``), ``key``/``value`` (``set``), ``to_step``
(``rewind``, optional: the snapshot at or before it; without it, the newest before the step the training is at) or
``size`` (``batch``: a DynamicBatch's new size, within the bounds its run's meta.json says). The
training's worker answers in ``control/answers/<id>.json``: ``state`` ``filed`` (it saw the request and filed
the action), then ``taken`` (with the ``step`` it was carried out after) or ``failed`` (with the ``error``).
Any process that can write the run directory may file one; nothing here imports the training side.
"""

from __future__ import annotations

import getpass
import math
import os
import re
import socket
import time
import uuid
from pathlib import Path
from typing import Any

from mindwatch.store.layout import read_json, write_json_atomic
from mindwatch.store.states import rank_states, run_state

#: What a person may ask a live run for.
REQUESTS = ("stop", "checkpoint", "lr", "set", "rewind", "batch", "profile")

#: The settings ``set`` may change while training (``alerts.<rule>.enabled``: a rule that runs, on or off).
LIVE_SETTINGS = ("layers.every", "layers.histogram_every", "alerts.<rule>.enabled")

#: The states in which a run takes requests.
LIVE_STATES = ("running", "stalled")

#: Answers that end a request.
FINAL_ANSWERS = ("taken", "failed")

_RULE_ENABLED = re.compile(r"^alerts\.([a-z_][a-z0-9_]*)\.enabled$")


class RequestError(ValueError):
    """A request that cannot be filed: a run that is not running, an unknown action or setting."""


def requests_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "control" / "requests"


def answers_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "control" / "answers"


def requester() -> str:
    """Who asks, as user@host."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


def live_state(run_dir: Path) -> str:
    """The run's state from its status files (``unknown`` with none): a request needs ``running`` or ``stalled``."""
    statuses: dict[int, dict[str, Any]] = {}
    for path in Path(run_dir).glob("status.rank*.json"):
        rank = path.name[len("status.rank") : -len(".json")]
        status = read_json(path)
        if rank.isdigit() and status is not None:
            statuses[int(rank)] = status
    return run_state(rank_states(statuses).values())


def setting_value(key: str, value: str) -> int | bool:
    """The value of a live setting from its text; raises :class:`RequestError` for a setting that cannot change live."""
    if key in ("layers.every", "layers.histogram_every"):
        try:
            n = int(value)
        except ValueError:
            n = 0
        if n < 1:
            raise RequestError(f"{key} takes a whole number of steps >= 1, not {value!r}")
        return n
    if _RULE_ENABLED.match(key):
        text = value.strip().lower()
        if text not in ("true", "false", "1", "0", "on", "off", "yes", "no"):
            raise RequestError(f"{key} takes true or false, not {value!r}")
        return text in ("true", "1", "on", "yes")
    raise RequestError(f"{key} cannot change while training; these can: {', '.join(LIVE_SETTINGS)}")


def batch_size_value(run_dir: Path, size: Any) -> int:
    """A new batch size for the run's DynamicBatch, checked against its bounds (meta.json's ``dynamic_batch``); raises
    :class:`RequestError` for a size that is no whole number, out of bounds, or a run without a DynamicBatch."""
    text = str(size).strip() if size is not None else ""
    if not text.isdigit() or int(text) < 1:
        raise RequestError(f"batch takes a size, a whole number >= 1, not {size!r}")
    n = int(text)
    bounds = (read_json(Path(run_dir) / "meta.json") or {}).get("dynamic_batch")
    if not isinstance(bounds, dict):
        raise RequestError(
            f"run {run_dir} has no batch size that can change: train it with a DynamicBatch "
            "(mw.DynamicBatch(32, min=8, max=128) passed to dataset.batch and to the callback's batch=)"
        )
    low, high = bounds.get("min"), bounds.get("max")
    if not (isinstance(low, int) and isinstance(high, int) and low <= n <= high):
        raise RequestError(f"batch size {n} is out of this run's bounds: its DynamicBatch takes {low} to {high}")
    return n


def file_request(
    run_dir: Path,
    action: str,
    *,
    reason: str | None = None,
    factor: float | None = None,
    key: str | None = None,
    value: str | None = None,
    size: Any = None,
    requested_by: str | None = None,
    to_step: int | None = None,
    steps: int | None = None,
) -> dict[str, Any]:
    """File a request for a live run and return it; raises :class:`RequestError` when the run does not run."""
    run_dir = Path(run_dir)
    if action not in REQUESTS:
        raise RequestError(f"unknown request {action!r}; one of {', '.join(REQUESTS)}")
    if not (run_dir / "meta.json").is_file() and not any(run_dir.glob("status.rank*.json")):
        raise RequestError(f"{run_dir} is not a run directory (no meta.json, no status files)")
    state = live_state(run_dir)
    if state not in LIVE_STATES:
        raise RequestError(f"run {run_dir} is not running (its state is {state}): there is no training to take the request")
    req: dict[str, Any] = {
        "id": f"{time.strftime('%Y%m%d%H%M%S')}_{uuid.uuid4().hex[:8]}",
        "action": action,
        "reason": reason or None,
        "requested_by": requested_by or requester(),
        "t": time.time(),
    }
    if action == "lr":
        if factor is None or not math.isfinite(factor) or factor <= 0:
            raise RequestError(f"lr needs --factor, a number > 0 (not {factor!r})")
        req["factor"] = float(factor)
    if action == "rewind" and to_step is not None:
        if to_step < 0:
            raise RequestError(f"rewind --to takes a step >= 0, not {to_step}")
        req["to_step"] = int(to_step)
    if action == "profile" and steps is not None:
        if not 1 <= steps <= 1000:
            raise RequestError(f"profile --steps takes 1 to 1000 steps, not {steps}")
        req["steps"] = int(steps)
    if action == "set":
        if not key or value is None:
            raise RequestError("set needs KEY=VALUE")
        req["key"], req["value"] = key, setting_value(key, value)
    if action == "batch":
        req["size"] = batch_size_value(run_dir, size)
    folder = requests_dir(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    write_json_atomic(folder / f"{req['id']}.json", req)
    return req


def pending_requests(run_dir: Path, since: float = 0.0) -> list[dict[str, Any]]:
    """Requests filed at or after ``since`` with no final answer yet, oldest first (the training's worker reads them)."""
    try:
        names = [e.name for e in os.scandir(requests_dir(run_dir)) if e.name.endswith(".json")]
    except OSError:  # no request ever filed
        return []
    out = []
    for name in names:
        req = read_json(requests_dir(run_dir) / name)
        if req is None or not isinstance(req.get("id"), str) or float(req.get("t") or 0) < since:
            continue
        answer = read_answer(run_dir, req["id"])
        if answer is None or answer.get("state") not in FINAL_ANSWERS:
            out.append(req)
    return sorted(out, key=lambda r: float(r.get("t") or 0))


def write_answer(run_dir: Path, request_id: str, **fields: Any) -> None:
    folder = answers_dir(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    write_json_atomic(folder / f"{request_id}.json", {"id": request_id, "t": time.time(), **fields}, durable=False)


def read_answer(run_dir: Path, request_id: str) -> dict[str, Any] | None:
    return read_json(answers_dir(run_dir) / f"{request_id}.json")


def wait_answer(run_dir: Path, request_id: str, timeout: float, poll: float = 0.1) -> dict[str, Any] | None:
    """The request's answer once final (``taken``/``failed``), waiting up to ``timeout`` s; else the last one seen."""
    deadline = time.monotonic() + timeout
    answer = read_answer(run_dir, request_id)
    while (answer is None or answer.get("state") not in FINAL_ANSWERS) and time.monotonic() < deadline:
        time.sleep(poll)
        answer = read_answer(run_dir, request_id)
    return answer
