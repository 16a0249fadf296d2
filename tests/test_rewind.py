"""``rewind``: a run goes back to a snapshot before a bad stretch, passes over the batches after it, and finishes.

Real trainings on CPU: a toy regression (Dense 8-32-1, Momentum 0.02/0.9, batch 8) whose inputs are x 30 for steps
85-89; without help it diverges to NaN. The reference for the restored state is a ``ModelCheckpoint`` file written at
step 80 (MindSpore's own), read with ``ms.load_checkpoint``; the state after each step is copied by a callback of the
test's own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from conftest import wait_for
from mindspore import dataset as ds
from mindspore import nn
from mindspore.train import Callback, CheckpointConfig, Model, ModelCheckpoint
from test_notify import Hook
from test_skip_steps import WithIds

import mindwatch
import mindwatch.mindspore as mw
from mindwatch.analysis.summary import list_run, summarize_run
from mindwatch.demo.tutorial_step import jit_train_step
from mindwatch.mindspore import MonitorCallback, TrainOneStepWithGradNorm
from mindwatch.report.html import render_report
from mindwatch.serve.api import thinned_series
from mindwatch.serve.views import RunView
from mindwatch.store.requests import file_request

STEPS, BATCH, EVERY, SKIP, PACE = 140, 8, 20, 10, 0.02
BAD = range(85, 90)  # 1-based steps whose inputs are x 30


def samples(bad: range | None = BAD, steps: int = STEPS) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(steps * BATCH, 8)).astype(np.float32)
    y = (x @ rng.normal(size=(8, 1))).astype(np.float32)
    if bad is not None:
        x[(bad.start - 1) * BATCH : (bad.stop - 1) * BATCH] *= 30.0
    return x, y


class Paced:
    """The samples, a batch every ``PACE`` s at most: mindwatch's rules run on its worker, which takes a batch of records
    every 0.25 s, so a rule's request comes ~0.25 s after its step; at a realistic pace that is a few steps."""

    def __init__(self, bad: range | None, steps: int, ids: bool = False) -> None:
        self.x, self.y = samples(bad, steps)
        self.ids = ids

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        if i % BATCH == 0:
            time.sleep(PACE)
        return (self.x[i], self.y[i], np.int64(1000 + i)) if self.ids else (self.x[i], self.y[i])


def dataset(bad: range | None = BAD, steps: int = STEPS, ids: bool = False) -> ds.Dataset:
    columns = ["x", "y", "sample_id"] if ids else ["x", "y"]
    return ds.GeneratorDataset(Paced(bad, steps, ids), columns, shuffle=False).batch(BATCH, drop_remainder=True)


def training() -> tuple[nn.Cell, nn.Optimizer, nn.Cell]:
    ms.set_seed(0)
    net = nn.SequentialCell(nn.Dense(8, 32), nn.ReLU(), nn.Dense(32, 1))
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.02, momentum=0.9)
    return net, opt, TrainOneStepWithGradNorm(nn.WithLossCell(net, nn.MSELoss()), opt)


class States(Callback):
    """The network's and the optimizer's parameters after every step (``cur_step_num``), and the loss; with ``monitor``,
    the steps of the snapshots mindwatch holds."""

    def __init__(self, net: nn.Cell, opt: nn.Optimizer, monitor: MonitorCallback | None = None) -> None:
        self.params = {p.name: p for cell in (net, opt) for p in cell.get_parameters()}
        self.after: dict[int, dict[str, np.ndarray]] = {}
        self.loss: dict[int, float] = {}
        self.monitor = monitor
        self.snapshots: dict[int, list[int]] = {}
        #: The step (``cur_step_num``) after which a person asks for a checkpoint; 0: none.
        self.checkpoint_at = 0

    def on_train_step_end(self, run_context) -> None:
        cb = run_context.original_args()
        self.after[cb.cur_step_num] = {n: p.asnumpy().copy() for n, p in self.params.items()}
        if cb.cur_step_num == self.checkpoint_at and self.monitor is not None:  # a person asks for a checkpoint
            run_dir = Path(self.monitor.run_dir)
            file_request(run_dir, "checkpoint", reason="keep this one")
            wait_for(lambda: read_request(run_dir), 30, "the request read")  # at this step: the next boundary acts
        if self.monitor is not None and self.monitor.recorder is not None and self.monitor.recorder.rewinds is not None:
            self.snapshots[cb.cur_step_num] = [s.step for s in self.monitor.recorder.rewinds.snapshots.held]
        out = cb.net_outputs
        self.loss[cb.cur_step_num] = float((out[0] if isinstance(out, (tuple, list)) else out).asnumpy())


