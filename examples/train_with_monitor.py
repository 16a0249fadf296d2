"""Copy me: a MindSpore training with mindwatch watching it.

    python examples/train_with_monitor.py            # then: mindwatch serve ./monitor_output
"""

import mindspore as ms
import numpy as np
from mindspore import dataset as ds
from mindspore import nn
from mindspore.train import Model

from mindwatch.mindspore import MonitorCallback, TrainOneStepWithGradNorm

ms.set_context(mode=ms.GRAPH_MODE)


def make_dataset(n: int = 2048, batch: int = 32) -> ds.Dataset:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 16)).astype(np.float32)
    y = (x @ rng.normal(size=(16, 1))).astype(np.float32)
    return ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=True).batch(batch)


net = nn.SequentialCell(nn.Dense(16, 64), nn.ReLU(), nn.Dense(64, 1))
optimizer = nn.Adam(net.trainable_params(), learning_rate=nn.CosineDecayLR(1e-4, 1e-2, decay_steps=640))
# computes the global gradient norm inside the graph and returns it with the loss and the lr
train_net = TrainOneStepWithGradNorm(nn.WithLossCell(net, nn.MSELoss()), optimizer, max_grad_norm=1.0)

Model(train_net).train(10, make_dataset(), callbacks=[MonitorCallback("examples/monitor.yaml")])
