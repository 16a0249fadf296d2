"""A training that runs until it is killed: prints each finished step with its wall time."""

import sys
import time

import mindspore as ms
import numpy as np
from mindspore import dataset as ds
from mindspore import nn
from mindspore.train import Callback, Model

from mindwatch.mindspore import MonitorCallback

save_dir, flush_secs = sys.argv[1], float(sys.argv[2])
ms.set_context(mode=ms.GRAPH_MODE)


class SlowBatches:
    """Random access with a length, so MindSpore does not walk the whole source to size it."""

    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        time.sleep(0.01)
        x = np.random.default_rng(i).normal(size=(4, 4)).astype(np.float32)
        return x, x.sum(axis=1, keepdims=True)


class PrintSteps(Callback):
    def on_train_step_end(self, run_context):
        print(f"STEP {run_context.original_args().cur_step_num} {time.time():.6f}", flush=True)


net = nn.Dense(4, 1)
monitor = MonitorCallback({"save_dir": save_dir, "project": "crash", "run_name": "killed", "flush_secs": flush_secs})
Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.01)).train(
    1, ds.GeneratorDataset(SlowBatches(), ["x", "y"], shuffle=False), callbacks=[monitor, PrintSteps()]
)
