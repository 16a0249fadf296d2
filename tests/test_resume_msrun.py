"""A restarted data-parallel job under real ``msrun`` (2 workers): both attempts, on both ranks, are one run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_distributed import msrun_to_the_end, only_run_dir, raw_records

import mindwatch

pytestmark = pytest.mark.slow


def test_every_rank_of_a_restarted_job_joins_the_same_run(tmp_path: Path) -> None:
    config = json.dumps({"run_name": "llm", "resume": "allow"})
    for attempt in (1, 2):
        msrun_to_the_end(tmp_path / f"logs{attempt}", "--save-dir", str(tmp_path / "out"), "--steps", "12", "--config", config)
    run_dir = only_run_dir(tmp_path / "out" / "dist")
    assert run_dir.name == "llm"
    meta = json.loads((run_dir / "meta.json").read_text())
    assert [a["end"] for a in meta["attempts"]] == ["finished", "finished"]
    run = mindwatch.open_run(run_dir)
    assert run.ranks == [0, 1] and run.state == "finished"
    for rank in (0, 1):
        lines = raw_records(run_dir / f"metrics.rank{rank}.jsonl")
        assert [r["step"] for r in lines] == list(range(1, 13)) * 2  # both attempts' lines stay in the file
        assert run.series("loss", rank=rank).step.tolist() == list(range(1, 13))  # the rewound steps, once each
