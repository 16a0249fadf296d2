"""Runs that restart: one run directory, one history (resume, rewind), and a monitor that never stops a training at start."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from conftest import kill_after_steps, start_printing_steps
from mindspore import dataset as ds
from mindspore import nn
from mindspore.train import Callback, Model

import mindwatch
from mindwatch.analysis.summary import summarize_run
from mindwatch.checks.evaluate import evaluate
from mindwatch.config import ConfigError, load_config
from mindwatch.mindspore import MonitorCallback
from mindwatch.report.export import metrics_table
from mindwatch.serve import api
from mindwatch.serve.views import RunView
from mindwatch.session import ResumeError, SaveDirUnavailable
from mindwatch.sinks.tensorboard import export_tensorboard

BATCHES = 20
SCRIPT = Path(__file__).parent / "scripts" / "resume_training.py"


def build(seed: int) -> tuple[Model, ds.Dataset]:
    """A small regression net and 20 batches of data drawn with ``seed``."""
    ms.set_seed(0)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2 * BATCHES, 4)).astype(np.float32)
    y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32)).astype(np.float32)
    data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(2)
    net = nn.Dense(4, 1)
    return Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.01)), data


class Observer(Callback):
    """An independent callback: the loss of each step, the global step counted from the epoch and its own count."""

    def __init__(self, pause: float = 0.0, echo: bool = False) -> None:
        self.loss: dict[int, float] = {}
        self.pause, self.echo, self.in_epoch = pause, echo, 0

    def on_train_epoch_begin(self, run_context) -> None:
        self.in_epoch = 0

    def on_train_step_end(self, run_context) -> None:
        cb = run_context.original_args()
        self.in_epoch += 1
        step = (cb.cur_epoch_num - 1) * BATCHES + self.in_epoch
        self.loss[step] = float(cb.net_outputs.asnumpy())
        if self.echo:
            print(f"STEP {step} {self.loss[step]!r}", flush=True)
        time.sleep(self.pause)


def attempt(save_dir: Path, *, initial_epoch: int = 0, epochs: int = 1, seed: int = 1, **config) -> Observer:
    model, data = build(seed)
    observer = Observer()
    cfg = {"save_dir": str(save_dir), "project": "p", "run_name": "r", "resume": "allow", **config}
    model.train(epochs, data, callbacks=[observer, MonitorCallback(cfg)], initial_epoch=initial_epoch, dataset_sink_mode=False)
    return observer


def dashboard_view(run_dir: Path) -> RunView:
    return RunView("p/r", run_dir, run_dir.parent.parent.resolve())


def every_reader(run_dir: Path, metric: str = "loss") -> dict[str, tuple[list[int], list[float]]]:
    """(steps, values) of ``metric`` on rank 0 as each reader shows them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = mindwatch.open_run(run_dir)
    s = run.series(metric)
    out = {"open_run": (s.step.tolist(), s.value.tolist())}
    pts = api.thinned_series(dashboard_view(run_dir), metric, points=100_000)["points"]
    out["dashboard"] = ([int(p[0]) for p in pts], [p[1] for p in pts])
    table = metrics_table(run_dir)
    keep = ~np.isnan(table[metric])
    out["export"] = (table["step"][keep].tolist(), table[metric][keep].tolist())
    tb = export_tensorboard(run_dir, run_dir.parent.parent / f"tb_{time.time_ns()}")
    acc = EventAccumulator(str(tb / "rank0"))
    acc.Reload()
    events = acc.Scalars(metric)
    out["tensorboard"] = ([e.step for e in events], [float(np.float32(e.value)) for e in events])
    return out


def assert_readers_show(run_dir: Path, expected: dict[int, float]) -> None:
    steps = sorted(expected)
    for reader, (got_steps, got_values) in every_reader(run_dir).items():
        assert got_steps == steps, f"{reader}: steps {got_steps}"
        rtol = 1e-6 if reader == "tensorboard" else 1e-12  # TensorBoard keeps float32
        np.testing.assert_allclose(got_values, [expected[s] for s in steps], rtol=rtol, err_msg=reader)
    run = mindwatch.open_run(run_dir)
    assert evaluate(run, f"count(loss) == {len(steps)}").passed
    assert summarize_run(run).records >= len(steps)


def test_a_resumed_training_continues_the_run_from_step_21(tmp_path: Path) -> None:
    first = attempt(tmp_path)
    second = attempt(tmp_path, initial_epoch=1, epochs=2)
    assert sorted(second.loss) == list(range(21, 41))
    assert [p.name for p in (tmp_path / "p").iterdir() if not p.name.startswith(".")] == ["r"]
    run_dir = tmp_path / "p" / "r"
    assert_readers_show(run_dir, {**first.loss, **second.loss})
    run = mindwatch.open_run(run_dir)
    assert run.state == "finished"
    attempts = run.meta["attempts"]
    assert [(a["attempt"], a["first_step"], a["last_step"], a["end"]) for a in attempts] == [
        (1, 1, 20, "finished"),
        (2, 21, 40, "finished"),
    ]
    assert all(a["pid"] == os.getpid() and a["host"] and a["command"] for a in attempts)
    assert attempts[0]["ended_at"] <= attempts[1]["started_at"]
    summary = summarize_run(run)
    assert summary.attempts == 2 and summary.time_lost == pytest.approx(attempts[1]["started_at"] - attempts[0]["ended_at"])
    assert api.run_info(dashboard_view(run_dir))["attempts"] == attempts