def rewind_config(save_dir: Path, **rewind) -> dict:
    return {
        "save_dir": str(save_dir),
        "alerts": {"spike": {"metrics": ["loss"], "count": 1, "actions": ["rewind"]}},
        "rewind": {"every": EVERY, "skip": SKIP, **rewind},
    }


def raw_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def clean_losses() -> list[float]:
    """The last losses of the same training without the bad stretch (no mindwatch)."""
    ms.set_context(mode=ms.GRAPH_MODE)
    net, opt, cell = training()
    states = States(net, opt)
    Model(cell).train(1, dataset(bad=None), callbacks=[states], dataset_sink_mode=False)
    return [states.loss[s] for s in range(STEPS - 9, STEPS + 1)]


def interventions(run_dir: Path, action: str) -> list[dict]:
    return [a for a in raw_records(run_dir / "alerts.jsonl") if a["rule"] == "intervention" and a["actions"] == [action]]


def the_rewind(run_dir: Path) -> dict:
    rewinds = interventions(run_dir, "rewind")
    assert len(rewinds) == 1, rewinds
    return rewinds[0]


def check_the_rewind(run_dir: Path, states: States, ckpt: Path, clean: list[float]) -> None:
    rewind = the_rewind(run_dir)
    at = rewind["step"]
    assert rewind["to_step"] == 80 and rewind["cause_step"] == BAD.start and at >= BAD.start
    assert rewind["skipped_batches"] == SKIP
    assert [b["index"] for b in rewind["batches"]] == list(range(at, at + SKIP)) and rewind["batches"][0]["epoch"] == 1
    # right after the rewind, the weights and the optimizer's state are those ModelCheckpoint wrote at step 80
    reference = ms.load_checkpoint(str(ckpt))
    after = states.after[at]
    shared = sorted(set(reference) & set(after))
    assert {"global_step", "moments.0.weight", "moments.2.bias", "0.weight", "2.bias"} <= set(shared)
    for name in shared:
        assert np.array_equal(after[name], reference[name].asnumpy()), name
    # the batches passed over changed nothing
    for name in shared:
        assert np.array_equal(states.after[at + SKIP][name], after[name]), name
    assert not np.array_equal(states.after[at + SKIP + 1]["0.weight"], after["0.weight"])
    # finite, and near a clean run's loss
    last = [states.loss[s] for s in range(STEPS - 9, STEPS + 1)]
    assert np.isfinite(last).all() and np.mean(last) < 2 * np.mean(clean) + 0.05, (last, clean)
    # one run: the charts continue from the snapshot's step
    run = mindwatch.open_run(run_dir)
    assert run.state == "finished"
    loss = run.series("loss")
    trained = STEPS - (at - 80) - SKIP
    assert json.loads((run_dir / "meta.json").read_text())["total_steps"] == trained, "the plan ends where the run does"
    assert list(loss.step) == list(range(1, trained + 1))
    step_time = run.series("step_time")
    after = float(step_time.value[list(step_time.step).index(81)])
    # timed alone: not from the rewind's step, over the SKIP batches passed over (a ratio to the median step failed on a
    # busy machine, where one PyNative step took 6x the median): from the rewind's record to step 81's again
    records = [json.loads(line) for line in (run_dir / "metrics.rank0.jsonl").read_text().splitlines() if line.strip()]
    rewound_at = next(r["t"] for r in records if r["step"] == at)
    again = [r["t"] for r in records if r["step"] == 81][-1]
    assert after < (again - rewound_at) / 2, "the first step after the rewind is timed alone"
    written = [r["step"] for r in raw_records(run_dir / "metrics.rank0.jsonl") if "loss" in r]
    assert written[at - 1 : at + 1] == [at, 81], "after the rewind, step 81 again"
    # the dashboard draws the abandoned branch faint: the values the rewind went back over, steps 81..at
    view = RunView("default/" + run_dir.name, run_dir, run_dir.parent.parent.resolve())
    abandoned = thinned_series(view, "loss", points=100_000)["abandoned"]
    old = [r for r in raw_records(run_dir / "metrics.rank0.jsonl") if "loss" in r][80:at]
    assert [p[0] for p in abandoned] == list(range(81, at + 1))
    assert [p[1] for p in abandoned] == [r["loss"] if isinstance(r["loss"], float) else None for r in old]
    table = render_report([run]).split('<table id="rewinds">', 1)[1].split("</table>", 1)[0]
    assert f"<td>{at}</td><td>80</td><td>{SKIP} (epoch 1, batches {at}-{at + SKIP - 1})</td>" in table
    assert "<td>spike at step 85</td>" in table


