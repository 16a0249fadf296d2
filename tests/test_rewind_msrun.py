"""A rewind in data parallel (real msrun, 2 workers): one bad stretch on rank 1, one rewind on both ranks at one step.

Rank 1's inputs are x 30 for steps 85-89: its loss spikes first, and the damaged shared weights then spike rank 0's
a step later. Both ranks ask for ``rewind``; one rewind covers both. One launch (~30 s here).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_distributed import Webhooks, msrun_to_the_end, only_run_dir, raw_records

import mindwatch

pytestmark = pytest.mark.slow

STEPS, EVERY, SKIP = 140, 20, 10


def test_a_bad_stretch_on_rank_1_is_one_rewind_at_one_step_on_both_ranks(tmp_path: Path) -> None:
    hooks = Webhooks()
    config = {
        "alerts": {"spike": {"metrics": ["loss"], "count": 1, "actions": ["rewind"]}, "stall_timeout": 8.0},
        "rewind": {"every": EVERY, "skip": SKIP},
        "notify": [{"type": "webhook", "url": hooks.url}],
    }
    try:
        msrun_to_the_end(
            tmp_path / "logs",
            *("--save-dir", str(tmp_path / "out"), "--steps", str(STEPS), "--pace-secs", "0.02"),
            *("--scale-rank", "1", "--scale-at", "85", "--scale-for", "5", "--scale-by", "30"),
            *("--save-params", str(tmp_path / "params"), "--config", json.dumps(config)),
        )
    finally:
        hooks.close()
    run_dir = only_run_dir(tmp_path / "out" / "dist")
    alerts = raw_records(run_dir / "alerts.jsonl")
    spikes = [a for a in alerts if a["rule"] == "spike"]
    assert min(a["step"] for a in spikes if a["rank"] == 1) == 85, spikes
    rewinds = [a for a in alerts if a["rule"] == "intervention" and a["actions"] == ["rewind"]]
    assert sorted(a["rank"] for a in rewinds) == [0, 1], f"one rewind per rank: {rewinds}"
    at, to = {a["step"] for a in rewinds}, {a["to_step"] for a in rewinds}
    assert len(at) == 1 and to == {80}, rewinds
    assert all(a["skipped_batches"] == SKIP for a in rewinds)
    weights = [np.load(tmp_path / f"params.rank{r}.npz") for r in (0, 1)]
    for name in weights[0].files:
        assert np.array_equal(weights[0][name], weights[1][name]), name
    trained = STEPS - (at.pop() - 80) - SKIP
    for r in (0, 1):
        status = json.loads((run_dir / f"status.rank{r}.json").read_text())
        assert status["state"] == "finished" and status["last_step"] == trained, status
    assert mindwatch.open_run(run_dir).state == "finished"
    # one message tells the person: rank 0's end-of-run message, with the rewind and its batches named
    told = [json.dumps(body) for _, body in hooks.posts if "rewound from step" in json.dumps(body)]
    assert len(told) == 1 and "to step 80" in told[0] and f"passed over {SKIP} batches (epoch 1, batches" in told[0], told
    rank0 = json.loads((run_dir / "status.rank0.json").read_text())["pid"]
    assert {pid for pid, _ in hooks.posts} <= {rank0, None}, "rank 0 alone sends"
