"""A batch size that changes during a real training: a memory alert shrinks it, 32 -> 16, from a step announced in
advance, and every batch the network receives before that step has 32 rows and every one from it on 16.

The rows are read from the step's own inputs (``train_dataset_element`` in a callback of the test; a loop's own batch),
independently of mindwatch. The pipeline runs ahead of the training (MindSpore's prefetch), so the change lands some
dozens of steps after the alert: the datasets are long enough for it to land well before they end.
"""

from __future__ import annotations

import json
import statistics
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
from mindspore.train import Callback, Model

import mindwatch
import mindwatch.mindspore as mw
from mindwatch.config import DynamicBatchSection
from mindwatch.demo.train import set_mode
from mindwatch.demo.tutorial_step import jit_train_step
from mindwatch.mindspore import MonitorCallback, TrainOneStepWithGradNorm
from mindwatch.mindspore.dynamic_batch import BatchChanges
from mindwatch.store.requests import RequestError, file_request, read_answer

pytestmark = pytest.mark.slow  # real trainings, each a few seconds

FEATURES = 16
ROWS = 32 * 160  # 160 batches of 32 without a change


def shrink_on_memory(tmp_path: Path, **extra) -> dict:
    """The memory rule fires at the first memory sample (a tiny fraction) and asks for shrink_batch."""
    return {"save_dir": str(tmp_path), "alerts": {"memory": {"fraction": 1e-9, "actions": ["shrink_batch"]}}, **extra}


@pytest.fixture
def short_prefetch():
    """``ds.config.set_prefetch_size(2)``: the pipeline runs 14 batches ahead, not 84, and a change lands sooner."""
    default = ds.config.get_prefetch_size()
    ds.config.set_prefetch_size(2)
    yield
    ds.config.set_prefetch_size(default)


def dataset(batch: mw.DynamicBatch, rows: int = ROWS) -> ds.Dataset:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, FEATURES)).astype(np.float32)
    y = x.sum(axis=1, keepdims=True).astype(np.float32)
    return ds.NumpySlicesDataset((x, y), ["x", "y"], shuffle=False).batch(batch_size=batch, drop_remainder=True)


def network() -> nn.Cell:
    ms.set_seed(0)
    return nn.SequentialCell(nn.Dense(FEATURES, 32), nn.ReLU(), nn.Dense(32, 1))


class Rows(Callback):
    """Independent of mindwatch: the rows of each step's batch, as the network received them, and the network's time."""

    def __init__(self, pause: float = 0.004, look_at: ds.Dataset | None = None) -> None:
        self.look_at = look_at
        self.rows: dict[int, int] = {}
        self.secs: dict[int, float] = {}
        self.pause = pause
        self._began = 0.0

    def on_train_step_begin(self, run_context) -> None:
        self._began = time.perf_counter()

    def on_train_step_end(self, run_context) -> None:
        cb = run_context.original_args()
        self.secs[cb.cur_step_num] = time.perf_counter() - self._began
        self.rows[cb.cur_step_num] = int(cb.train_dataset_element[0].shape[0])
        if cb.cur_step_num == 10 and self.look_at is not None:
            self.look_at.output_types()  # a getter runs a pipeline of its own (one batch): it is not trained
        time.sleep(self.pause)  # the worker thread samples memory and acts meanwhile (these steps take a millisecond)


def the_one_change(run: mindwatch.Run) -> dict:
    changes = [a for a in run.alerts if a["rule"] == "intervention" and "batch_size_after" in a]
    assert len(changes) == 1, f"exactly one batch size change: {changes}"
    (change,) = changes
    assert change["actions"] == ["shrink_batch"] and change["cause"] == "memory"
    assert (change["batch_size_before"], change["batch_size_after"]) == (32, 16)
    return change


def assert_rows_switch_at(rows: dict[int, int], from_step: int, before: int = 32, after: int = 16) -> None:
    assert from_step in rows, f"the change at step {from_step} landed within the training ({max(rows)} steps)"
    assert all(n == before for s, n in rows.items() if s < from_step), f"every batch before from_step has {before} rows"
    assert all(n == after for s, n in rows.items() if s >= from_step), f"every batch from from_step on has {after} rows"


