"""The recorded ``lr`` is the rate the optimizer used: its schedule at the optimizer's own ``global_step`` as the step
ran, not at mindwatch's step count. The two part after a skipped step (the optimizer did not run, its ``global_step``
stayed) and after a restart that did not restore ``global_step``.

Real trainings on CPU, the MindSpore tutorial's loop (``value_and_grad``, an ``@ms.jit`` step in a PyNative context)
and ``Model.train``; the test reads ``optimizer.global_step`` itself before each step and evaluates the schedule with
numpy, independently of mindwatch.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mindspore import dataset as ds
from mindspore import nn, ops
from mindspore.nn.learning_rate_schedule import LearningRateSchedule
from mindspore.nn.wrap.loss_scale import _ascend_grad_overflow
from mindspore.train import Callback, Model

import mindwatch
import mindwatch.mindspore as mw
from mindwatch.mindspore import MonitorCallback, TrainOneStepWithGradNorm

pytestmark = pytest.mark.slow  # real trainings, each a few seconds

STEPS, BAD, BATCH = 100, 60, 8
PEAK, WARMUP = 0.01, 10
TINY = PEAK * 1e-6  # float32 near the end of the cosine


class WarmupCosine(LearningRateSchedule):
    """Linear warmup to ``PEAK`` over ``WARMUP`` steps, then a cosine to 0 at ``total``."""

    def __init__(self, total: int) -> None:
        super().__init__()
        self.total = total

    def construct(self, global_step):
        step = ops.cast(global_step, ms.float32)
        warm = PEAK * (step + 1.0) / WARMUP
        progress = ops.clamp((step - WARMUP) / (self.total - WARMUP), 0.0, 1.0)
        return ops.select(step < WARMUP, warm, 0.5 * PEAK * (1.0 + ops.cos(math.pi * progress)))


def warmup_cosine(global_step: int, total: int) -> float:
    """The same schedule in numpy: what the optimizer used at ``global_step``."""
    if global_step < WARMUP:
        return PEAK * (global_step + 1) / WARMUP
    progress = min(max((global_step - WARMUP) / (total - WARMUP), 0.0), 1.0)
    return 0.5 * PEAK * (1.0 + math.cos(math.pi * progress))


def global_step(optimizer: nn.Optimizer) -> int:
    return int(optimizer.global_step.asnumpy().reshape(-1)[0])  # int() copies: asnumpy may share the memory


def batches(steps: int = STEPS, bad: int | None = BAD, seed: int = 3) -> list[tuple[ms.Tensor, ms.Tensor]]:
    """Regression batches; the inputs of step ``bad`` (1-based) are x 1000."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(8, 1))
    out = []
    for step in range(1, steps + 1):
        x = rng.normal(size=(BATCH, 8)).astype(np.float32)
        y = (x @ w).astype(np.float32)
        out.append((ms.Tensor(x * (1000.0 if step == bad else 1.0)), ms.Tensor(y)))
    return out


def mlp() -> nn.Cell:
    ms.set_seed(0)
    return nn.SequentialCell(nn.Dense(8, 16), nn.ReLU(), nn.Dense(16, 1))


class Loop:
    """The tutorial's loop with ``mw.SkipStep`` in its jit step in place of ``optimizer(grads)``."""

    def __init__(self, optimizer_kind: str = "adamw", learning_rate: object = None) -> None:
        ms.set_context(mode=ms.PYNATIVE_MODE)
        self.net = mlp()
        lr = WarmupCosine(STEPS) if learning_rate is None else learning_rate
        params = self.net.trainable_params()
        self.optimizer = nn.AdamWeightDecay(params, learning_rate=lr) if optimizer_kind == "adamw" else nn.Adam(params, lr)
        loss_fn = nn.MSELoss()

        def forward(x, y):
            return loss_fn(self.net(x), y)

        self.grad_fn = ms.value_and_grad(forward, None, self.optimizer.parameters)

    def train(self, run: mw.Run, data: list[tuple[ms.Tensor, ms.Tensor]], first: int = 1) -> dict[int, int]:
        """Train on ``data`` with ``run`` from step ``first``; the optimizer's global_step read before each step."""
        skip_step = mw.SkipStep(self.optimizer, run=run)
        grad_fn = self.grad_fn

        @ms.jit
        def train_step(x, y):
            loss, grads = grad_fn(x, y)
            return loss, grads, skip_step(grads)

        before = {}
        for step, (x, y) in enumerate(run.batches(data), start=first):
            before[step] = global_step(self.optimizer)
            loss, grads, skipped = train_step(x, y)
            run.step(loss=loss, grads=grads, skipped=skipped)
        return before


def recorded_lr(run_dir: Path) -> dict[int, float]:
    s = mindwatch.open_run(run_dir).series("lr")
    return dict(zip(s.step.tolist(), s.value.tolist(), strict=True))


