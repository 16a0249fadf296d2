"""Under msrun with 2 workers (one launch of tests/dist_scripts/train_moe.py, two trainings a rank):

- each rank routing its own batches, the recorded loads are the sum of both ranks' counts, summed in the step's own
  collective, on every rank; with our train cell (``Model.train``) and with a loop's ``DistributedGradReducer``;
- a threshold alert on rank 1 alone with ``actions: [profile]``: both ranks profile the same steps, from one first step,
  each into ``profiles/step_<S>/rank<R>/`` of the one run directory.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_distributed import REPO, only_run_dir

import mindwatch

EVERY, STEPS, EXPERTS, BAD_AT = 5, 20, 4, 12


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """The launch's output folder (``kept.*.json``, ``train/``, ``loop/``)."""
    from test_distributed import msrun_to_the_end

    tmp = tmp_path_factory.mktemp("moe_msrun")
    out = tmp / "out"
    script = REPO / "tests" / "dist_scripts" / "train_moe.py"
    msrun_to_the_end(tmp / "logs", "--save-dir", str(out), "--steps", str(STEPS), script=script)
    return out


@pytest.mark.slow  # the module's msrun launch (~25 s)
def test_the_loads_are_both_ranks_counts_summed_on_every_rank(launched) -> None:
    out = launched
    for kind in ("train", "loop"):
        kept = [json.loads((out / f"kept.{kind}.rank{r}.json").read_text()) for r in (0, 1)]
        steps = list(range(EVERY, STEPS + 1, EVERY))
        assert sorted(int(s) for s in kept[0]) == steps
        run = mindwatch.open_run(only_run_dir(out / kind))
        assert sorted(run.ranks) == [0, 1]
        for layer in ("moe0", "moe1"):
            summed = {s: np.add(kept[0][str(s)][layer], kept[1][str(s)][layer]) for s in steps}
            own = {s: np.asarray(kept[0][str(s)][layer]) for s in steps}
            assert any((summed[s] / summed[s].sum() != own[s] / own[s].sum()).any() for s in steps), "ranks route alike"
            for rank in (0, 1):
                for e in range(EXPERTS):
                    s = run.series(f"expert_load/{layer}/{e}", rank=rank)
                    assert s.step.tolist() == steps, (kind, layer, rank, e)
                    expected = [summed[t][e] / summed[t].sum() for t in steps]
                    assert s.value.tolist() == pytest.approx(expected, abs=1e-6), (kind, layer, rank, e)
                imbalance = run.series(f"moe_imbalance/{layer}", rank=rank).value.tolist()
                assert imbalance == pytest.approx([summed[t].max() / summed[t].sum() * EXPERTS for t in steps], rel=1e-6)


@pytest.mark.slow  # the module's msrun launch
def test_an_alert_on_rank_1_profiles_both_ranks_from_one_step(launched) -> None:
    run = mindwatch.open_run(only_run_dir(launched / "train"))
    thresholds = [a for a in run.alerts if a["rule"] == "threshold"]
    assert [(a["rank"], a["step"]) for a in thresholds] == [(1, BAD_AT)], thresholds
    (profile,) = run.profiles
    assert sorted(profile.ranks) == [0, 1]
    assert profile.first_step > BAD_AT and profile.steps == 3
    for rank in (0, 1):
        p = profile.ranks[rank]
        assert (p.note.first_step, p.note.state, p.note.rule) == (profile.first_step, "done", "threshold")
        assert p.trace is not None and p.top_ops, rank
    done = [a for a in run.alerts if a["rule"] == "intervention"]
    assert sorted(a["rank"] for a in done) == [0, 1]
    assert {a["first_step"] for a in done} == {profile.first_step}