def assert_recorded_sizes(run: mindwatch.Run, rows: dict[int, int]) -> None:
    def by_step(metric: str) -> dict[int, float]:
        series = run.series(metric)
        return dict(zip(series.step.tolist(), series.value.tolist(), strict=True))

    assert by_step("batch_size") == {s: float(n) for s, n in rows.items()}, "the recorded batch_size is every step's rows"
    per_second, times = by_step("samples_per_second"), by_step("step_time")
    for s in list(rows)[1:]:  # samples/s is this step's rows over its time
        assert per_second[s] == pytest.approx(rows[s] / times[s], rel=1e-6), s


@pytest.mark.parametrize(
    ("mode", "compile", "scale_lr"), [("graph", "once", "none"), ("graph", "per_size", "linear"), ("pynative", "once", "none")]
)
def test_a_memory_alert_shrinks_the_batch_from_one_announced_step(
    tmp_path: Path, mode: str, compile: str, scale_lr: str, request: pytest.FixtureRequest
) -> None:
    """GRAPH ``compile: once`` (the default): one graph for both sizes; ``per_size``: one graph per size (and the
    learning rate halves with the batch, ``scale_lr: linear``). PyNative steps take longer: a shorter prefetch, and a
    shorter dataset."""
    rows_in_all = ROWS
    if mode == "pynative":
        request.getfixturevalue("short_prefetch")
        rows_in_all = 32 * 50
    set_mode(mode)
    batch = mw.DynamicBatch(32, min=8)
    net = network()
    opt = nn.SGD(net.trainable_params(), learning_rate=0.01)
    train_net = TrainOneStepWithGradNorm(nn.WithLossCell(net, nn.MSELoss()), opt)
    data = dataset(batch, rows_in_all)
    rows = Rows(look_at=data)
    mon = MonitorCallback(shrink_on_memory(tmp_path, dynamic_batch={"compile": compile, "scale_lr": scale_lr}), batch=batch)
    Model(train_net).train(1, data, callbacks=[rows, mon], dataset_sink_mode=False)

    run = mindwatch.open_run(mon.run_dir)
    (memory,) = [a for a in run.alerts if a["rule"] == "memory"]
    change = the_one_change(run)
    from_step = change["from_step"]
    assert memory["step"] <= change["step"] < from_step, "announced at a step boundary, before it lands"
    assert_rows_switch_at(rows.rows, from_step)
    assert len(rows.rows) == from_step - 1 + (rows_in_all - 32 * (from_step - 1)) // 16, "every row trained once"
    assert_recorded_sizes(run, rows.rows)
    lr = run.series("lr")  # the rate each step used, as our train cell returns it
    halves = scale_lr == "linear"
    for step, value in zip(lr.step.tolist(), lr.value.tolist(), strict=True):
        assert value == pytest.approx(0.005 if halves and step >= from_step else 0.01), f"the lr step {step} used"
    if mode == "graph":
        assert len(train_net.compile_cache) == (1 if compile == "once" else 2), "one graph for both sizes, or one each"
        # no step after the change compiles again: their median is a fraction of step 1's, which compiled the graph (a
        # ratio to the steps before failed on a loaded machine: 1.9 ms, then 15 ms, with two graphs in the cache)
        compiling = rows.secs[1]
        after = statistics.median(rows.secs[s] for s in range(from_step, from_step + 40))
        assert after < compiling / 3, f"no recompiling step after the change: {after:.4f} s, against {compiling:.4f} s"


def test_a_loop_shrinks_the_batch_through_start_run(tmp_path: Path, short_prefetch) -> None:
    set_mode("pynative")
    batch = mw.DynamicBatch(32, min=8)
    net = network()
    opt = nn.SGD(net.trainable_params(), learning_rate=0.01)
    grad_fn = ms.value_and_grad(nn.WithLossCell(net, nn.MSELoss()), None, opt.parameters)

    @ms.jit(dynamic=1)
    def train_step(x, y):
        loss, grads = grad_fn(x, y)
        opt(grads)
        return loss, grads

    rows: dict[int, int] = {}
    with mw.start_run(shrink_on_memory(tmp_path), network=net, optimizer=opt, batch=batch) as run:
        for step, (x, y) in enumerate(run.batches(dataset(batch, 32 * 50).create_tuple_iterator()), start=1):
            rows[step] = int(x.shape[0])
            loss, grads = train_step(x, y)
            run.step(loss=loss, grads=grads)
            time.sleep(0.004)
    recorded = mindwatch.open_run(run.run_dir)
    change = the_one_change(recorded)
    assert_rows_switch_at(rows, change["from_step"])
    assert_recorded_sizes(recorded, rows)


