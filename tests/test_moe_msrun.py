"""Under msrun with 2 workers, each rank routing its own batches: the recorded loads are the sum of both ranks' counts,
summed in the step's own collective, on every rank; with our train cell (``Model.train``) and with a loop's
``DistributedGradReducer``."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_distributed import REPO, only_run_dir

import mindwatch

EVERY, STEPS, EXPERTS = 5, 20, 4


@pytest.mark.slow  # one msrun launch, two trainings a rank (~30 s)
def test_the_loads_are_both_ranks_counts_summed_on_every_rank(tmp_path) -> None:
    from test_distributed import msrun_to_the_end

    out = tmp_path / "out"
    script = REPO / "tests" / "dist_scripts" / "train_moe.py"
    msrun_to_the_end(tmp_path / "logs", "--save-dir", str(out), "--steps", str(STEPS), script=script)
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
