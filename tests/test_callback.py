"""The callback on real MindSpore trainings (CPU): what it records equals what the training did."""

from __future__ import annotations

import math
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mindspore import dataset as ds
from mindspore import nn
from mindspore.train import Callback, Model

import mindwatch
from mindwatch.demo.corpus import ByteWindows, stdlib_corpus
from mindwatch.demo.model import GPTConfig, LanguageModelLoss, TinyGPT
from mindwatch.demo.train import lr_schedule, set_mode
from mindwatch.mindspore import MonitorCallback, TrainOneStepWithGradNorm, TrainOneStepWithGradNormAndLossScale
from mindwatch.mindspore.outputs import decode_outputs, output_layout

STEPS, BATCH, SEQ = 8, 4, 16
GPT = GPTConfig(seq_length=SEQ, layers=1, d_model=32, heads=2)


def gpt_dataset(steps: int = STEPS) -> ds.Dataset:
    windows = ByteWindows(stdlib_corpus(200_000), SEQ, steps * BATCH, seed=1)
    return ds.GeneratorDataset(windows, ["ids", "targets"], shuffle=False).batch(BATCH, drop_remainder=True)


class PlainObserver(Callback):
    """An independent callback: the loss as MindSpore hands it over, per step."""

    def __init__(self) -> None:
        self.loss: dict[int, float] = {}

    def on_train_step_end(self, run_context) -> None:
        cb = run_context.original_args()
        out = cb.net_outputs
        self.loss[cb.cur_step_num] = float((out[0] if isinstance(out, tuple) else out).asnumpy())


class HostGradNorm(Callback):
    """Before chosen steps: the same weights and batch through ``TrainOneStepCell(return_grad=True)``, norm on the host."""

    def __init__(self, trained: nn.Cell, steps: set[int]) -> None:
        ms.set_seed(123)
        self.trained = trained
        self.ref_net = LanguageModelLoss(TinyGPT(GPT))
        sgd = nn.SGD(self.ref_net.trainable_params(), learning_rate=0.0)  # no update: only the gradients matter
        self.ref = nn.TrainOneStepCell(self.ref_net, sgd, return_grad=True)
        self.steps = steps
        self.norms: dict[int, float] = {}

    def on_train_step_begin(self, run_context) -> None:
        cb = run_context.original_args()
        if cb.cur_step_num not in self.steps:
            return
        src = {p.name: p for p in self.trained.trainable_params()}
        for p in self.ref_net.trainable_params():
            p.set_data(ms.Tensor(src[p.name].asnumpy()))
        _, grads = self.ref(*cb.train_dataset_element)
        self.norms[cb.cur_step_num] = math.sqrt(sum(float((g.asnumpy().astype(np.float64) ** 2).sum()) for g in grads.values()))


@pytest.mark.slow  # a training of 10 s or more: `-m "not slow"` stays a quick loop
@pytest.mark.parametrize("mode", ["graph", "pynative"])
def test_records_what_the_training_did(mode: str, tmp_path: Path) -> None:
    set_mode(mode)
    ms.set_seed(0)
    loss_net = LanguageModelLoss(TinyGPT(GPT))
    schedule = lr_schedule(STEPS, 1e-2, warmup=3)
    opt = nn.AdamWeightDecay(loss_net.trainable_params(), learning_rate=schedule)
    model = Model(TrainOneStepWithGradNorm(loss_net, opt, max_grad_norm=0.5))
    observer, host_norm = PlainObserver(), HostGradNorm(loss_net, {1, 4, STEPS})
    monitor = MonitorCallback(
        {
            "save_dir": str(tmp_path),
            "project": "t",
            "metrics": ["loss", "lr", "grad_norm", "step_time", "data_time", "throughput", "memory_usage", "attention_entropy"],
            "attention_entropy": {"every": 2},
            "tags": ["unit"],
        }
    )
    model.train(1, gpt_dataset(), callbacks=[host_norm, observer, monitor], dataset_sink_mode=False)

    run = mindwatch.open_run(monitor.run_dir)
    assert run.state == "finished" and run.ranks == [0]
    loss = run.series("loss")
    assert loss.step.tolist() == list(range(1, STEPS + 1))
    assert loss.value.tolist() == [observer.loss[s] for s in range(1, STEPS + 1)]  # equal, step by step
    gn = run.series("grad_norm")
    for step, expected in host_norm.norms.items():
        got = gn.value[gn.step.tolist().index(step)]
        assert abs(got - expected) / expected < 1e-4, (step, got, expected)
    assert max(host_norm.norms.values()) > 0.5  # so the norm we compared is the one before clipping
    lr = run.series("lr")
    np.testing.assert_allclose(lr.value, [schedule[s - 1] for s in lr.step], rtol=1e-6)
    for name in ("step_time", "data_time", "samples_per_second", "tokens_per_second"):
        assert len(run.series(name)) == STEPS and np.all(run.series(name).value >= 0), name
    np.testing.assert_allclose(run.series("tokens_per_second").value, run.series("samples_per_second").value * SEQ)
    assert np.all(run.series("data_time").value <= run.series("step_time").value)
    assert run.series("host_rss_gb").value[0] > 0.05
    assert "device_mem_gb" not in run.metrics  # absent on CPU, not faked
    assert run.series("epoch").value.tolist() == [1.0] * STEPS
    # the demo model's attention has AttentionStats: its entropy comes through the graph, in both modes
    entropy = [m for m in run.metrics if m.startswith("attention_entropy/")]
    assert entropy == ["attention_entropy/blocks.0.attn"]
    ent = run.series(entropy[0])
    assert ent.step.tolist() == [2, 4, 6, 8]
    assert np.all((ent.value > 0) & (ent.value <= math.log(SEQ)))
    assert run.meta["config"]["tags"] == ["unit"] and run.meta["versions"]["mindspore"] == ms.__version__
    assert run.meta["world_size"] == 1


