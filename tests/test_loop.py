"""A training loop of your own (value_and_grad + ``ms.jit``), monitored with ``start_run`` / ``run.step``: real trainings on
CPU, each value checked against what the loop itself computed (the gradients it returned, the weights before and after)."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn
from mindspore.train import Model
from test_callback import GPT, gpt_dataset
from test_layers import by_layer, layer_of

import mindwatch
import mindwatch.mindspore as mw
from mindwatch.demo.model import LanguageModelLoss, TinyGPT
from mindwatch.demo.train import set_mode
from mindwatch.demo.tutorial_step import jit_train_step
from mindwatch.mindspore import TrainOneStepWithGradNorm

LR = 0.05


class TutorialLoop:
    """The MindSpore tutorial's loop: ``value_and_grad`` over ``optimizer.parameters``, a ``train_step`` under ``@ms.jit``."""

    def __init__(self, mode: str, seed: int = 7, lr: object = LR) -> None:
        set_mode(mode)
        ms.set_seed(seed)
        self.net = LanguageModelLoss(TinyGPT(GPT))
        self.optimizer = nn.SGD(self.net.trainable_params(), learning_rate=lr)
        self.train_step = jit_train_step(self.net, self.optimizer)

    def weights(self) -> dict[str, np.ndarray]:
        return {p.name: p.asnumpy().astype(np.float64) for p in self.net.trainable_params()}


def host_norm(grads) -> float:
    return math.sqrt(sum(float((g.asnumpy().astype(np.float64) ** 2).sum()) for g in grads))


@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_the_grad_norm_computed_inside_the_step_is_the_norm_of_its_gradients(tmp_path: Path, mode: str) -> None:
    """``mw.grad_norm(grads)`` inside the user's ``@ms.jit`` step, passed as ``run.step(grad_norm=...)``: the recorded
    norm is the gradients' own (numpy over the same step's gradients), and a NaN in it stops the loop."""
    set_mode(mode)
    ms.set_seed(7)
    net = LanguageModelLoss(TinyGPT(GPT))
    optimizer = nn.SGD(net.trainable_params(), learning_rate=LR)
    grad_fn = ms.value_and_grad(net, None, optimizer.parameters)

    @ms.jit
    def train_step(ids, targets):
        loss, grads = grad_fn(ids, targets)
        optimizer(grads)
        return loss, mw.grad_norm(grads), grads

    norms = {}
    config = {"save_dir": str(tmp_path), "project": "p", "interval": 60, "alerts": {"nonfinite": {"actions": ["stop"]}}}
    with mw.start_run(config, network=net, optimizer=optimizer, total_steps=6) as run:
        for step, (ids, targets) in enumerate(run.batches(gpt_dataset(6).create_tuple_iterator()), start=1):
            loss, norm, grads = train_step(ids, targets)
            norms[step] = host_norm(grads)
            run.step(loss=loss, grad_norm=norm if step < 5 else ms.Tensor(float("nan"), ms.float32))
            if run.should_stop:
                break
    r = mindwatch.open_run(run.run_dir)
    s = r.series("grad_norm")
    assert s.step.tolist() == [1, 2, 3, 4, 5]
    assert s.value[:4].tolist() == pytest.approx([norms[k] for k in range(1, 5)], rel=1e-4)  # a float32 sum in the graph
    assert math.isnan(s.value[4]) and r.state == "stopped" and step == 5


@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_the_tutorial_loop_records_its_own_loss_lr_grad_norm_and_layer_norms(tmp_path: Path, mode: str) -> None:
    loop = TutorialLoop(mode)
    names = [p.name for p in loop.optimizer.parameters]
    losses, norms, before, after, grads_at = {}, {}, {}, {}, {}
    config = {"save_dir": str(tmp_path), "project": "p", "interval": 60, "layers": {"every": 3, "histogram_every": None}}
    with mw.start_run(config, network=loop.net, optimizer=loop.optimizer, total_steps=8) as run:
        for step, (ids, targets) in enumerate(run.batches(gpt_dataset(8).create_tuple_iterator()), start=1):
            before[step] = loop.weights()
            loss, grads = loop.train_step(ids, targets)
            after[step] = loop.weights()
            losses[step], norms[step] = float(loss.asnumpy()), host_norm(grads)
            grads_at[step] = {n: g.asnumpy().astype(np.float64) for n, g in zip(names, grads, strict=True)}
            run.step(loss=loss, grads=grads)
    r = mindwatch.open_run(run.run_dir)
    assert r.state == "finished"
    for metric, want in (("loss", losses), ("grad_norm", norms), ("lr", dict.fromkeys(losses, LR))):
        s = r.series(metric)
        assert s.step.tolist() == list(range(1, 9)), metric
        assert s.value.tolist() == pytest.approx([want[k] for k in range(1, 9)], rel=1e-5), metric
    assert {"step_time", "data_time", "samples_per_second", "tokens_per_second"} <= set(r.metrics)
    layers = sorted(by_layer(before[1]))
    assert "blocks.0.attn.qkv" in layers
    for layer in layers:
        g, w, u = (r.series(f"{stat}/{layer}") for stat in ("grad_norm", "weight_norm", "update_ratio"))
        assert g.step.tolist() == [1, 3, 6], layer  # the first step, then every 3
        for i, step in enumerate(g.step.tolist()):
            mine = [n for n in names if layer_of(n) == layer]
            ref_g = math.sqrt(sum(float((grads_at[step][n] ** 2).sum()) for n in mine))
            ref_w = math.sqrt(sum(float((before[step][n] ** 2).sum()) for n in mine))
            ref_u = math.sqrt(sum(float(((after[step][n] - before[step][n]) ** 2).sum()) for n in mine)) / ref_w
            assert (g.value[i], w.value[i], u.value[i]) == pytest.approx((ref_g, ref_w, ref_u), rel=1e-3), (layer, step)