def check_iterations(run_dir: Path, at: int, losses: dict[int, float], first: int, last: int) -> None:
    """The records after the rewind at step ``at`` carry ``iteration``, the framework's own count of their step: the
    count under which the test saw the record's loss (``losses``: by ``cur_step_num``, or a loop's calls), ``first``
    to ``last``; the records up to the rewind carry none."""
    records = [r for r in raw_records(run_dir / "metrics.rank0.jsonl") if "loss" in r]
    before, after = records[:at], records[at:]
    assert [r["step"] for r in before] == list(range(1, at + 1)) and not any("iteration" in r for r in before)
    assert [r["iteration"] for r in after] == list(range(first, last + 1))
    assert [r["loss"] for r in after] == [losses[r["iteration"]] for r in after], "the step the framework counted so"
    rewind = the_rewind(run_dir)
    assert rewind["iteration"] == at and f"rewound from step {at} (iteration {at}) to step 80 " in rewind["message"]


@pytest.mark.parametrize("mode", ["graph", "pynative"])
def test_a_bad_stretch_is_rewound_to_the_snapshot_before_it_and_the_run_finishes(
    tmp_path: Path, mode: str, clean_losses: list[float]
) -> None:
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    net, opt, cell = training()
    hook = Hook()  # the end-of-run message as Slack's webhook gets it, on a real local HTTP server
    config = {**rewind_config(tmp_path / "out"), "notify": [{"type": "slack", "url": f"{hook.url}/end", "events": ["end"]}]}
    mon = MonitorCallback(config)
    states = States(net, opt, mon)
    states.checkpoint_at = 110  # after the rewind: MindSpore's step 110 is mindwatch's 91-94
    ckpt = ModelCheckpoint("ref", str(tmp_path / "ckpt"), CheckpointConfig(save_checkpoint_steps=EVERY, keep_checkpoint_max=20))
    Model(cell).train(1, dataset(), callbacks=[mon, states, ckpt], dataset_sink_mode=False)
    check_the_rewind(Path(mon.run_dir), states, tmp_path / "ckpt" / "ref-1_80.ckpt", clean_losses)
    at = the_rewind(Path(mon.run_dir))["step"]
    # the last healthy checkpoint of a request after the rewind: the newest ModelCheckpoint wrote before it, by the
    # files' times (their names count MindSpore's steps, which the rewind did not take back: 100, not 80)
    (asked,) = [a for a in raw_records(Path(mon.run_dir) / "alerts.jsonl") if a["rule"] == "request"]
    (saved,) = interventions(Path(mon.run_dir), "checkpoint")
    before = max((f for f in (tmp_path / "ckpt").glob("ref-*.ckpt") if f.stat().st_mtime < asked["t"]), key=os.path.getmtime)
    assert saved["last_healthy_checkpoint"] == str(before) and before.name == "ref-1_100.ckpt"
    # a rewind drops the snapshots after the step it went back to and keeps the ones before (which depends on how many
    # steps the rewind took to land on a loaded machine: 60 and 80, or 80 alone once step 100's pushed 60 out)
    before_rewind = states.snapshots[at - 1]
    assert before_rewind[-1] <= 100
    assert states.snapshots[at] == [s for s in before_rewind if s <= 80], "a rewind drops what came after"
    assert states.snapshots[at][-1] == 80
    assert states.snapshots[at + SKIP] == states.snapshots[at], "and the batches passed over take none"
    final = STEPS - (at - 80) - SKIP
    assert states.snapshots[STEPS] == list(range(EVERY, final + 1, EVERY))[-2:]
    # each step after the rewind beside MindSpore's count of it (cur_step_num: the dataset's batches up to it)
    check_iterations(Path(mon.run_dir), at, states.loss, first=at + SKIP + 1, last=STEPS)
    # ModelCheckpoint's file of the last step, found by its record (docs/resume.md): the weights after that step
    last = [r for r in raw_records(Path(mon.run_dir) / "metrics.rank0.jsonl") if "loss" in r][-1]
    assert (last["step"], last["iteration"], last["batch"]) == (final, STEPS, STEPS - 1)
    saved = ms.load_checkpoint(str(tmp_path / "ckpt" / f"ref-{last['epoch']}_{last['batch'] + 1}.ckpt"))
    weights = states.after[last["iteration"]]
    assert {"0.weight", "2.bias"} <= set(saved) & set(weights)
    for name in set(saved) & set(weights):
        assert np.array_equal(saved[name].asnumpy(), weights[name]), name
    hook.wait(1)
    hook.close()
    (end,) = [r["json"] for r in hook.requests]
    # the steps beside the batches MindSpore trained on, as its own step count and a ModelCheckpoint name number them
    said = f"{final} steps ({STEPS} iterations, {at - 80} re-run after a rewind, {SKIP} batches passed over)"
    assert said in end["text"], end["text"]
    meta = json.loads((Path(mon.run_dir) / "meta.json").read_text())
    one = sum(a.nbytes for a in states.after[1].values())
    assert meta["rewind"]["snapshot_bytes"] == one and meta["rewind"]["bytes"] == 2 * one


