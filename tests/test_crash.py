"""``kill -9`` mid-run: the run directory still reads back, holds every step older than flush_secs, and no reader
shows an empty stack dump."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import assert_same_columns, kill_after_steps, parsed_copy, start_printing_steps

import mindwatch
from mindwatch.alerts.hang import newest_dumps
from mindwatch.cli import main
from mindwatch.store.columns import RankColumns
from mindwatch.store.layout import RunLayout

SCRIPT = Path(__file__).parent / "scripts" / "train_until_killed.py"
FLUSH_SECS = 0.5


def test_kill_9_loses_at_most_flush_secs(tmp_path: Path) -> None:
    seen: dict[int, float] = {}
    proc, reader = start_printing_steps([sys.executable, str(SCRIPT), str(tmp_path), str(FLUSH_SECS)], seen)
    killed_at = kill_after_steps(proc, reader, seen, 60, then=4 * FLUSH_SECS)  # the kill lands mid-run

    run = mindwatch.open_run(tmp_path / "crash" / "killed")
    recorded = set(run.series("loss").step.tolist())
    old_enough = {s for s, t in seen.items() if t <= killed_at - 2 * FLUSH_SECS}  # x 2: a loaded machine flushes late
    assert old_enough, "no step was older than flush_secs at the kill"
    assert old_enough <= recorded, f"lost steps: {sorted(old_enough - recorded)[:10]}"
    assert recorded <= set(range(1, max(seen) + 2))  # nothing invented
    assert run.state in ("running", "stale") and not run.finished and not run.ended
    assert run.statuses[0]["state"] == "running"
    fast = RankColumns(tmp_path / "crash" / "killed" / "metrics.rank0.jsonl")
    assert fast.from_files, "the column files of the last heartbeat still match the JSONL"
    fast.refresh()
    assert_same_columns(fast, parsed_copy(fast.path, tmp_path))  # and with the JSONL tail, say what parsing says


def test_kill_9_leaves_no_empty_stack_dump_that_a_reader_shows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    seen: dict[int, float] = {}
    proc, reader = start_printing_steps([sys.executable, str(SCRIPT), str(tmp_path), str(FLUSH_SECS)], seen)
    kill_after_steps(proc, reader, seen, 30, then=1.5)  # the GIL guard is armed from the first steps on

    run_dir = tmp_path / "crash" / "killed"
    stacks = run_dir / "stacks"
    # faulthandler needs its file open before a GIL hang; a kill gives no chance to remove it: the one empty file
    assert {p.name: p.stat().st_size for p in stacks.iterdir()} == {"gil_hang_rank0.txt": 0}
    (stacks / "stall_rank0_20261206_080102.txt").touch()  # a dump a full disk cut short (written whole now)

    assert newest_dumps(RunLayout(run_dir)) == {}
    assert main(["hang", str(run_dir)]) == 2
    assert "no stall stack dumps" in capsys.readouterr().err
    out = tmp_path / "killed.html"
    assert main(["report", str(run_dir), "-o", str(out)]) == 0
    assert "Stack dumps" not in out.read_text()