@pytest.mark.parametrize("interval", [1, 7])
def test_the_recorded_lr_follows_the_optimizers_global_step_across_a_skipped_step(tmp_path: Path, interval: int) -> None:
    """A bad batch at step 60 that SkipStep skips: global_step stays, and the rate of every later step is the schedule
    one step behind mindwatch's count. With ``step_interval: 7`` step 60 is recorded only because it was skipped."""
    loop = Loop()
    config = {"save_dir": str(tmp_path), "step_interval": interval, "skip_steps": {"enabled": True}}
    with mw.start_run(config, network=loop.net, optimizer=loop.optimizer, total_steps=STEPS) as run:
        before = loop.train(run, batches())

    opened = mindwatch.open_run(run.run_dir)
    skipped = opened.series("skipped")
    assert list(skipped.step[skipped.value == 1]) == [BAD]
    assert before[BAD + 1] == before[BAD] == BAD - 1 and global_step(loop.optimizer) == STEPS - 1  # one update skipped
    lr = recorded_lr(run.run_dir)
    if interval == 1:
        assert sorted(lr) == list(range(1, STEPS + 1))
    else:
        assert BAD in lr and BAD - 1 not in lr and BAD + 1 not in lr  # recorded only because it was skipped
    for step, value in lr.items():
        assert value == pytest.approx(warmup_cosine(before[step], STEPS), rel=1e-5, abs=TINY), step
    # mindwatch's step count would be off after the skip: the test tells the two apart
    assert warmup_cosine(BAD + 10, STEPS) != pytest.approx(warmup_cosine(BAD + 9, STEPS), rel=1e-3)


def test_a_restart_that_did_not_restore_global_step_records_the_rate_the_fresh_optimizer_used(tmp_path: Path) -> None:
    """The run resumes at step 31 with a new optimizer whose global_step starts at 0 again: the rate is the warmup's."""
    config = {"save_dir": str(tmp_path), "run_name": "resumed", "resume": "allow", "skip_steps": {"enabled": True}}
    first = Loop("adam")
    with mw.start_run(config, network=first.net, optimizer=first.optimizer) as run:
        first.train(run, batches(30, bad=None))
    again = Loop("adam")
    with mw.start_run(config, network=again.net, optimizer=again.optimizer) as run:
        before = again.train(run, batches(20, bad=None, seed=4), first=31)
    assert sorted(before) == list(range(31, 51)) and before[31] == 0
    lr = recorded_lr(run.run_dir)
    for step in range(31, 51):
        assert lr[step] == pytest.approx(warmup_cosine(before[step], STEPS), rel=1e-5, abs=TINY), step


def test_a_global_step_restored_after_start_run_is_the_one_the_first_step_used(tmp_path: Path) -> None:
    """The checkpoint is loaded between ``start_run`` and the first step: the first step's rate is read after it ran."""
    loop = Loop()
    config = {"save_dir": str(tmp_path), "skip_steps": {"enabled": True}}
    with mw.start_run(config, network=loop.net, optimizer=loop.optimizer) as run:
        ms.load_param_into_net(loop.optimizer, {"global_step": ms.Parameter(ms.Tensor([40], ms.int32), name="global_step")})
        before = loop.train(run, batches(5, bad=None))
    assert before == {1: 40, 2: 41, 3: 42, 4: 43, 5: 44}
    lr = recorded_lr(run.run_dir)
    assert lr == pytest.approx({s: warmup_cosine(g, STEPS) for s, g in before.items()}, rel=1e-5)


def test_lr_backoff_scales_the_schedule_and_the_recorded_lr_shows_it(tmp_path: Path) -> None:
    """A rule's lr_backoff halves the (wrapped) schedule from the next step: the rate the optimizer computes before
    each step (``get_lr()`` at its global_step, read by the test) is what is recorded, before and after it."""
    loop = Loop()
    config = {
        "save_dir": str(tmp_path),
        "skip_steps": {"enabled": True},
        "callback": {"params": {"warn_on_value": {"loss": 0.0}}},  # every step's loss exceeds 0: fires once (cooldown)
        "alerts": {"thresholds": {"actions": ["lr_backoff"]}, "lr_backoff_factor": 0.5},
    }
    rates = {}
    with mw.start_run(config, network=loop.net, optimizer=loop.optimizer) as run:
        skip_step = mw.SkipStep(loop.optimizer, run=run)
        grad_fn = loop.grad_fn

        @ms.jit
        def train_step(x, y):
            loss, grads = grad_fn(x, y)
            return loss, grads, skip_step(grads)

        for step, (x, y) in enumerate(run.batches(batches(30, bad=None)), start=1):
            rates[step] = float(loop.optimizer.get_lr().asnumpy())
            loss, grads, skipped = train_step(x, y)
            run.step(loss=loss, grads=grads, skipped=skipped)
            time.sleep(0.03)  # the rule runs on the worker: give it time to ask before the run ends
    opened = mindwatch.open_run(run.run_dir)
    (done,) = [a for a in opened.alerts if a["rule"] == "intervention"]
    k = done["step"]
    assert 1 <= k < 30 and done["lr_after"] == pytest.approx(done["lr_before"] / 2) == pytest.approx(rates[k + 1])
    assert rates[k + 1] == pytest.approx(warmup_cosine(k, STEPS) / 2, rel=1e-5)  # global_step k: no step was skipped
    assert recorded_lr(run.run_dir) == pytest.approx(rates, rel=1e-6)