def test_under_msrun_both_ranks_switch_at_one_step(tmp_path: Path) -> None:
    """Each rank's memory alert asks (they fold into one change); rank 1's pipeline prefetches less, so rank 0's runs
    further ahead: every rank still switches at one step, the latest of their first unmade batches."""
    from test_distributed import msrun_to_the_end, only_run_dir, raw_records

    config = {"alerts": {"memory": {"fraction": 1e-9, "actions": ["shrink_batch"]}}}
    msrun_to_the_end(
        tmp_path / "logs",
        *("--save-dir", str(tmp_path / "out"), "--steps", "120", "--dynamic-batch", "2"),
        *("--short-prefetch-rank", "1", "--rows", str(tmp_path / "rows")),
        *("--config", json.dumps(config)),
    )
    run_dir = only_run_dir(tmp_path / "out" / "dist")
    changes = [a for a in raw_records(run_dir / "alerts.jsonl") if a["rule"] == "intervention" and "batch_size_after" in a]
    assert sorted(a["rank"] for a in changes) == [0, 1], f"one change on each rank: {changes}"
    assert {(a["batch_size_before"], a["batch_size_after"]) for a in changes} == {(8, 4)}
    (from_step,) = {a["from_step"] for a in changes}
    first_unmade = changes[0]["first_unmade"]
    assert first_unmade[1] < first_unmade[0] == from_step, f"rank 0's pipeline ran further ahead: {first_unmade}"
    for r in (0, 1):
        rows = {int(s): n for s, n in json.loads((tmp_path / f"rows.rank{r}.json").read_text()).items()}
        assert from_step in rows, f"rank {r}: the change landed within the training"
        assert all(n == (8 if s < from_step else 4) for s, n in rows.items()), f"rank {r} switches at step {from_step}"
        recorded = {rec["step"]: rec["batch_size"] for rec in raw_records(run_dir / f"metrics.rank{r}.jsonl") if "step" in rec}
        assert recorded == rows, f"rank {r}: the recorded batch_size is every step's rows"


def test_a_person_grows_the_batch_of_a_live_run_within_its_bounds(tmp_path: Path) -> None:
    """``mindwatch batch RUN 64`` grows it from a step announced in advance; sizes out of bounds are refused."""
    from test_requests import ENV, mindwatch_cli, status

    script = Path(__file__).parent / "scripts" / "train_dynamic_batch.py"
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], env=ENV, stderr=subprocess.PIPE)
    run_dir = tmp_path / "live" / "batched"
    try:
        wait_for(lambda: status(run_dir).get("state") == "running" and (status(run_dir).get("last_step") or 0) >= 5, 120)
        out = mindwatch_cli("batch", str(run_dir), "128")
        assert out.returncode == 2 and "out of this run's bounds: its DynamicBatch takes 8 to 64" in out.stderr, out.stderr
        for size, why in (("4", "takes 8 to 64"), ("many", "a whole number >= 1, not 'many'")):
            with pytest.raises(RequestError, match=why):  # what the CLI prints, as the 128 above
                file_request(run_dir, "batch", size=size)

        out = mindwatch_cli("batch", str(run_dir), "64", "--reason", "the device idles", "--wait", "30")
        assert out.returncode == 0 and "taken at step" in out.stdout, out.stdout + out.stderr
        run = mindwatch.open_run(run_dir)
        (change,) = [a for a in run.alerts if a["rule"] == "intervention"]
        assert change["actions"] == ["resize_batch"] and (change["batch_size_before"], change["batch_size_after"]) == (32, 64)
        from_step = change["from_step"]
        wait_for(lambda: (status(run_dir).get("last_step") or 0) >= from_step + 5, 60)
        assert mindwatch_cli("stop", str(run_dir), "--wait", "30").returncode == 0
        proc.wait(60)
    finally:
        proc.kill()
    rows = {}
    for line in (tmp_path / "rows.jsonl").read_text().splitlines():
        step, n = json.loads(line)
        rows[step] = n
    assert_rows_switch_at(rows, from_step, before=32, after=64)
    run = mindwatch.open_run(run_dir)
    sizes = run.series("batch_size")
    assert dict(zip(sizes.step.tolist(), sizes.value.tolist(), strict=True)) == {s: float(n) for s, n in rows.items()}


