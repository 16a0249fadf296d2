"""The best loss, one definition: the writer's running value and the summary's, on lines with rewinds and relaunches,
against the line a training keeps worked out step by step."""

from __future__ import annotations

import math

import numpy as np

from mindwatch.store.best_loss import BestLoss, kept_best
from mindwatch.store.writer import RunWriter


def kept_line(written: list[tuple[int, float]]) -> dict[int, float]:
    """What a training ends with: a step going back drops every step from it on."""
    line: dict[int, float] = {}
    for step, loss in written:
        line = {s: v for s, v in line.items() if s < step}
        line[step] = loss
    return line


def reference(written: list[tuple[int, float]]) -> tuple[float, int] | None:
    finite = {s: v for s, v in kept_line(written).items() if math.isfinite(v)}
    if not finite:
        return None
    step = min(finite, key=lambda s: (finite[s], s))
    return finite[step], step


def lines_with_rewinds(rng: np.random.Generator) -> list[tuple[int, float]]:
    written, step = [], 0
    for _ in range(int(rng.integers(1, 60))):
        step = int(rng.integers(1, step + 1)) if step and rng.random() < 0.1 else step + int(rng.integers(1, 3))
        loss = float(rng.choice([math.nan, math.inf, rng.normal()])) if rng.random() < 0.1 else float(rng.normal())
        written.append((step, loss))
    return written


def test_the_running_and_the_whole_series_best_agree_with_the_kept_line() -> None:
    rng = np.random.default_rng(0)
    went_back = 0
    for _ in range(2000):
        written = lines_with_rewinds(rng)
        steps, losses = np.array([s for s, _ in written]), np.array([v for _, v in written])
        best = BestLoss(written)
        expected = reference(written)
        assert (best.value, best.step) == (expected if expected else (None, None)), written
        assert kept_best(steps, losses) == expected, written
        went_back += expected is not None and min(losses[np.isfinite(losses)], default=math.inf) < expected[0]
    assert went_back > 50, "many lines had their lowest loss on an abandoned branch"


def test_a_relaunch_from_an_earlier_checkpoint_drops_the_lows_it_goes_back_over(tmp_path) -> None:
    """The first attempt reached step 6 (its best, 0.5, at step 5); the relaunch resumes from step 3's checkpoint."""
    first = RunWriter(tmp_path, rank=0, attempt=1)
    first.write([{"step": s, "loss": v} for s, v in [(1, 3.0), (2, 2.0), (3, 1.5), (4, 1.0), (5, 0.5), (6, 0.7)]])
    first.close("failed")
    assert first.status()["best_loss"] == 0.5
    again = RunWriter(tmp_path, rank=0, attempt=2)
    assert again.status()["best_loss"] == 0.5, "until it goes back, the earlier attempt's best stands"
    again.write([{"step": 4, "loss": 1.2}, {"step": 5, "loss": 1.1}])
    assert again.status()["best_loss"] == 1.1
    again.write([{"step": 6, "eval_loss": 9.0}])  # a record without a loss goes back on nothing
    assert again.status()["best_loss"] == 1.1
