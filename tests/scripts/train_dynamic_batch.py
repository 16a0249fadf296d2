"""A GRAPH-mode training batched by a DynamicBatch(32, min=8, max=64) that runs until stopped (mindwatch batch|stop).

Each step's rows, as the network received them, go to ``<save_dir>/rows.jsonl`` (one ``[step, rows]`` a line, flushed).
"""

import json
import sys
import time

import mindspore as ms
import numpy as np
from mindspore import dataset as ds
from mindspore import nn
from mindspore.train import Callback, Model

import mindwatch.mindspore as mw

save_dir = sys.argv[1]
ms.set_context(mode=ms.GRAPH_MODE)
ds.config.set_prefetch_size(2)  # a change lands some 15 steps on, not 85
ms.set_seed(0)


class Rows(Callback):
    def __init__(self, path: str) -> None:
        self.out = open(path, "w")  # noqa: SIM115 (the process ends with the training)

    def on_train_step_end(self, run_context) -> None:
        cb = run_context.original_args()
        self.out.write(json.dumps([cb.cur_step_num, int(cb.train_dataset_element[0].shape[0])]) + "\n")
        self.out.flush()
        time.sleep(0.01)  # a steady pace a person can act on


x = np.random.default_rng(0).normal(size=(32 * 400, 4)).astype(np.float32)
batch = mw.DynamicBatch(32, min=8, max=64)
data = ds.NumpySlicesDataset((x, x.sum(axis=1, keepdims=True)), ["x", "y"], shuffle=False).batch(batch)
net = nn.SequentialCell(nn.Dense(4, 8), nn.ReLU(), nn.Dense(8, 1))
cell = mw.TrainOneStepWithGradNorm(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.01))
config = {"save_dir": save_dir, "project": "live", "run_name": "batched", "flush_secs": 0.5}
monitor = mw.MonitorCallback(config, batch=batch)
Model(cell).train(1, data, callbacks=[Rows(f"{save_dir}/rows.jsonl"), monitor], dataset_sink_mode=False)
