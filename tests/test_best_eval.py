"""The best evaluation, one definition: the writer's running value (the status file's ``best_eval``, the runs page's
"best eval") and the full summary's, against every evaluation worked out by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from mindwatch.analysis.summary import list_run, summarize_run
from mindwatch.store.best_eval import BestEval, EvalBests
from mindwatch.store.layout import write_json_atomic
from mindwatch.store.reader import open_run
from mindwatch.store.writer import RunWriter

#: Which way is better for the names these tests evaluate, written out here rather than asked of mindwatch.metrics.
BETTER = {"eval/loss": min, "eval/eval_loss": min, "eval/mse": min, "eval/accuracy": max, "eval/f1": max}
NAMES = list(BETTER)


def random_evaluations(rng: np.random.Generator) -> list[dict]:
    """Records as a training writes them: train steps with a loss, and now and then an evaluation of some of NAMES
    (NaN, Inf and ties among the values), with an epoch or without."""
    records, step = [], 0
    evaluated = list(rng.choice(NAMES, size=int(rng.integers(1, 4)), replace=False))
    for _ in range(int(rng.integers(1, 40))):
        step += int(rng.integers(1, 5))
        records.append({"step": step, "t": 1000.0 + step, "loss": float(rng.normal())})
        if rng.random() < 0.4:
            rec: dict = {"step": step, "t": 1000.5 + step}
            if rng.random() < 0.7:
                rec["epoch"] = step // 10
            for name in evaluated:
                if rng.random() < 0.85:
                    rec[name] = (
                        float(rng.choice([math.nan, math.inf, -math.inf]))
                        if rng.random() < 0.1
                        else float(rng.integers(0, 6)) / 5
                    )
            records.append(rec)
    return records


def by_hand(records: list[dict], primary: str | None = None, mode: str | None = None) -> tuple | None:
    """(metric, value, step, epoch) of the best evaluation: the first evaluation with the best finite value."""
    evals = [r for r in records if any(k.startswith("eval/") for k in r)]
    if primary is None:
        first = sorted(k for k in evals[0] if k.startswith("eval/")) if evals else []  # chosen at the first evaluation
        primary = "eval/loss" if "eval/loss" in first else "eval/eval_loss" if "eval/eval_loss" in first else (first or [None])[0]
    if primary is None:
        return None
    better = {"min": min, "max": max}[mode] if mode else BETTER[primary]
    found = [(r[primary], r["step"], r.get("epoch")) for r in evals if primary in r and math.isfinite(r[primary])]
    if not found:
        return None
    value = better(v for v, _, _ in found)
    step, epoch = next((s, e) for v, s, e in found if v == value)
    return primary, value, step, epoch


def test_the_running_best_and_the_full_summarys_agree_with_every_evaluation_worked_out_by_hand(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    checked = 0
    for i in range(120):
        records = random_evaluations(rng)
        run_dir = tmp_path / "p" / f"r{i}"
        run_dir.mkdir(parents=True)
        write_json_atomic(run_dir / "meta.json", {"run_id": f"r{i}", "project": "p"})
        writer = RunWriter(run_dir, 0)
        cut = sorted(rng.choice(len(records) + 1, size=2))
        for part in (records[: cut[0]], records[cut[0] : cut[1]], records[cut[1] :]):  # as the worker hands them over
            writer.write(part)
        writer.close("finished")
        expected = by_hand(records)
        status = json.loads((run_dir / "status.rank0.json").read_text())["best_eval"]
        got = (status["metric"], status["value"], status["step"], status["epoch"]) if status else None
        assert got == expected, records
        listed, full = list_run(run_dir), summarize_run(open_run(run_dir))
        for s in (listed, full):
            assert (s.best_eval_metric, s.best_eval, s.best_eval_step, s.best_eval_epoch) == (expected or (None,) * 4)
        if expected:
            assert listed.best_eval_mode == full.best_eval_mode == BETTER[expected[0]].__name__
            checked += 1
    assert checked > 60


def test_the_configs_primary_and_mode_decide_which_evaluation_is_the_best(tmp_path: Path) -> None:
    records = [
        {"step": 10, "epoch": 1, "eval/loss": 0.9, "eval/accuracy": 0.5},
        {"step": 20, "epoch": 2, "eval/loss": 0.7, "eval/accuracy": 0.8},
        {"step": 30, "epoch": 3, "eval/loss": 0.8, "eval/accuracy": 0.4},
    ]
    for primary, mode in ((None, None), ("accuracy", None), ("eval/accuracy", "min"), (None, "max")):
        writer = RunWriter(tmp_path / f"{primary}-{mode}", 0, eval_primary=primary, eval_mode=mode)
        writer.write(records)
        name = "eval/loss" if primary is None else "eval/accuracy"
        best = writer.status()["best_eval"]
        assert (best["metric"], best["value"], best["step"], best["epoch"]) == by_hand(records, name, mode), (primary, mode)
        assert best["mode"] == (mode or BETTER[name].__name__)
    writer = RunWriter(tmp_path / "absent", 0, eval_primary="f1")
    writer.write(records)
    assert writer.status()["best_eval"] is None, "the configured primary was never recorded"


def test_a_resumed_run_keeps_the_earlier_attempts_best_evaluation(tmp_path: Path) -> None:
    first = RunWriter(tmp_path, rank=0, attempt=1)
    first.write([{"step": 5, "loss": 1.0}, {"step": 5, "epoch": 1, "eval/loss": 0.6}, {"step": 10, "epoch": 2, "eval/loss": 0.5}])
    first.close("failed")
    again = RunWriter(tmp_path, rank=0, attempt=2)
    assert again.status()["best_eval"] == first.status()["best_eval"]
    assert (again.status()["best_eval"]["value"], again.status()["best_eval"]["step"]) == (0.5, 10)
    again.write([{"step": 8, "epoch": 2, "eval/loss": 0.55}])  # resumed from step 7: the evaluation at 10 still counts
    assert again.status()["best_eval"]["value"] == 0.5
    again.write([{"step": 12, "epoch": 3, "eval/loss": 0.4}])
    assert (again.status()["best_eval"]["value"], again.status()["best_eval"]["epoch"]) == (0.4, 3)


def test_a_status_files_best_eval_is_read_only_when_whole() -> None:
    whole = {"metric": "eval/loss", "value": 0.5, "step": 3, "mode": "min", "epoch": 1, "t": 12.0}
    assert BestEval.from_dict(whole) == BestEval("eval/loss", 0.5, 3, "min", 1, 12.0)
    for broken in (None, [], {**whole, "value": "nan"}, {**whole, "step": 3.5}, {**whole, "mode": "lowest"}, {"value": 1}):
        assert BestEval.from_dict(broken) is None, broken
    bests = EvalBests()
    bests.add({"step": 1, "eval/accuracy": float("nan"), "loss": 2.0})
    assert bests.names == ["eval/accuracy"] and bests.best() is None  # named, but nothing finite yet
    bests.add({"step": "2", "eval/accuracy": 0.9})  # no integer step: not an evaluation at a step
    assert bests.best() is None