def test_without_help_the_bad_stretch_diverges_to_nan() -> None:
    ms.set_context(mode=ms.GRAPH_MODE)
    net, opt, cell = training()
    states = States(net, opt)
    Model(cell).train(1, dataset(), callbacks=[states], dataset_sink_mode=False)
    assert np.isfinite(states.loss[BAD.start - 1]) and not np.isfinite(states.loss[STEPS])


def test_a_loop_of_its_own_rewinds_and_run_batches_passes_over_the_batches(tmp_path: Path, clean_losses: list[float]) -> None:
    ms.set_context(mode=ms.PYNATIVE_MODE)
    net, opt, _ = training()
    train_step = jit_train_step(nn.WithLossCell(net, nn.MSELoss()), opt)

    states = States(net, opt)
    reference = tmp_path / "step80.ckpt"
    losses: list[float] = []
    with mw.start_run(rewind_config(tmp_path / "out"), network=net, optimizer=opt) as run:
        for x, y in run.batches(dataset().create_tuple_iterator()):
            loss, grads = train_step(x, y)
            run.step(loss=loss, grads=grads)
            losses.append(float(loss.asnumpy()))
            calls = len(losses)
            states.after[calls] = {n: p.asnumpy().copy() for n, p in states.params.items()}
            if calls == 80:  # the test's own checkpoint of the network and the optimizer
                ms.save_checkpoint([{"name": n, "data": p} for n, p in states.params.items()], str(reference))
    rewind = the_rewind(run.run_dir)
    at = rewind["step"]
    assert rewind["to_step"] == 80 and rewind["cause_step"] == BAD.start and rewind["skipped_batches"] == SKIP
    assert [b["index"] for b in rewind["batches"]] == list(range(at, at + SKIP))
    expected = ms.load_checkpoint(str(reference))
    for name, value in states.after[at].items():
        assert np.array_equal(value, expected[name].asnumpy()), name
    assert len(losses) == STEPS - SKIP, "the batches passed over were not given to the loop"
    assert np.isfinite(losses[-10:]).all() and np.mean(losses[-10:]) < 2 * np.mean(clean_losses) + 0.05
    loaded = mindwatch.open_run(run.run_dir)
    assert loaded.state == "finished"
    assert list(loaded.series("loss").step) == list(range(1, STEPS - SKIP - (at - 80) + 1))
    # each step after the rewind beside the loop's own count of it, its calls (the batches passed over are none)
    check_iterations(run.run_dir, at, dict(enumerate(losses, 1)), first=at + 1, last=STEPS - SKIP)


