"""``kill -9`` mid-run: the run directory still reads back and holds every step older than flush_secs."""

from __future__ import annotations

import sys
from pathlib import Path

from conftest import assert_same_columns, kill_after_steps, parsed_copy, start_printing_steps

import mindwatch
from mindwatch.store.columns import RankColumns

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