@pytest.mark.parametrize("kind", ["fixed", "list"])
def test_fixed_rates_and_per_step_lists_are_the_ones_used_across_a_skipped_step(tmp_path: Path, kind: str) -> None:
    rates = [0.001 * (1 + i % 17) for i in range(STEPS)]
    loop = Loop(learning_rate=0.004 if kind == "fixed" else rates)
    with mw.start_run({"save_dir": str(tmp_path), "skip_steps": {"enabled": True}}, optimizer=loop.optimizer) as run:
        before = loop.train(run, batches())
    assert before[BAD + 1] == before[BAD]
    lr = recorded_lr(run.run_dir)
    for step, value in lr.items():
        assert value == pytest.approx(0.004 if kind == "fixed" else rates[before[step]], rel=1e-6), step


class GlobalSteps(Callback):
    """The optimizer's global_step before every step (independent of mindwatch)."""

    def __init__(self, optimizer: nn.Optimizer) -> None:
        self.optimizer = optimizer
        self.before: dict[int, int] = {}

    def on_train_step_begin(self, run_context) -> None:
        self.before[run_context.original_args().cur_step_num] = global_step(self.optimizer)


MODEL_BAD = 30  # after skip_steps' warmup of 20


def dataset(bad: float) -> ds.Dataset:
    x, y = zip(*((x.asnumpy(), y.asnumpy()) for x, y in batches(40, bad=None)), strict=True)
    xs, ys = np.concatenate(x), np.concatenate(y)
    xs[(MODEL_BAD - 1) * BATCH : MODEL_BAD * BATCH] *= bad
    return ds.NumpySlicesDataset({"x": xs, "y": ys}, shuffle=False).batch(BATCH)


class CpuLossScaleCell(nn.TrainOneStepWithLossScaleCell):
    """MindSpore's loss-scale cell with the overflow check CPU has (its default calls an Ascend-only op)."""

    def get_overflow_status(self, status, compute_output):
        return self._get_distributed_overflow_status_on_infnan_mode(_ascend_grad_overflow, compute_output)


def test_model_train_with_an_overflow_records_the_rate_at_global_step(tmp_path: Path) -> None:
    """MindSpore's own loss-scale cell skips the update of an overflowing step (inputs x 1e30 at step 30): the
    callback reads the rate at global_step for every later step (the cell returns no lr of its own)."""
    ms.set_context(mode=ms.GRAPH_MODE)
    net = mlp()
    opt = nn.AdamWeightDecay(net.trainable_params(), learning_rate=WarmupCosine(40))
    steps = GlobalSteps(opt)
    mon = MonitorCallback({"save_dir": str(tmp_path)})
    scale = nn.FixedLossScaleUpdateCell(1.0)
    model = Model(CpuLossScaleCell(nn.WithLossCell(net, nn.MSELoss()), opt, scale_sense=scale))
    model.train(1, dataset(1e30), callbacks=[steps, mon], dataset_sink_mode=False)
    opened = mindwatch.open_run(mon.run_dir)
    overflow = opened.series("overflow")
    assert list(overflow.step[overflow.value == 1]) == [MODEL_BAD]
    assert steps.before[MODEL_BAD + 1] == steps.before[MODEL_BAD] == MODEL_BAD - 1  # the update was not applied
    lr = recorded_lr(mon.run_dir)
    assert sorted(lr) == list(range(1, 41))
    for step, value in lr.items():
        assert value == pytest.approx(warmup_cosine(steps.before[step], 40), rel=1e-5, abs=TINY), step


def test_model_train_with_skip_steps_records_the_rate_of_global_step(tmp_path: Path) -> None:
    """Our train cell skips step 30's update and returns the rate it read in the graph before the update."""
    ms.set_context(mode=ms.GRAPH_MODE)
    net = mlp()
    opt = nn.AdamWeightDecay(net.trainable_params(), learning_rate=WarmupCosine(40))
    steps = GlobalSteps(opt)
    mon = MonitorCallback({"save_dir": str(tmp_path), "skip_steps": {"enabled": True}})
    Model(TrainOneStepWithGradNorm(nn.WithLossCell(net, nn.MSELoss()), opt)).train(
        1, dataset(1000.0), callbacks=[steps, mon], dataset_sink_mode=False
    )
    opened = mindwatch.open_run(mon.run_dir)
    skipped = opened.series("skipped")
    assert list(skipped.step[skipped.value == 1]) == [MODEL_BAD]
    assert steps.before[MODEL_BAD + 1] == steps.before[MODEL_BAD] == MODEL_BAD - 1  # the update was not applied
    lr = recorded_lr(mon.run_dir)
    for step, value in lr.items():
        assert value == pytest.approx(warmup_cosine(steps.before[step], 40), rel=1e-5, abs=TINY), step
