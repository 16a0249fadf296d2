"""Data-parallel ``Model.fit`` under ``msrun`` that over-fits, each rank evaluating its own shard, monitored with
early stopping on the ranks' mean evaluation (``evaluation.ranks: mean``).

Run by tests/test_evaluation_msrun.py::

    msrun --worker_num=2 --local_worker_num=2 --master_port=P --join=True --log_dir=DIR \
        tests/dist_scripts/train_eval.py --save-dir OUT --out SEEN

Each rank writes ``SEEN.rank<R>.json``: the training's step at each evaluation and MindSpore's ``eval_results``
(read by a callback of its own, independent of mindwatch), and the last training step.
"""

from __future__ import annotations

import argparse
import json

import mindspore as ms
import numpy as np
from mindspore import dataset as ds
from mindspore import nn
from mindspore.communication import get_rank, init
from mindspore.train import Callback, Model

from mindwatch.mindspore import MonitorCallback

FEATURES, EPOCHS, PATIENCE = 8, 40, 5


class Seen(Callback):
    def __init__(self) -> None:
        self.at: list[int] = []
        self.results: list[dict] = []
        self.trained = 0

    def on_train_step_end(self, run_context) -> None:
        self.trained = int(run_context.original_args().cur_step_num)

    def on_eval_begin(self, run_context) -> None:
        self.at.append(self.trained)

    def on_eval_end(self, run_context) -> None:
        self.results.append({k: float(v) for k, v in run_context.original_args().eval_results.items()})


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--save-dir", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    init()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    rank = get_rank()
    ms.set_seed(0)
    rng = np.random.default_rng(0)  # the same on both ranks: each takes its own half
    w = rng.normal(size=(FEATURES, 1)).astype(np.float32)
    xt = rng.normal(size=(32, FEATURES)).astype(np.float32)
    yt = (xt @ w + rng.normal(size=(32, 1))).astype(np.float32)
    xv = rng.normal(size=(256, FEATURES)).astype(np.float32)
    yv = (xv @ w).astype(np.float32)
    if rank == 1:  # a harder shard: the ranks' evaluations differ, so their mean is not either's own
        yv = yv * 1.5
    mine = slice(16 * rank, 16 * (rank + 1)), slice(128 * rank, 128 * (rank + 1))
    train = ds.NumpySlicesDataset((xt[mine[0]], yt[mine[0]]), ["x", "y"], shuffle=False).batch(8)
    valid = ds.NumpySlicesDataset((xv[mine[1]], yv[mine[1]]), ["x", "y"], shuffle=False).batch(64)
    net = nn.SequentialCell(nn.Dense(FEATURES, 256), nn.ReLU(), nn.Dense(256, 256), nn.ReLU(), nn.Dense(256, 1))
    model = Model(net, nn.MSELoss(), nn.Adam(net.trainable_params(), 1e-3), metrics={"mae": nn.MAE()})
    config = {
        "save_dir": args.save_dir,
        "project": "eval",
        "interval": 60,
        "flush_secs": 0.5,
        "evaluation": {"ranks": "mean"},
        "alerts": {"early_stopping": {"patience": PATIENCE}},
    }
    seen = Seen()
    model.fit(EPOCHS, train, valid, valid_frequency=1, callbacks=[MonitorCallback(config), seen], dataset_sink_mode=False)
    with open(f"{args.out}.rank{rank}.json", "w") as f:
        json.dump({"at": seen.at, "results": seen.results, "trained": seen.trained}, f)


if __name__ == "__main__":
    main()
