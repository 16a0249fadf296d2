"""A run's display name and note (notes.json): ``mindwatch rename`` / ``note``, shown by ``mindwatch runs`` and the
report, written by the dashboard only with --allow-control (the token), and never changing the run id."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from starlette.testclient import TestClient

from mindwatch.serve.app import create_app
from mindwatch.store.layout import write_json_atomic
from mindwatch.store.writer import RunWriter


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "220"}
    return subprocess.run([sys.executable, "-m", "mindwatch.cli", *args], capture_output=True, text=True, timeout=60, env=env)


def make_run(logdir: Path, name: str = "run_1") -> Path:
    run_dir = logdir / "p" / name
    writer = RunWriter(run_dir, 0)
    writer.write([{"step": s, "t": 1e9 + s, "loss": 2.0 - s / 10} for s in range(1, 11)])
    writer.close("finished")
    write_json_atomic(run_dir / "meta.json", {"run_id": name, "project": "p", "started_at": 1e9})
    return run_dir


def test_rename_and_note_from_the_cli_show_in_mindwatch_runs_and_keep_the_id(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    assert cli("rename", str(run_dir), "baseline [lr 3e-4]").returncode == 0
    assert cli("note", str(run_dir), "diverged after the reshuffle").returncode == 0
    listed = json.loads(cli("runs", str(tmp_path), "--json").stdout)
    assert [(r["run_id"], r["name"], r["note"]) for r in listed] == [
        ("run_1", "baseline [lr 3e-4]", "diverged after the reshuffle")
    ]
    table = cli("runs", str(tmp_path)).stdout
    assert "run_1 baseline [lr 3e-4]" in table and "diverged after the reshuffle" in table  # the brackets are text
    assert cli("rename", str(run_dir), "").returncode == 0  # "" removes the name; the note stays
    assert [(r["name"], r["note"]) for r in json.loads(cli("runs", str(tmp_path), "--json").stdout)] == [
        (None, "diverged after the reshuffle")
    ]
    assert json.loads((run_dir / "meta.json").read_text())["run_id"] == "run_1"  # meta.json is the training's


def test_note_on_a_folder_that_is_not_a_run_is_a_usage_error(tmp_path: Path) -> None:
    make_run(tmp_path)
    proc = cli("note", str(tmp_path / "p"), "x")
    assert proc.returncode == 2 and "is not a run directory" in proc.stderr and not (tmp_path / "p" / "notes.json").exists()


def test_the_report_shows_the_name_and_the_note(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    cli("rename", str(run_dir), "baseline")
    cli("note", str(run_dir), "the <b> stays text")
    out = tmp_path / "r.html"
    assert cli("report", str(run_dir), "-o", str(out)).returncode == 0
    html = out.read_text()
    assert "<h1>mindwatch report: baseline (p/run_1)</h1>" in html
    assert "note on run_1: the &lt;b&gt; stays text" in html


def test_the_dashboard_writes_notes_only_with_allow_control(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    with TestClient(create_app(tmp_path)) as c:
        refused = c.post("/api/notes", params={"run": "p/run_1"}, json={"name": "x"})
        assert refused.status_code == 403 and "--allow-control" in refused.json()["error"]
    assert not (run_dir / "notes.json").exists()
    with TestClient(create_app(tmp_path, token="s3cret-token", allow_control=True)) as c:
        assert c.post("/api/notes", params={"run": "p/run_1"}, json={"name": "x"}).status_code == 401  # no token
        auth = {"Authorization": "Bearer s3cret-token"}
        ok = c.post("/api/notes", params={"run": "p/run_1"}, json={"name": "baseline", "note": "n"}, headers=auth)
        assert ok.status_code == 200 and ok.json()["name"] == "baseline"
        bad = c.post("/api/notes", params={"run": "p/run_1"}, json={"name": 3}, headers=auth)
        assert bad.status_code == 400 and "strings" in bad.json()["error"]
        assert c.get("/api/run", params={"run": "p/run_1"}, headers=auth).json()["notes"] == {"name": "baseline", "note": "n"}
        row = c.get("/api/runs", headers=auth).json()["runs"][0]
        assert (row["id"], row["name"], row["note"]) == ("p/run_1", "baseline", "n")