def test_a_stream_that_stays_bad_is_rewound_max_times_then_the_run_stops_and_says_why(tmp_path: Path) -> None:
    ms.set_context(mode=ms.GRAPH_MODE)
    steps = 200
    net, opt, _ = training()
    cell = TrainOneStepWithGradNorm(WithIds(net), opt)
    config = {
        "save_dir": str(tmp_path / "out"),
        "callback": {"sample_ids": "sample_id"},
        "skip_steps": {"enabled": True, "metric": "loss", "max_consecutive": 3, "actions": ["rewind"]},
        "rewind": {"every": EVERY, "skip": SKIP, "max": 2},
    }
    mon = MonitorCallback(config)
    data = dataset(bad=range(150, steps + 1), steps=steps, ids=True)
    Model(cell).train(1, data, callbacks=[mon], dataset_sink_mode=False)
    run_dir = Path(mon.run_dir)
    rewinds = interventions(run_dir, "rewind")
    assert [(r["step"], r["to_step"], r["skipped_batches"]) for r in rewinds] == [(152, 140, SKIP), (143, 140, SKIP)]
    # the batches passed over, named: the first rewind's are batches 152..161 (0-based), the second's 165..174
    for rewind, first in zip(rewinds, (152, 165), strict=True):
        assert [b["index"] for b in rewind["batches"]] == list(range(first, first + SKIP))
        assert rewind["batches"][0]["sample_ids"] == list(range(1000 + first * BATCH, 1000 + (first + 1) * BATCH))
    (stop,) = interventions(run_dir, "stop")
    assert stop["step"] == 143 and stop["cause"] == "skip"
    status = json.loads((run_dir / "status.rank0.json").read_text())
    assert status["state"] == "stopped"
    assert status["reason"].startswith("stopped by mindwatch: 2 rewinds did not get past: 3 steps in a row were skipped")
    assert [r["step"] for r in raw_records(run_dir / "metrics.rank0.jsonl") if "loss" in r][-1] == 143
    # MindSpore's count of each step, ahead after each rewind: the dataset's batch its sample ids name
    assert [r["iteration"] for r in rewinds] == [152, 165]
    records = [r for r in raw_records(run_dir / "metrics.rank0.jsonl") if "loss" in r]
    assert not any("iteration" in r for r in records[:152]) and all("iteration" in r for r in records[152:])
    for r in records:
        assert r["sample_ids"][0] == 1000 + (r.get("iteration", r["step"]) - 1) * BATCH, r
    assert (records[-1]["step"], records[-1]["iteration"]) == (143, 178)


