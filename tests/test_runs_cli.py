"""``mindwatch runs LOGDIR``: every real run listed with its state, steps, duration and tags."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys


def runs_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "220"}
    return subprocess.run(
        [sys.executable, "-m", "mindwatch.cli", "runs", *args], capture_output=True, text=True, timeout=60, env=env
    )


def test_runs_lists_the_real_runs(report_runs) -> None:
    logdir = report_runs["finished"].parent.parent  # <save_dir>: holds the project folder
    proc = runs_cli(str(logdir), "--json")
    assert proc.returncode == 0, proc.stderr
    listed = {r["run_id"]: r for r in json.loads(proc.stdout)}
    assert set(listed) == {"finished", "failed", "killed"}
    for kind, run_dir in report_runs.items():
        lines = (run_dir / "metrics.rank0.jsonl").read_text().splitlines()
        meta = json.loads((run_dir / "meta.json").read_text())
        row = listed[kind]
        # the newest step on disk, even where the heartbeat lags it (a kill -9 leaves the status behind)
        assert row["last_step"] == json.loads(lines[-1])["step"]
        assert row["tags"] == meta["tags"] == {"kind": kind, "model": "tiny-gpt"}
        assert row["duration"] > 0
        assert row["project"] == "report-tests"
    assert listed["finished"]["state"] == "finished"
    assert listed["failed"]["state"] == "failed" and "corrupt shard" in listed["failed"]["error"]
    assert listed["killed"]["state"] in ("running", "stale")

    table = runs_cli(str(logdir))
    assert table.returncode == 0
    for kind in ("finished", "failed", "killed"):
        line = next(x for x in table.stdout.splitlines() if f" {kind} " in x and "report-tests" in x)
        assert "kind=" + kind in line and str(listed[kind]["last_step"]) in line


def test_runs_of_a_missing_or_empty_dir(tmp_path) -> None:
    assert runs_cli(str(tmp_path / "nope")).returncode == 2
    proc = runs_cli(str(tmp_path))
    assert proc.returncode == 0 and "no runs" in proc.stdout


def test_runs_lists_newest_first_and_never_breaks_a_cell_at_80_columns(tmp_path: pathlib.Path) -> None:
    import time

    from mindwatch.store.writer import RunWriter

    names = [f"run_2026010{i}_000000_with_a_name_longer_than_the_column" for i in range(2)]
    for name in names:
        w = RunWriter(tmp_path / "proj" / name, 0)
        w.write([{"step": 1, "t": time.time(), "loss": 1.0}])
        w.close("finished")
        time.sleep(0.05)
    env = {**os.environ, "COLUMNS": "80"}
    cmd = [sys.executable, "-m", "mindwatch.cli", "runs", str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60).stdout
    assert names[1] in out and names[0] in out and "finished" in out  # whole cells
    assert out.index(names[1]) < out.index(names[0])  # newest first
