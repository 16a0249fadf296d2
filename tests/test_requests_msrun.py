"""A person stops a live 2-rank msrun job from a shell: ``mindwatch stop RUN`` ends both ranks at one step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import wait_for
from test_distributed import Launch, msrun, raw_records

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def status(run_dir: Path, rank: int) -> dict:
    try:
        return json.loads((run_dir / f"status.rank{rank}.json").read_text())
    except (OSError, ValueError):
        return {}


def test_a_stop_from_the_shell_ends_both_ranks_at_one_step(tmp_path: Path) -> None:
    job = Launch()
    try:
        msrun(job, tmp_path / "logs", "--save-dir", str(tmp_path / "out"), "--steps", "2000", "--pace-secs", "0.02")
        project = tmp_path / "out" / "dist"
        wait_for(lambda: project.is_dir() and any(p.is_dir() and not p.name.startswith(".") for p in project.iterdir()), 120)
        run_dir = next(p for p in project.iterdir() if p.is_dir() and not p.name.startswith("."))
        wait_for(lambda: all((status(run_dir, r).get("last_step") or 0) >= 20 for r in (0, 1)), 120)
        env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        asked = time.time()
        out = subprocess.run(
            [sys.executable, "-m", "mindwatch.cli", "stop", str(run_dir), "--reason", "from the shell", "--wait", "30"],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        assert "taken at step" in out.stdout, out.stdout
        assert job.wait(120) == [0], (tmp_path / "logs" / "msrun.out").read_text()[-3000:]
        ended = time.time()
    finally:
        job.kill()
    last = {r: raw_records(run_dir / f"metrics.rank{r}.jsonl")[-1]["step"] for r in (0, 1)}
    assert last[0] == last[1] < 2000, "both ranks stopped at one step, long before the data ran out"
    for r in (0, 1):
        st = status(run_dir, r)
        assert st["state"] == "stopped" and st["last_step"] == last[r]
    assert "from the shell" in status(run_dir, 0)["reason"]
    assert ended - asked < 30