def test_shrink_and_grow_keep_within_the_bounds_and_fold_until_a_change_lands(short_prefetch) -> None:
    """A real pipeline, no training: the pass that counts the dataset's batches is not counted, every batch has the
    size the schedule gives its step, requests before a change lands fold into it, and the factor stops at min, max."""
    batch = mw.DynamicBatch(32, min=8, max=64)
    data = ds.NumpySlicesDataset(np.arange(32 * 300, dtype=np.float32), ["x"], shuffle=False)
    data = data.batch(batch, drop_remainder=True)
    assert data.get_dataset_size() == 300  # runs the pipeline once, with every call of the batch size
    changes = BatchChanges(batch, DynamicBatchSection(), report=lambda *a: None, schedule=lambda *a: None)
    plan = [("shrink_batch", 16), ("shrink_batch", 8), ("shrink_batch", 8), ("grow_batch", 16), ("grow_batch", 32)]
    plan += [("grow_batch", 64), ("grow_batch", 64)]
    rows: dict[int, int] = {}
    landed: list[tuple[int, int]] = []
    for step, (x,) in enumerate(data.create_tuple_iterator(), start=1):
        rows[step] = int(x.shape[0])
        assert batch.took(step) == rows[step], f"step {step}: the batch has the size the schedule gives it"
        if plan and (not landed or step >= landed[-1][0]):  # the last change landed: the next request
            action, expected = plan.pop(0)
            done = changes.ask(action, {"rule": "test", "step": step}, step)
            assert done is not None and done["batch_size_after"] == expected, (action, done)
            if "from_step" not in done:
                assert done["message"].startswith(f"batch size stays {expected}")
                continue
            assert changes.ask(action, {"rule": "test", "step": step}, step) is None, "a second request folds into it"
            assert done["from_step"] > step
            landed.append((done["from_step"], expected))
    assert not plan and len(landed) == 5
    for from_step, size in landed:
        assert rows[from_step] == size != rows[from_step - 1]
    # a second training over the same dataset counts its steps from 1 again: every batch has the newest size
    for step, (x,) in enumerate(data.create_tuple_iterator(num_epochs=1), start=1):
        assert batch.took(step) == x.shape[0] == 64
        if step == 20:
            break


def test_a_loop_that_rewound_changes_the_batch_from_the_announced_step(tmp_path: Path, short_prefetch) -> None:
    """A rewind passes over ``skip`` batches the pipeline made: the change that follows still lands on the step it
    announces. The rows are the loop's own batches, numbered as mindwatch renumbers them after the rewind."""
    set_mode("pynative")
    batch = mw.DynamicBatch(32, min=8)
    net = network()
    opt = nn.SGD(net.trainable_params(), learning_rate=0.01)
    train_step = jit_train_step(nn.WithLossCell(net, nn.MSELoss()), opt)
    config = {"save_dir": str(tmp_path), "rewind": {"every": 10, "skip": 5}}
    sizes: list[int] = []  # every batch the loop trained on, in order
    rewind_request = resized = None

    def taken(request: dict | None) -> bool:
        return request is not None and (read_answer(run.run_dir, request["id"]) or {}).get("state") == "taken"

    with mw.start_run(config, network=net, optimizer=opt, batch=batch) as run:
        for x, y in run.batches(dataset(batch).create_tuple_iterator()):
            sizes.append(int(x.shape[0]))
            loss, grads = train_step(x, y)
            run.step(loss=loss, grads=grads)
            if len(sizes) == 25:
                rewind_request = file_request(run.run_dir, "rewind")
            if not resized and taken(rewind_request):
                resized = file_request(run.run_dir, "batch", size="16")  # once the rewind is done
            # While a request waits for the files path to carry it, the loop slows down so that it lands within the
            # dataset however loaded the machine is (a loaded one took 50 steps to see the rewind).
            waiting = (rewind_request and not resized) or (resized and not taken(resized))
            time.sleep(0.05 if waiting else 0.004)
    recorded = mindwatch.open_run(run.run_dir)
    interventions = [a for a in recorded.alerts if a["rule"] == "intervention"]
    (rewind,) = [a for a in interventions if a["actions"] == ["rewind"]]
    (change,) = [a for a in interventions if "batch_size_after" in a]
    assert rewind["skipped_batches"] == 5 and (change["batch_size_before"], change["batch_size_after"]) == (32, 16)
    back = rewind["step"] - rewind["to_step"]
    rows = {i if i <= rewind["step"] else i - back: n for i, n in enumerate(sizes, start=1)}
    assert_rows_switch_at(rows, change["from_step"])
