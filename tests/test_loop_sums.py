"""A loop's own collective calls (``start_run`` without ``grad_reducer``) follow what every rank shares: the calls
of ``run.step`` in this attempt, never the step numbers a resume, a skip, a rewind or ``step=`` may set apart.

Two ranks are played in one process (``discover`` says rank 0 or 1 of 2; the sum is recorded, not sent): rank 0
resumes a run at step 37, numbers its steps itself and rewinds; rank 1 starts in a folder of its own, skips
steps and counts from 1. Both make the sum at the same calls.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mindwatch.mindspore import loop
from mindwatch.mindspore.ranks import RankInfo


def sums_at(monkeypatch: pytest.MonkeyPatch, rank: int, save_dir: Path, steps: list[dict], run_name: str = "r") -> list[int]:
    """The ``run.step`` calls (0: at start) at which this rank made the loop's sum, for ``steps`` (each a
    ``run.step`` keyword set)."""
    made: list[int] = []
    calls = [0]

    def recorded_sum(vector):
        made.append(calls[0])
        return vector.asnumpy()

    monkeypatch.setattr(loop, "discover", lambda: RankInfo(rank, 2))
    monkeypatch.setattr(loop, "sum_over_ranks", recorded_sum)
    config = {"save_dir": str(save_dir), "run_name": run_name, "distributed": {"coordination": {"loop_every": 10}}}
    with loop.start_run(config) as run:
        for kw in steps:
            calls[0] += 1
            run.step(loss=1.0, **kw)
    return made


def test_no_schedule_of_resumes_skips_or_rewinds_puts_the_ranks_sums_out_of_step(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    node0, node1 = tmp_path / "node0", tmp_path / "node1"
    first = sums_at(monkeypatch, 0, node0, [{} for _ in range(37)])  # attempt 1 on rank 0's node ends at step 37
    assert first == [0, 10, 20, 30]
    rng = np.random.default_rng(0)
    numbered = [{"step": s} for s in [*range(38, 60), *range(50, 70)]]  # rank 0 numbers its steps, and rewinds to 50
    skipping = [{"skipped": float(rng.random() < 0.3)} for _ in range(len(numbered))]  # rank 1 skips some steps
    rank0 = sums_at(monkeypatch, 0, node0, numbered)
    rank1 = sums_at(monkeypatch, 1, node1, skipping)
    assert rank0 == rank1 == [0, 10, 20, 30, 40], (rank0, rank1)
