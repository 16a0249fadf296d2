"""Build and run the demo training: a small GPT on the standard library's source, on CPU.

Example::

    from mindwatch.demo.train import build_training, evaluate_every
    settings = DemoSettings(steps=300, mode="graph")
    model, dataset = build_training(settings)
    monitor = MonitorCallback({"project": "demo", "evaluation": {"perplexity": True}})
    model.train(1, dataset, callbacks=[monitor, evaluate_every(100, model, held_out_text(settings), monitor)])

The corpus' last tenth is held out: the training's windows come from the rest, the evaluation's from it.
"""

from __future__ import annotations

from dataclasses import dataclass

import mindspore as ms
import numpy as np
from mindspore import dataset as ds
from mindspore import nn
from mindspore.train import Callback, Model

from mindwatch.demo.corpus import ByteWindows, stdlib_corpus
from mindwatch.demo.model import GPTConfig, LanguageModelEval, LanguageModelLoss, TinyGPT
from mindwatch.mindspore.train_step import TrainOneStepWithGradNorm


@dataclass(frozen=True)
class DemoSettings:
    steps: int = 300
    mode: str = "graph"  # or "pynative"
    batch_size: int = 16
    seq_length: int = 64
    layers: int = 2
    d_model: int = 64
    heads: int = 4
    #: Each block's feed-forward a mixture of this many experts (``mindwatch demo --moe``: 4); 0: dense.
    experts: int = 0
    top_k: int = 2
    lr: float = 3e-3
    warmup: int = 30
    max_grad_norm: float | None = 1.0
    #: Per-layer gradient norm, weight norm and update ratio in the graph (docs/layers.md).
    layer_stats: bool = True
    seed: int = 0
    #: Evaluate on the held-out text every this many steps (and after the last).
    eval_every: int = 100
    #: Batches of held-out text an evaluation reads.
    eval_batches: int = 8


def lr_schedule(steps: int, peak: float, warmup: int) -> list[float]:
    """Linear warm-up then cosine decay to 10 % of the peak, one value per step."""
    s = np.arange(steps, dtype=np.float64)
    warm = peak * (s + 1) / max(warmup, 1)
    progress = np.clip((s - warmup) / max(steps - warmup, 1), 0, 1)
    cosine = peak * (0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * progress)))
    return [float(v) for v in np.where(s < warmup, warm, cosine)]


def set_mode(mode: str) -> None:
    if mode not in ("graph", "pynative"):
        raise ValueError(f"mode must be 'graph' or 'pynative', got {mode!r}")
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")


def build_training(settings: DemoSettings = DemoSettings()) -> tuple[Model, ds.Dataset]:
    """The demo's Model (with :class:`TrainOneStepWithGradNorm`, and an eval network: the loss and next-byte
    accuracy, ``metrics={"loss", "accuracy"}``) and its dataset of ``steps`` batches."""
    set_mode(settings.mode)
    ms.set_seed(settings.seed)
    cfg = GPTConfig(
        seq_length=settings.seq_length,
        layers=settings.layers,
        d_model=settings.d_model,
        heads=settings.heads,
        experts=settings.experts,
        top_k=settings.top_k,
    )
    net = TinyGPT(cfg)
    optimizer = nn.AdamWeightDecay(
        net.trainable_params(), learning_rate=lr_schedule(settings.steps, settings.lr, settings.warmup), weight_decay=0.01
    )
    train_net = TrainOneStepWithGradNorm(
        LanguageModelLoss(net), optimizer, max_grad_norm=settings.max_grad_norm, layer_stats=settings.layer_stats
    )
    corpus = stdlib_corpus()
    windows = ByteWindows(
        corpus[: _held_out_from(corpus)], settings.seq_length, settings.steps * settings.batch_size, seed=settings.seed
    )
    dataset = ds.GeneratorDataset(windows, ["ids", "targets"], shuffle=False).batch(settings.batch_size, drop_remainder=True)
    metrics = {"loss": nn.Loss().set_indexes([0]), "accuracy": nn.Accuracy().set_indexes([1, 2])}
    model = Model(train_net, eval_network=LanguageModelEval(net), metrics=metrics)
    return model, dataset


def held_out_text(settings: DemoSettings = DemoSettings()) -> ds.Dataset:
    """``eval_batches`` batches of windows from the corpus' last tenth, which the training never reads."""
    corpus = stdlib_corpus()
    held = ByteWindows(corpus[_held_out_from(corpus) :], settings.seq_length, settings.eval_batches * settings.batch_size, seed=1)
    return ds.GeneratorDataset(held, ["ids", "targets"], shuffle=False).batch(settings.batch_size, drop_remainder=True)


def _held_out_from(corpus: np.ndarray) -> int:
    return len(corpus) * 9 // 10


def evaluate_every(steps: int, model: Model, held_out: ds.Dataset, *callbacks: Callback) -> Callback:
    """A callback that evaluates ``model`` on ``held_out`` after every ``steps``-th step and the last, with
    ``callbacks`` (the monitor records what MindSpore hands them: ``eval/loss``, ``eval/accuracy``)."""
    return _EvaluateEvery(steps, model, held_out, list(callbacks))


class _EvaluateEvery(Callback):
    def __init__(self, steps: int, model: Model, held_out: ds.Dataset, callbacks: list[Callback]) -> None:
        self.steps, self.model, self.held_out, self.callbacks = steps, model, held_out, callbacks

    def on_train_step_end(self, run_context) -> None:  # noqa: ANN001
        cb = run_context.original_args()
        step, last = int(cb.cur_step_num), int(cb.batch_num) * int(cb.epoch_num)
        if step % self.steps == 0 or step == last:
            self.model.eval(self.held_out, callbacks=self.callbacks, dataset_sink_mode=False)