def test_a_nan_at_step_25_sets_should_stop_after_that_step(tmp_path: Path) -> None:
    loop = TutorialLoop("pynative")
    config = {"save_dir": str(tmp_path), "interval": 60, "alerts": {"nonfinite": {"actions": ["stop"]}}}
    seen = []
    run = mw.start_run(config, network=loop.net, optimizer=loop.optimizer)
    for step, (ids, targets) in enumerate(gpt_dataset(40).create_tuple_iterator(), start=1):
        loss, grads = loop.train_step(ids, targets)
        run.step(loss=float("nan") if step == 25 else loss, grads=grads)
        seen.append((step, run.should_stop))
        if run.should_stop:
            break
    run.finish()
    assert seen[-1] == (25, True) and not any(stop for _, stop in seen[:-1])
    r = mindwatch.open_run(run.run_dir)
    assert r.state == "stopped" and "loss is nan at step 25" in r.statuses[0]["reason"]
    assert [a["step"] for a in r.alerts if a["rule"] == "nonfinite"] == [25]


def test_an_exception_inside_the_run_ends_it_failed_with_the_error(tmp_path: Path) -> None:
    loop = TutorialLoop("pynative")
    config = {"save_dir": str(tmp_path), "interval": 60}
    raises = pytest.raises(RuntimeError, match="data source broke")
    with raises, mw.start_run(config, network=loop.net, optimizer=loop.optimizer) as run:
        for step, (ids, targets) in enumerate(gpt_dataset(6).create_tuple_iterator(), start=1):
            run.step(*loop.train_step(ids, targets))
            if step == 3:
                raise RuntimeError("data source broke")
    r = mindwatch.open_run(run.run_dir)
    assert r.state == "failed" and "RuntimeError: data source broke" in r.statuses[0]["error"]
    assert r.series("loss").step.tolist() == [1, 2, 3]


def test_a_loop_that_stops_calling_step_stalls_and_resumes(tmp_path: Path) -> None:
    loop = TutorialLoop("pynative")
    config = {"save_dir": str(tmp_path), "interval": 60, "flush_secs": 0.2, "alerts": {"stall_timeout": 1}}
    with mw.start_run(config, network=loop.net, optimizer=loop.optimizer) as run:
        for step, (ids, targets) in enumerate(gpt_dataset(6).create_tuple_iterator(), start=1):
            run.step(*loop.train_step(ids, targets))
            if step == 3:
                time.sleep(3)
    rules = [a["rule"] for a in mindwatch.open_run(run.run_dir).alerts]
    assert "stall" in rules and "resumed" in rules and rules.index("stall") < rules.index("resumed")


@pytest.mark.slow  # a training of 10 s or more: `-m "not slow"` stays a quick loop
def test_lr_backoff_and_checkpoint_in_a_loop(tmp_path: Path) -> None:
    """Both asked by a rule on the worker: the optimizer (inside the compiled step) uses half the rate from the next
    step, and the checkpoint holds the weights of the step it was taken at."""
    loop = TutorialLoop("pynative")
    config = {
        "save_dir": str(tmp_path),
        "interval": 60,
        "callback": {"params": {"warn_on_value": {"loss": 0.0}}},  # every step's loss exceeds 0: fires once (cooldown)
        "alerts": {"thresholds": {"actions": ["lr_backoff", "checkpoint"]}, "lr_backoff_factor": 0.5},
    }
    after, used = {}, {}
    names = [p.name for p in loop.optimizer.parameters]
    with mw.start_run(config, network=loop.net, optimizer=loop.optimizer) as run:
        for step, (ids, targets) in enumerate(gpt_dataset(30).create_tuple_iterator(), start=1):
            before = loop.weights()
            loss, grads = loop.train_step(ids, targets)
            after[step] = loop.weights()
            g = {n: t.asnumpy().astype(np.float64) for n, t in zip(names, grads, strict=True)}
            big = max(g, key=lambda n: np.abs(g[n]).sum())
            used[step] = float(((before[big] - after[step][big]) * g[big]).sum() / (g[big] ** 2).sum())  # plain SGD
            run.step(loss=loss, grads=grads)
            time.sleep(0.03)  # the rule runs on the worker: give it time to ask before the run ends
    r = mindwatch.open_run(run.run_dir)
    done = {a["actions"][0]: a for a in r.alerts if a["rule"] == "intervention"}
    k = done["lr_backoff"]["step"]
    assert 1 <= k < 30
    for step, lr in used.items():
        assert lr == pytest.approx(LR * (0.5 if step > k else 1.0), rel=1e-4), step
    recorded = dict(zip(r.series("lr").step.tolist(), r.series("lr").value.tolist(), strict=True))
    assert recorded[k] == pytest.approx(LR) and recorded[k + 1] == pytest.approx(LR / 2)
    ckpt = done["checkpoint"]
    saved = ms.load_checkpoint(ckpt["checkpoint"])
    for name, value in after[ckpt["step"]].items():
        np.testing.assert_allclose(saved[name].asnumpy(), value, rtol=1e-6, err_msg=name)
    assert "moments" not in saved and "learning_rate" in saved  # SGD's state with the weights