def test_a_person_rewinds_a_live_run_from_a_shell_to_a_step(tmp_path: Path) -> None:
    ms.set_context(mode=ms.PYNATIVE_MODE)
    net, opt, _ = training()
    train_step = jit_train_step(nn.WithLossCell(net, nn.MSELoss()), opt)

    config = {"save_dir": str(tmp_path / "out"), "rewind": {"every": EVERY, "skip": 5, "keep": 3}}
    shell = None
    with mw.start_run(config, network=net, optimizer=opt) as run:
        for i, (x, y) in enumerate(run.batches(dataset(bad=None).create_tuple_iterator()), 1):
            loss, grads = train_step(x, y)
            run.step(loss=loss, grads=grads)
            if i == 50:
                command = [
                    sys.executable,
                    "-m",
                    "mindwatch.cli",
                    "rewind",
                    str(run.run_dir),
                    "--to",
                    "45",
                    "--reason",
                    "bad data",
                ]
                shell = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert shell is not None and shell.returncode == 0, shell.stderr if shell else None
    rewind = the_rewind(run.run_dir)
    assert rewind["to_step"] == 40 and rewind["skipped_batches"] == 5 and rewind["cause"] == "request"
    request_id = shell.stdout.split("filed request ")[1].split()[0]
    answer = json.loads((run.run_dir / "control" / "answers" / f"{request_id}.json").read_text())
    assert answer["state"] == "taken" and answer["step"] == rewind["step"]
    (asked,) = [a for a in raw_records(run.run_dir / "alerts.jsonl") if a["rule"] == "request"]
    assert asked["reason"] == "bad data" and asked["to_step"] == 45 and rewind["request"] == request_id


def read_request(run_dir: Path) -> bool:
    alerts = run_dir / "alerts.jsonl"
    return alerts.exists() and any(a["rule"] == "request" for a in raw_records(alerts))


def rewound_from_a_shell(tmp_path: Path, *, at: int, skip: int) -> mw.Run:
    """A loop of 100 clean steps (PyNative) that a person rewinds to step 20 with `mindwatch rewind` after call ``at``,
    passing over ``skip`` batches; the run, ended."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    net, opt, _ = training()
    train_step = jit_train_step(nn.WithLossCell(net, nn.MSELoss()), opt)
    config = {"save_dir": str(tmp_path / "out"), "rewind": {"every": EVERY, "skip": skip, "keep": 3}}
    with mw.start_run(config, network=net, optimizer=opt) as run:
        for i, (x, y) in enumerate(run.batches(dataset(bad=None, steps=100).create_tuple_iterator()), 1):
            loss, grads = train_step(x, y)
            run.step(loss=loss, grads=grads)
            if i == at:
                command = [sys.executable, "-m", "mindwatch.cli", "rewind", str(run.run_dir), "--to", "20"]
                subprocess.run(command, capture_output=True, text=True, timeout=60, check=True)
                wait_for(lambda: read_request(run.run_dir), 30, "the request read")  # the next step boundary takes it
    return run


@pytest.mark.slow  # a training of 10 s or more here: `-m "not slow"` stays a quick loop
def test_the_runs_page_and_the_report_agree_on_the_best_loss_across_a_rewind(tmp_path: Path) -> None:
    """A person rewinds a run from step 70 back to step 20 and passes over 20 batches: the kept line ends before the abandoned
    branch's last steps, which hold the lowest losses written; neither the runs page (the status file's running best)
    nor the report counts them."""
    run = rewound_from_a_shell(tmp_path, at=70, skip=20)
    assert the_rewind(run.run_dir)["to_step"] == 20
    line: dict[int, float] = {}  # the line the training kept: a step going back drops every step from it on
    written = [r for r in raw_records(run.run_dir / "metrics.rank0.jsonl") if "loss" in r]
    for r in written:
        line = {s: v for s, v in line.items() if s < r["step"]}
        line[r["step"]] = r["loss"]
    best_step = min(line, key=line.__getitem__)
    assert min(r["loss"] for r in written) < line[best_step], "the abandoned branch went lower than the kept line"
    listed, full = list_run(run.run_dir), summarize_run(mindwatch.open_run(run.run_dir))
    assert listed.best_loss == full.best_loss == line[best_step] and full.best_loss_step == best_step
