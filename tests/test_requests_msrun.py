"""A person stops a live 2-rank msrun job from a shell: ``mindwatch stop RUN`` ends both ranks at one step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import wait_for
from test_distributed import Launch, msrun, raw_records
from test_requests import taken_at

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def status(run_dir: Path, rank: int) -> dict:
    try:
        return json.loads((run_dir / f"status.rank{rank}.json").read_text())
    except (OSError, ValueError):
        return {}


@pytest.mark.parametrize("folders", ["shared", "one per node"])
def test_a_stop_from_the_shell_ends_both_ranks_at_one_step(tmp_path: Path, folders: str) -> None:
    """With a shared folder (Model.train), and with a folder per node (a loop whose signal rides on its gradient
    reduction): the person's stop reaches rank 1 by the step's collective, its reason by the lifeline."""
    job = Launch()
    per_node = ("--save-dir-per-rank", "--loop", "--signal-in-reducer") if folders == "one per node" else ()
    try:
        msrun(job, tmp_path / "logs", "--save-dir", str(tmp_path / "out"), "--steps", "2000", "--pace-secs", "0.02", *per_node)
        projects = [tmp_path / "out" / f"rank{r}" / "dist" for r in (0, 1)] if per_node else [tmp_path / "out" / "dist"] * 2
        runs = lambda: [next((p for p in d.iterdir() if p.is_dir() and not p.name.startswith(".")), None) for d in projects]  # noqa: E731
        wait_for(lambda: all(d.is_dir() for d in projects) and all(runs()), 120)
        dirs = runs()
        run_dir = dirs[0]
        wait_for(lambda: all((status(dirs[r], r).get("last_step") or 0) >= 20 for r in (0, 1)), 120)
        env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        out = subprocess.run(
            [sys.executable, "-m", "mindwatch.cli", "stop", str(run_dir), "--reason", "from the shell", "--wait", "30"],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        assert "taken at step" in out.stdout, out.stdout
        stop_at = taken_at(out.stdout)
        assert job.wait(120) == [0], (tmp_path / "logs" / "msrun.out").read_text()[-3000:]
    finally:
        job.kill()
    last = {r: raw_records(dirs[r] / f"metrics.rank{r}.jsonl")[-1]["step"] for r in (0, 1)}
    assert last[0] == last[1] == stop_at < 2000, "both ranks stopped at the step the answer named, long before the data ran out"
    reasons = []
    for r in (0, 1):
        st = status(dirs[r], r)
        assert st["state"] == "stopped" and st["last_step"] == last[r]
        reasons.append(st["reason"])
    assert reasons[0] == reasons[1] and reasons[0].startswith("stopped by ") and "from the shell" in reasons[0], reasons
