"""The dashboard files a person's request only with --allow-control and the token; the request is the CLI's file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from starlette.testclient import TestClient
from test_server import make_run

from mindwatch.serve.app import create_app
from mindwatch.store.requests import pending_requests, write_answer

TOKEN = "s3cret-token-1234"


@pytest.fixture
def live_run(tmp_path: Path) -> Path:
    return make_run(tmp_path / "logs", "proj", "run_live", state="running")


def test_without_allow_control_the_dashboard_refuses_and_shows_no_button(live_run: Path) -> None:
    c = TestClient(create_app(live_run.parents[1], token=TOKEN), headers={"Authorization": f"Bearer {TOKEN}"})
    assert c.get("/api/control").json() == {"allowed": False, "actions": []}
    r = c.post("/api/request?run=proj/run_live", json={"action": "stop", "reason": "x"})
    assert r.status_code == 403 and "--allow-control" in r.json()["error"]
    assert pending_requests(live_run) == []


def test_with_allow_control_a_request_needs_the_token_even_on_loopback(live_run: Path) -> None:
    with pytest.raises(ValueError, match="needs a token"):
        create_app(live_run.parents[1], allow_control=True)
    app = create_app(live_run.parents[1], token=TOKEN, allow_control=True)
    r = TestClient(app).post("/api/request?run=proj/run_live", json={"action": "stop"})
    assert r.status_code == 401
    assert pending_requests(live_run) == []

    c = TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"})
    actions = ["stop", "checkpoint", "lr", "rewind", "batch", "profile"]
    assert [b["action"] for b in c.get("/api/control").json()["actions"]] == actions
    r = c.post("/api/request?run=proj/run_live", json={"action": "lr", "factor": 0.5, "reason": "too fast"})
    assert r.status_code == 200, r.text
    (req,) = pending_requests(live_run)
    assert (req["action"], req["factor"], req["reason"]) == ("lr", 0.5, "too fast")
    assert "(dashboard, from " in req["requested_by"]
    assert c.get(f"/api/request?run=proj/run_live&id={req['id']}").json() == {"answer": None}
    write_answer(live_run, req["id"], state="taken", step=7)
    assert c.get(f"/api/request?run=proj/run_live&id={req['id']}").json()["answer"]["step"] == 7
    assert c.post("/api/request?run=proj/run_live", json={"action": "set"}).status_code == 400


def test_the_batch_button_files_a_size_within_the_runs_dynamic_batch(live_run: Path) -> None:
    c = TestClient(create_app(live_run.parents[1], token=TOKEN, allow_control=True), headers={"Authorization": f"Bearer {TOKEN}"})
    r = c.post("/api/request?run=proj/run_live", json={"action": "batch", "size": "64"})
    assert r.status_code == 400 and "no batch size that can change" in r.json()["error"]
    meta = json.loads((live_run / "meta.json").read_text())
    (live_run / "meta.json").write_text(json.dumps({**meta, "dynamic_batch": {"initial": 32, "min": 8, "max": 64}}))
    r = c.post("/api/request?run=proj/run_live", json={"action": "batch", "size": "128"})
    assert r.status_code == 400 and "its DynamicBatch takes 8 to 64" in r.json()["error"]
    assert c.post("/api/request?run=proj/run_live", json={"action": "batch", "size": "64"}).status_code == 200
    (req,) = pending_requests(live_run)
    assert (req["action"], req["size"]) == ("batch", 64)


def test_a_finished_run_takes_no_request(tmp_path: Path) -> None:
    make_run(tmp_path / "logs", "proj", "done")
    c = TestClient(create_app(tmp_path / "logs", token=TOKEN, allow_control=True), headers={"Authorization": f"Bearer {TOKEN}"})
    r = c.post("/api/request?run=proj/done", json={"action": "stop"})
    assert r.status_code == 409 and "not running" in r.json()["error"]


def test_the_printed_link_signs_the_browser_in(live_run: Path) -> None:
    app = create_app(live_run.parents[1], token=TOKEN, allow_control=True)
    r = TestClient(app, follow_redirects=False).get(f"/?token={TOKEN}")
    assert r.status_code == 303 and "mindwatch_token=" in r.headers["set-cookie"]
    assert TestClient(app, follow_redirects=False).get("/?token=wrong-token-000").headers["location"] == "/login"
