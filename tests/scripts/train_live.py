"""A GRAPH-mode training with our train cell that runs until stopped: a person acts on it (mindwatch stop|lr|...)."""

import sys
import time

import mindspore as ms
import numpy as np
from mindspore import dataset as ds
from mindspore import nn
from mindspore.train import Model

from mindwatch.mindspore import MonitorCallback, TrainOneStepWithGradNorm

save_dir = sys.argv[1]
ms.set_context(mode=ms.GRAPH_MODE)
ms.set_seed(0)


class SlowBatches:
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        time.sleep(0.02)
        x = np.random.default_rng(i).normal(size=(4, 4)).astype(np.float32)
        return x, x.sum(axis=1, keepdims=True)


net = nn.SequentialCell(nn.Dense(4, 8), nn.ReLU(), nn.Dense(8, 1))
cell = TrainOneStepWithGradNorm(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.01), layer_stats=True)
config = {
    "save_dir": save_dir,
    "project": "live",
    "run_name": "acted",
    "flush_secs": 0.5,
    "layers": {"every": 100_000, "histogram_every": None},
    "rewind": {"every": 10, "skip": 3},  # snapshots, for the rewind button
}
Model(cell).train(1, ds.GeneratorDataset(SlowBatches(), ["x", "y"], shuffle=False), callbacks=[MonitorCallback(config)])
