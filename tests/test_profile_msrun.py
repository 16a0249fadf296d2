"""Under msrun with 2 workers, a threshold alert on rank 1 alone with ``actions: [profile]``: both ranks profile the same
steps, from the same first step, each into ``profiles/step_<S>/rank<R>/`` of the one run directory."""

from __future__ import annotations

import json

import pytest
from test_distributed import only_run_dir

import mindwatch


@pytest.mark.slow  # one msrun launch (~25 s)
def test_an_alert_on_rank_1_profiles_both_ranks_from_one_step(tmp_path) -> None:
    from test_distributed import msrun_to_the_end

    out = tmp_path / "out"
    config = {
        "callback": {"params": {"warn_on_value": {"loss": 1e4}}},
        "alerts": {"thresholds": {"actions": ["profile"]}},
        "profile": {"steps": 3},
    }
    args = [
        "--save-dir",
        str(out),
        "--steps",
        "40",
        "--pace-secs",
        "0.05",
        "--max-grad-norm",
        "0.1",
        "--config",
        json.dumps(config),
    ]
    msrun_to_the_end(tmp_path / "logs", *args, "--scale-rank", "1", "--scale-at", "15", "--scale-by", "1000")
    run = mindwatch.open_run(only_run_dir(out / "dist"))
    thresholds = [a for a in run.alerts if a["rule"] == "threshold"]
    assert {a["rank"] for a in thresholds} == {1} and thresholds[0]["step"] == 15, thresholds
    (profile,) = run.profiles
    assert sorted(profile.ranks) == [0, 1]
    assert profile.first_step > 15 and profile.steps == 3
    for rank in (0, 1):
        p = profile.ranks[rank]
        assert (p.note.first_step, p.note.state, p.note.rule) == (profile.first_step, "done", "threshold")
        assert p.trace is not None and p.top_ops, rank
    done = [a for a in run.alerts if a["rule"] == "intervention"]
    assert sorted(a["rank"] for a in done) == [0, 1]
    assert {a["first_step"] for a in done} == {profile.first_step}