def test_a_rewind_shows_each_step_once_with_the_newest_values(tmp_path: Path) -> None:
    first = attempt(tmp_path)
    second = attempt(tmp_path, initial_epoch=1, epochs=2)
    third = attempt(tmp_path, seed=7)  # from epoch 0 again, other data: steps 1..20 are rewritten
    assert sorted(third.loss) == list(range(1, 21)) and third.loss[5] != first.loss[5]
    run_dir = tmp_path / "p" / "r"
    assert_readers_show(run_dir, {**first.loss, **second.loss, **third.loss})
    lines = (run_dir / "metrics.rank0.jsonl").read_text().splitlines()
    assert len([ln for ln in lines if '"loss"' in ln]) == 60  # the older values stay in the file
    run = mindwatch.open_run(run_dir)
    assert [a["first_step"] for a in run.meta["attempts"]] == [1, 21, 1]


def test_alerts_of_rewound_steps_stay_marked_as_an_earlier_attempt(tmp_path: Path) -> None:
    config = {"callback": {"params": {"warn_on_value": {"loss": 0.0}}}}  # every loss is above 0: alerts in both attempts
    attempt(tmp_path, **config)
    attempt(tmp_path, seed=3, **config)
    run = mindwatch.open_run(tmp_path / "p" / "r")
    assert run.alerts, "warn_on_value raised no alert"
    by_attempt = {a["attempt"] for a in run.alerts}
    assert by_attempt == {1, 2}
    assert all(a["rewound"] == (a["attempt"] == 1) for a in run.alerts)


def test_resume_must_fails_when_the_run_is_missing_and_never_makes_a_new_one(tmp_path: Path) -> None:
    with pytest.raises(ResumeError, match="no run 'r'"):
        attempt(tmp_path, resume="must")
    attempt(tmp_path)
    attempt(tmp_path, resume="must", initial_epoch=1, epochs=2)
    attempt(tmp_path, resume="never")
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == ["r", "r_2"]
    assert len(mindwatch.open_run(tmp_path / "p" / "r").meta["attempts"]) == 2


def test_a_killed_attempt_ends_as_killed_and_the_next_continues(tmp_path: Path) -> None:
    env = {**os.environ, "GLOG_v": "3", "PYTHONUNBUFFERED": "1"}
    seen: dict[int, float] = {}
    proc, reader = start_printing_steps([sys.executable, str(SCRIPT), str(tmp_path), "0", "2", "1", "0.1"], seen, env=env)
    kill_after_steps(proc, reader, seen, 25, then=0.5)  # flush_secs 0.2: steps up to here are on disk
    second = attempt(tmp_path, initial_epoch=1, epochs=2, flush_secs=0.2)
    run = mindwatch.open_run(tmp_path / "p" / "r")
    first, again = run.meta["attempts"]
    assert first["end"] == "killed" and first["pid"] == proc.pid and first["ended_at"] <= again["started_at"]
    assert again["end"] == "finished" and again["first_step"] == 21 and run.state == "finished"
    expected = {**{s: v for s, v in seen.items() if s <= 20}, **second.loss}
    s = run.series("loss")
    assert s.step.tolist()[:5] == [1, 2, 3, 4, 5] and s.step.tolist()[-20:] == list(range(21, 41))
    assert len(set(s.step.tolist())) == len(s)
    got = dict(zip(s.step.tolist(), s.value.tolist(), strict=True))
    assert all(got[k] == pytest.approx(v, rel=1e-12) for k, v in expected.items() if k in got)
    assert all(got[k] == pytest.approx(second.loss[k], rel=1e-12) for k in range(21, 41))


# -- never take training down at start ------------------------------------------------------------------


@pytest.fixture
def read_only_dir(tmp_path: Path):
    ro = tmp_path / "ro"
    ro.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro", "tmpfs", str(ro)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here (needs root and mount): {done.stderr.strip()}")
    try:
        yield ro
    finally:
        subprocess.run(["umount", str(ro)], check=False)


def test_a_read_only_save_dir_warns_and_records_into_a_temporary_folder(read_only_dir: Path, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="mindwatch"):
        observer = attempt(read_only_dir / "out", run_name="ro_run", epochs=1)
    assert sorted(observer.loss) == list(range(1, 21))  # the training finished
    warning = next(r.getMessage() for r in caplog.records if "cannot write in save_dir" in r.getMessage())
    assert str(read_only_dir / "out") in warning and "Read-only file system" in warning
    fallback = Path(warning.split("recording into ")[1].split(" instead")[0])
    run = mindwatch.open_run(fallback / "p" / "ro_run")
    assert run.state == "finished" and run.series("loss").step.tolist() == list(range(1, 21))


def test_strict_makes_a_read_only_save_dir_an_error(read_only_dir: Path) -> None:
    with pytest.raises(SaveDirUnavailable, match=f"cannot write in save_dir {read_only_dir}.*strict"):
        attempt(read_only_dir, strict=True)


@pytest.mark.parametrize("key", ["project", "run_name"])
@pytest.mark.parametrize("bad", ["a\0b", "a/b", "..", "", "  "])
def test_a_name_that_is_no_folder_name_is_a_config_error(key: str, bad: str) -> None:
    with pytest.raises(ConfigError, match=f"monitor_config.{key}"):
        load_config({key: bad})


def test_resume_and_strict_defaults() -> None:
    cfg = load_config({})
    assert (cfg.resume, cfg.strict) == ("allow", False)
    assert json.loads(json.dumps(cfg.snapshot()))["resume"] == "allow"
