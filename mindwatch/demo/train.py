"""Build and run the demo training: a small GPT on the standard library's source, on CPU.

Example::

    from mindwatch.demo.train import build_training
    model, dataset = build_training(steps=100, mode="graph")
    model.train(1, dataset, callbacks=[MonitorCallback({"project": "demo"})])
"""

from __future__ import annotations

from dataclasses import dataclass

import mindspore as ms
import numpy as np
from mindspore import dataset as ds
from mindspore import nn
from mindspore.train import Model

from mindwatch.demo.corpus import ByteWindows, stdlib_corpus
from mindwatch.demo.model import GPTConfig, LanguageModelLoss, TinyGPT
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
    lr: float = 3e-3
    warmup: int = 30
    max_grad_norm: float | None = 1.0
    #: Per-layer gradient norm, weight norm and update ratio in the graph (docs/layers.md).
    layer_stats: bool = True
    seed: int = 0


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
    """The demo's Model (with :class:`TrainOneStepWithGradNorm`) and dataset of ``steps`` batches."""
    set_mode(settings.mode)
    ms.set_seed(settings.seed)
    cfg = GPTConfig(seq_length=settings.seq_length, layers=settings.layers, d_model=settings.d_model, heads=settings.heads)
    net = TinyGPT(cfg)
    optimizer = nn.AdamWeightDecay(
        net.trainable_params(), learning_rate=lr_schedule(settings.steps, settings.lr, settings.warmup), weight_decay=0.01
    )
    train_net = TrainOneStepWithGradNorm(
        LanguageModelLoss(net), optimizer, max_grad_norm=settings.max_grad_norm, layer_stats=settings.layer_stats
    )
    windows = ByteWindows(stdlib_corpus(), settings.seq_length, settings.steps * settings.batch_size, seed=settings.seed)
    dataset = ds.GeneratorDataset(windows, ["ids", "targets"], shuffle=False).batch(settings.batch_size, drop_remainder=True)
    return Model(train_net), dataset