@pytest.mark.slow  # a training of 10 s or more: `-m "not slow"` stays a quick loop
@pytest.mark.parametrize("mode", ["graph", "pynative"])
def test_model_train_and_the_loop_record_the_same_names_and_values(tmp_path: Path, mode: str) -> None:
    config = {"interval": 60, "layers": {"every": 2, "histogram_every": None}}
    set_mode(mode)
    ms.set_seed(7)
    net = LanguageModelLoss(TinyGPT(GPT))
    cell = TrainOneStepWithGradNorm(net, nn.SGD(net.trainable_params(), learning_rate=LR), layer_stats=True)
    cb = mw.MonitorCallback({**config, "save_dir": str(tmp_path / "callback")})
    Model(cell).train(1, gpt_dataset(6), callbacks=[cb], dataset_sink_mode=False)
    by_callback = mindwatch.open_run(cb.run_dir)

    loop = TutorialLoop(mode)
    with mw.start_run({**config, "save_dir": str(tmp_path / "loop")}, network=loop.net, optimizer=loop.optimizer) as run:
        for ids, targets in run.batches(gpt_dataset(6).create_tuple_iterator()):
            run.step(*loop.train_step(ids, targets))
    by_loop = mindwatch.open_run(run.run_dir)

    assert set(by_loop.metrics) == set(by_callback.metrics)
    for metric in sorted(set(by_loop.metrics) - {"host_rss_gb"}):  # memory is sampled on the worker, by time
        a, b = by_callback.series(metric), by_loop.series(metric)
        assert a.step.tolist() == b.step.tolist(), metric
        if metric.split("/")[0] in ("loss", "lr", "grad_norm", "weight_norm", "update_ratio", "epoch"):
            assert b.value.tolist() == pytest.approx(a.value.tolist(), rel=1e-4), metric


def test_runs_one_after_another_in_one_process_each_get_their_own_directory(tmp_path: Path) -> None:
    loop = TutorialLoop("pynative")
    dirs = []
    for _ in range(2):
        with mw.start_run({"save_dir": str(tmp_path), "interval": 60}, network=loop.net, optimizer=loop.optimizer) as run:
            for ids, targets in run.batches(gpt_dataset(3).create_tuple_iterator()):
                run.step(*loop.train_step(ids, targets))
        dirs.append(run.run_dir)
    assert dirs[0] != dirs[1]
    for d in dirs:
        r = mindwatch.open_run(d)
        assert r.state == "finished" and r.series("loss").step.tolist() == [1, 2, 3]


def test_a_save_dir_that_cannot_be_written_falls_back_and_the_loop_trains_on(tmp_path: Path) -> None:
    loop = TutorialLoop("pynative")
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    run = mw.start_run({"save_dir": str(blocker / "x"), "interval": 60}, network=loop.net, optimizer=loop.optimizer)
    for ids, targets in gpt_dataset(2).create_tuple_iterator():
        run.step(*loop.train_step(ids, targets))
    run.finish()
    assert run.run_dir is not None and blocker not in run.run_dir.parents
    assert mindwatch.open_run(run.run_dir).series("loss").step.tolist() == [1, 2]


@pytest.mark.slow
def test_the_example_in_docs_training_loop_md_runs_as_written(tmp_path: Path) -> None:
    """A user copies the page's example into a file and runs it: it trains, records and says where."""
    import re
    import subprocess
    import sys

    page = (Path(__file__).resolve().parent.parent / "docs" / "training-loop.md").read_text()
    code = re.search(r"```python\n(.*?)```", page, re.S).group(1)
    (tmp_path / "train.py").write_text(code)
    out = subprocess.run(
        [sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300, env={**os.environ, "GLOG_v": "3"}
    )
    assert out.returncode == 0, out.stderr[-3000:]
    run_dir = Path(tmp_path, out.stdout.split("recorded into", 1)[1].strip())
    r = mindwatch.open_run(run_dir)
    assert r.state == "finished" and r.series("loss").step.tolist() == list(range(1, 101))
    assert "weight_norm/0" in r.metrics and "data_time" in r.metrics
