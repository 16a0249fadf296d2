"""The ``profile`` action: MindSpore's profiler around the next steps of a real training, asked by a person
(``mindwatch profile``) or by an alert; its trace, its op statistics and the summary mindwatch reads from them.

The reference for the summary is MindSpore's own op statistics file, read here with the csv module.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mindspore import dataset as ds
from mindspore import nn
from mindspore.train import Callback, Model

import mindwatch
from mindwatch.mindspore import MonitorCallback

STEPS = 70


def training(pace: float, bad_at: int | None = None, slow_from: int = 10**9):
    """A small MLP regression (GRAPH); the pipeline sleeps ``pace`` s a batch (0.3 s from batch ``slow_from``), and batch
    ``bad_at`` (1-based step) has inputs x 1000."""
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    net = nn.SequentialCell(nn.Dense(16, 64), nn.ReLU(), nn.Dense(64, 1))
    model = Model(net, nn.MSELoss(), nn.Adam(net.trainable_params(), 1e-3))

    def batches():
        rng = np.random.default_rng(0)
        for i in range(STEPS):
            time.sleep(0.3 if i + 1 >= slow_from else pace)
            x = rng.standard_normal((8, 16)).astype(np.float32)
            yield (x * 1000 if i + 1 == bad_at else x), np.ones((8, 1), np.float32)

    return model, ds.GeneratorDataset(batches, ["x", "y"], shuffle=False)


def mindspore_top_op(csv_path: Path) -> str:
    """The op type with the most time in MindSpore's own op statistics."""
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    return max(rows, key=lambda r: float(r["total_compute_time"]))["op_type"]


def assert_profiled(profile, first_step: int, steps: int) -> None:
    """``profiles/step_<first>/rank0/`` holds MindSpore's trace and op statistics, analysed, and the summary's top op
    type is the top row of MindSpore's csv."""
    assert (profile.first_step, profile.steps, sorted(profile.ranks)) == (first_step, steps, [0])
    rank = profile.ranks[0]
    assert rank.note.state == "done", rank.note
    assert rank.folder is not None and rank.folder.parent == profile.path / "rank0"
    assert rank.trace is not None and isinstance(json.loads(rank.trace.read_text()), list)
    assert rank.op_stats is not None and rank.top_ops, "no op statistics"
    assert rank.top_ops[0].op_type == mindspore_top_op(rank.op_stats)
    assert [o.total_ms for o in rank.top_ops] == sorted((o.total_ms for o in rank.top_ops), reverse=True)


class AskAtStep(Callback):
    """At step ``at``, ``mindwatch profile RUN --steps 3 --wait 60`` in a subprocess (the training goes on)."""

    def __init__(self, monitor: MonitorCallback, at: int) -> None:
        self.monitor, self.at = monitor, at
        self.proc: subprocess.Popen | None = None

    def on_train_step_end(self, run_context) -> None:
        if run_context.original_args().cur_step_num == self.at:
            cmd = [sys.executable, "-m", "mindwatch.cli", "profile", str(self.monitor.run_dir), "--steps", "3", "--wait", "60"]
            self.proc = subprocess.Popen([*cmd, "--reason", "slow steps"], stdout=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def profiled(tmp_path_factory) -> tuple[object, str]:
    """One paced training (~10 s) with two profiles: a person's (``mindwatch profile --steps 3`` at step 5) and a
    threshold's (``thresholds: {actions: [profile]}``, ``profile.steps: 4``) after a bad batch at step 60. Returns the
    run and what the command printed."""
    model, data = training(pace=0.03, bad_at=60, slow_from=58)
    config = {
        "save_dir": str(tmp_path_factory.mktemp("profiled")),
        "project": "p",
        "interval": 60,
        "callback": {"params": {"warn_on_value": {"loss": 1e4}}},
        "alerts": {"thresholds": {"actions": ["profile"]}},
        "profile": {"steps": 4},
    }
    monitor = MonitorCallback(config)
    ask = AskAtStep(monitor, at=5)
    model.train(1, data, callbacks=[monitor, ask], dataset_sink_mode=False)
    assert ask.proc is not None
    out, _ = ask.proc.communicate(timeout=60)
    return mindwatch.open_run(monitor.run_dir), out


@pytest.mark.slow  # the module's training
def test_mindwatch_profile_answers_the_first_profiled_step_and_its_folder_holds_mindspores_trace(profiled) -> None:
    run, out = profiled
    answer = [line for line in out.splitlines() if "taken at step" in line]
    assert len(answer) == 1, out
    first = int(answer[0].split("taken at step ")[1].split(":")[0])
    asked = run.profiles[0]
    assert_profiled(asked, first, 3)
    note = asked.note
    assert (note.rule, note.reason, note.requested_by is not None) == ("request", "slow steps", True)
    done = [a for a in run.alerts if a["rule"] == "intervention" and a.get("first_step") == first]
    assert [a["step"] for a in done] == [first - 1]  # carried out at the boundary before it


@pytest.mark.slow  # the module's training
def test_a_threshold_with_actions_profile_profiles_from_the_step_after_the_bad_batch(profiled) -> None:
    """A bad batch at step 60 crosses ``warn_on_value``; ``thresholds: {actions: [profile]}``: one profile, from the first
    step the request reaches (61 unless the worker's rules saw it later), of ``profile.steps`` steps."""
    run, _ = profiled
    (threshold,) = [a for a in run.alerts if a["rule"] == "threshold"]
    done = [a for a in run.alerts if a["rule"] == "intervention" and a.get("cause") == "threshold"]
    assert threshold["step"] == 60 and [a["cause_step"] for a in done] == [60]
    assert len(run.profiles) == 2
    profile = run.profiles[1]
    assert profile.first_step == done[0]["step"] + 1 >= 61
    assert_profiled(profile, profile.first_step, 4)
    assert profile.note.rule == "threshold" and "loss" in profile.reason
    marked = run.series("profiled")  # the profiled steps and the step after (its time holds the stop) say so
    expected = [s for p in run.profiles for s in range(p.first_step, p.last_step + 2)]
    assert marked.step.tolist() == expected


def test_throughput_drop_does_not_judge_the_steps_a_profile_slowed() -> None:
    """The profiled steps (``profiled: 1``) run slower: the same slow records fire ``throughput_drop`` without the flag
    and not with it, so a ``throughput_drop: {actions: [profile]}`` does not ask again for the profile it caused."""
    from mindwatch.alerts.rules.throughput_drop import ThroughputDropRule

    def fired(flag: bool) -> list:
        rule = ThroughputDropRule(window=10, warmup=5, count=3)
        steady = [{"step": s, "loss": 1.0, "samples_per_second": 100.0} for s in range(1, 21)]
        slow = [{"step": s, "loss": 1.0, "samples_per_second": 20.0, **({"profiled": 1} if flag else {})} for s in range(21, 27)]
        return [a for rec in steady + slow for a in rule.check(rec)]

    assert [a["step"] for a in fired(flag=False)] == [23]
    assert fired(flag=True) == []