class HookOnlyAttention(nn.Cell):
    """An attention-like cell with a softmax and no AttentionStats: only PyNative hooks could see it."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.SequentialCell(nn.Dense(4, 4), nn.Softmax(axis=-1))
        self.out = nn.Dense(4, 1)

    def construct(self, x):
        return self.out(self.attn(x))


def test_graph_mode_warns_once_about_attention_entropy(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    set_mode("graph")
    net = HookOnlyAttention()
    loss_net = nn.WithLossCell(net, nn.MSELoss())
    model = Model(TrainOneStepWithGradNorm(loss_net, nn.Adam(loss_net.trainable_params(), 1e-3)))
    cb = MonitorCallback({"save_dir": str(tmp_path), "metrics": ["loss", "attention_entropy"]})
    model.train(1, regression_data(3), callbacks=[cb], dataset_sink_mode=False)
    warnings = [r.getMessage() for r in caplog.records if "attention_entropy is off in GRAPH mode" in r.getMessage()]
    assert len(warnings) == 1 and "PyNative" in warnings[0] and "AttentionStats" in warnings[0]


def regression_data(steps: int, batch: int = 4) -> ds.Dataset:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(steps * batch, 4)).astype(np.float32)
    y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32)).astype(np.float32)
    return ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(batch)


@pytest.mark.parametrize("kind", ["fixed", "list", "schedule"])
@pytest.mark.parametrize("sink", [False, True])
def test_lr_of_a_plain_model_is_the_rate_the_step_used(kind: str, sink: bool, tmp_path: Path) -> None:
    set_mode("graph")
    steps = 6
    net = nn.Dense(4, 1)
    lr_values = [0.01 * (i + 1) for i in range(steps)]
    lr = {"fixed": 0.05, "list": lr_values, "schedule": nn.PolynomialDecayLR(0.1, 0.01, decay_steps=steps, power=1.0)}[kind]
    opt = nn.Momentum(net.trainable_params(), learning_rate=lr, momentum=0.9)
    observer = PlainObserver()
    cb = MonitorCallback({"save_dir": str(tmp_path)})
    Model(net, nn.MSELoss(), opt).train(1, regression_data(steps), callbacks=[observer, cb], dataset_sink_mode=sink)
    run = mindwatch.open_run(cb.run_dir)
    got = run.series("lr")
    assert got.step.tolist() == list(range(1, steps + 1))
    if kind == "fixed":
        expected = [0.05] * steps
    elif kind == "list":
        expected = lr_values
    else:
        expected = [float(lr(ms.Tensor(s - 1, ms.int32)).asnumpy()) for s in got.step]
    np.testing.assert_allclose(got.value, expected, rtol=1e-6)
    assert run.series("loss").value.tolist() == [observer.loss[s] for s in range(1, steps + 1)]
    assert run.series("samples_per_second").value[-1] > 0
    assert "tokens_per_second" not in run.metrics  # float features, not token ids: no fake token count


def test_loss_scale_cell_reports_scale_overflow_and_unscaled_norm(tmp_path: Path) -> None:
    set_mode("graph")
    ms.set_seed(0)
    net = nn.WithLossCell(nn.Dense(4, 1), nn.MSELoss())
    scale = nn.FixedLossScaleUpdateCell(1024.0)
    train = TrainOneStepWithGradNormAndLossScale(net, nn.SGD(net.trainable_params(), 0.01), scale_sense=scale)
    cb = MonitorCallback({"save_dir": str(tmp_path)})
    Model(train).train(1, regression_data(5), callbacks=[cb], dataset_sink_mode=False)
    run = mindwatch.open_run(cb.run_dir)
    assert run.series("loss_scale").value.tolist() == [1024.0] * 5
    assert run.series("overflow").value.tolist() == [0.0] * 5
    assert np.allclose(run.series("lr").value, 0.01)
    # the unscaled norm of a 4->1 regression is O(1..100), never ~1024 x that
    assert np.all((run.series("grad_norm").value > 0) & (run.series("grad_norm").value < 1000))


def test_step_interval_records_every_nth_step_with_means(tmp_path: Path) -> None:
    set_mode("graph")
    net = nn.Dense(4, 1)
    cb = MonitorCallback({"save_dir": str(tmp_path), "step_interval": 3})
    Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.01)).train(1, regression_data(10), callbacks=[cb])
    run = mindwatch.open_run(cb.run_dir)
    assert run.series("loss").step.tolist() == [1, 4, 7, 10]


def test_enable_false_does_nothing(tmp_path: Path) -> None:
    set_mode("graph")
    net = nn.Dense(4, 1)
    cb = MonitorCallback({"enable": False, "save_dir": str(tmp_path / "out")})
    Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.01)).train(1, regression_data(3), callbacks=[cb])
    assert cb.run_dir is None and not (tmp_path / "out").exists()


def test_a_training_that_raises_is_failed_and_the_error_reaches_the_user(tmp_path: Path) -> None:
    set_mode("graph")

    class CorruptShard(Callback):
        def on_train_step_end(self, run_context) -> None:
            if run_context.original_args().cur_step_num == 4:
                raise ValueError("corrupt shard 17")

    net = nn.Dense(4, 1)
    cb = MonitorCallback({"save_dir": str(tmp_path)})
    with pytest.raises(ValueError, match="corrupt shard 17"):
        Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.01)).train(
            1, regression_data(10), callbacks=[cb, CorruptShard()]
        )
    run = mindwatch.open_run(cb.run_dir)
    assert run.state == "failed" and not run.finished
    assert "ValueError: corrupt shard 17" in run.statuses[0]["error"]
    assert run.series("loss").step.tolist() == [1, 2, 3, 4]
    assert run.meta["final_state"] == "failed"


@pytest.mark.parametrize(
    ("outputs", "declared", "expected"),
    [
        (2.5, None, {"loss": 2.5}),
        ((2.5, {"w": 1}), None, {"loss": 2.5}),  # TrainOneStepCell(return_grad=True)
        ((2.5, False, 1024.0), None, {"loss": 2.5, "overflow": 0.0, "loss_scale": 1024.0}),
        ((2.5, True, 512.0, 1e-4), None, {"loss": 2.5, "overflow": 1.0, "loss_scale": 512.0, "lr": 1e-4}),
        ((2.5, False, 1.0, 1e-4, None), None, {"loss": 2.5, "overflow": 0.0, "loss_scale": 1.0, "lr": 1e-4}),
        (
            (2.5, False, 1.0, 1e-4, 0.7, 0.1, 3),
            None,
            {"loss": 2.5, "overflow": 0.0, "loss_scale": 1.0, "lr": 1e-4, "grad_norm": 0.7},
        ),
        ((2.5, 0.7, 1e-3), ("loss", "grad_norm", "lr"), {"loss": 2.5, "grad_norm": 0.7, "lr": 1e-3}),
    ],
)
def test_decodes_every_output_layout(outputs, declared, expected) -> None:
    out: dict = {}
    decode_outputs(outputs, output_layout(outputs, declared), out)
    assert out == expected
    tensor_out: dict = {}
    as_tensors = (
        tuple(ms.Tensor(v) if isinstance(v, float) else v for v in outputs) if isinstance(outputs, tuple) else ms.Tensor(outputs)
    )
    decode_outputs(as_tensors, output_layout(as_tensors, declared), tensor_out)
    assert tensor_out == pytest.approx(expected)


def test_callback_params_without_a_dataset_neither_stop_the_start_nor_the_record(tmp_path: Path) -> None:
    """MindSpore's own callback params, holding only what a minimal loop sets: their missing keys raise KeyError."""
    from mindspore.train.callback import RunContext, _InternalCallbackParam

    cb = _InternalCallbackParam()
    cb.cur_step_num, cb.cur_epoch_num, cb.net_outputs = 0, 1, ms.Tensor(2.5, ms.float32)
    rc = RunContext(cb)
    monitor = MonitorCallback({"save_dir": str(tmp_path), "interval": 60})
    monitor.on_train_begin(rc)
    for step in (1, 2):
        cb.cur_step_num = step
        monitor.on_train_step_begin(rc)
        monitor.on_train_step_end(rc)
    monitor.on_train_end(rc)
    run = mindwatch.open_run(monitor.run_dir)
    assert run.series("loss").step.tolist() == [1, 2] and run.state == "finished"
    assert run.meta.get("total_steps") is None  # no dataset: the total is unknown, not guessed
