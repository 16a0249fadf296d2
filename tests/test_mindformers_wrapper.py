"""mindwatch's train wrapper for MindFormers (``register()`` builds it in front of the YAML's ``runner_wrapper``, here the
tests' CPU subclass of ``MFTrainOneStepCell``): MindFormers' outputs unchanged, and what our own cells measure.

The references are independent of mindwatch: numpy's norms of the Parameters before and after each step and of the
optimizer's moment Parameters (``adam_m.<name>``, ``adam_v.<name>``), read by a callback of the training script
(``--dump-norms``), and MindFormers' own ``local_norm`` output (the gradients' squared sums per parameter).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from test_mindformers import _assert_same_as_mfloss_monitor, _train

import mindwatch
from mindwatch.mindspore.layer_stats import group_layers

pytestmark = pytest.mark.slow  # MindFormers trainings in their environment: 15-25 s each (needs_mindformers: its module)


def numpy_layers(dump: dict, step: int) -> dict[str, np.ndarray]:
    """Per layer (as mindwatch groups parameters): weight norm, update ratio, Adam m and v norms, and the gradient norm
    from MindFormers' ``local_norm``, at ``step``; from the dump's per-parameter norms."""
    row = dump[str(step)]
    names = row["names"]
    layers, index = group_layers(names)
    per_param = np.array([row["params"][n] for n in names])  # (params, [weight, update, m, v]) norms
    squares = np.zeros((len(layers), 5))
    for i, j in enumerate(index):
        squares[j, :4] += per_param[i] ** 2
        squares[j, 4] += row["local_norm"][i]
    weight, update, m, v, grad = np.sqrt(squares).T
    stats = {"weight_norm": weight, "update_ratio": update / weight, "adam_m_norm": m, "adam_v_norm": v, "grad_norm": grad}
    return stats | {"layers": layers}


def _at(run: mindwatch.Run, metric: str, step: int) -> float:
    series = run.series(metric)
    return float(series.value[series.step.tolist().index(step)])


def test_the_wrapper_keeps_mindformers_outputs_and_measures_every_layer_statistic(tmp_path: Path) -> None:
    """Every 3 steps (and the first), each layer's gradient norm equals the norm of MindFormers' own local_norm output,
    and its weight norm, update ratio and Adam moments numpy's of the Parameters; MFLossMonitor prints what it did."""
    monitor = {"layers": {"every": 3}}
    dump = tmp_path / "norms.json"
    args = ("--local-norm", "--dump-norms", str(dump), "--monitor", json.dumps(monitor))
    run, printed = _train("yaml", tmp_path, *args)
    _assert_same_as_mfloss_monitor(run, printed, clipped=True)
    head = json.loads((run.path / "layers.rank0" / "layers.json").read_text())
    assert head["stats"] == ["grad_norm", "weight_norm", "update_ratio", "adam_m_norm", "adam_v_norm"]
    norms = json.loads(dump.read_text())
    measured = [1, 3, 6]
    for step in measured:
        ours = numpy_layers(norms, step)
        assert tuple(ours["layers"]) == tuple(head["layers"])
        for stat in ("grad_norm", "weight_norm", "update_ratio", "adam_m_norm", "adam_v_norm"):
            got = np.array([_at(run, f"{stat}/{layer}", step) for layer in head["layers"]])
            assert got == pytest.approx(ours[stat], rel=2e-4, abs=1e-12), f"{stat} at step {step}"
    assert run.series(f"weight_norm/{head['layers'][0]}").step.tolist() == measured
    assert max(numpy_layers(norms, 6)["update_ratio"]) > 0  # the lr warmed up: a real update was measured


def test_skip_steps_and_a_rewinds_passed_over_batches_apply_no_update(tmp_path: Path) -> None:
    """``skip_steps`` (a tiny sigma: after its warm-up, the steps are skipped) and, at step 12, a NaN loss rewound to
    step 8's snapshot with 3 batches passed over: a step mindwatch records as skipped, and each batch passed over,
    changed no weight (numpy's norm of the update is 0), and every other step did."""
    monitor = {
        "skip_steps": {"enabled": True, "sigma": 0.01, "warmup": 3},
        "rewind": {"every": 4, "skip": 3},
        "alerts": {"nonfinite": {"actions": ["rewind"]}},
    }
    dump = tmp_path / "norms.json"
    args = ("--warmup", "0", "--inf-at", "12", "--dump-norms", str(dump), "--monitor", json.dumps(monitor))
    run, _ = _train("yaml", tmp_path, *args, steps=24)
    norms = {int(k): v for k, v in json.loads(dump.read_text()).items()}
    updated = {s: max(p[1] for p in row["params"].values()) > 0 for s, row in norms.items()}
    (rewind,) = [a for a in run.alerts if a["rule"] == "intervention" and a["actions"] == ["rewind"]]
    assert rewind["skipped_batches"] == 3 and rewind["cause_step"] == 12
    passed = [rewind["step"] + i for i in (1, 2, 3)]  # MindSpore's count of the batches after the rewind's step
    assert not any(updated[s] for s in passed), "a batch passed over changed the weights"
    records = [json.loads(line) for line in (run.path / "metrics.rank0.jsonl").read_text().splitlines()]
    records = [r for r in records if isinstance(r.get("step"), int)]
    skipped = {r.get("iteration", r["step"]) for r in records if r.get("skipped") == 1}  # the framework's count
    assert skipped, "sigma 0.01 skips some steps"
    applied = [s for s in norms if s not in passed and s not in skipped and s != 12]  # 12: NaN gradients, no update
    assert applied and all(updated[s] for s in applied), "a step neither skipped nor passed over changed no weight"
    assert not any(updated[s] for s in skipped - {12}), "a skipped step changed the weights"  # 12: the inf set in it
    assert math.isnan(float(next(r["loss"] for r in records if r["step"] == 12 and "iteration" not in r)))
    assert mindwatch.open_run(run.path).state == "finished"
