"""Data-parallel training of a tiny mixture of experts under ``msrun``, monitored: ``Model.train`` with our train cell,
then a loop of its own with ``mw.DistributedGradReducer``. Each rank routes its own batches.

Run by tests/test_moe_msrun.py::

    msrun --worker_num=2 --local_worker_num=2 --master_port=P --join=True --log_dir=DIR \
        tests/dist_scripts/train_moe.py --save-dir OUT --steps 20

Each rank writes the experts its MoE layers chose at every measured step (the layers keep them:
``tests/moe_model.py``) to ``OUT/kept.<train|loop>.rank<R>.json``: ``{step: {layer: [count per expert]}}``.

The ``Model.train`` part also profiles (one launch for tests/test_moe_msrun.py's two concerns): rank 1's batch
``BAD_AT`` has its inputs x 1000, its loss crosses ``warn_on_value`` (rank 1 alone: the update is clipped to a global norm
of 0.1, so the next steps are normal everywhere), and ``thresholds: {actions: [profile]}`` profiles 3 steps on every
rank.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import mindspore as ms
import numpy as np
from mindspore import dataset as ds
from mindspore import nn
from mindspore.communication import get_rank, init
from mindspore.train import Callback, Model

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the model the routing tests share
from moe_model import EXPERTS, MoENet, batches, kept  # noqa: E402

import mindwatch.mindspore as mw  # noqa: E402

TOKENS, EVERY, BAD_AT = 16, 5, 12


def counts_of(net: MoENet) -> dict[str, list[int]]:
    return {k: np.bincount(i.ravel(), minlength=EXPERTS).tolist() for k, (i, _) in kept(net).items()}


class Keep(Callback):
    """The kept counts of each measured step; from ``BAD_AT`` on, 0.1 s a step (the threshold's request reaches the
    training while it still runs: the rules run on the worker, up to a quarter of a second behind)."""

    def __init__(self, net: MoENet, out: dict) -> None:
        self.net, self.out = net, out

    def on_train_step_end(self, run_context) -> None:
        step = int(run_context.original_args().cur_step_num)
        if step % EVERY == 0:
            self.out[step] = counts_of(self.net)
        if step >= BAD_AT:
            time.sleep(0.1)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--save-dir", required=True)
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    init()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    rank = get_rank()
    config = {"save_dir": args.save_dir, "interval": 60, "moe": {"every": EVERY}, "layers": {"enabled": False}}

    ms.set_seed(0)
    net = MoENet(TOKENS)
    optimizer = nn.Adam(net.trainable_params(), 1e-3)
    train_net = mw.TrainOneStepWithGradNorm(nn.WithLossCell(net, nn.MSELoss()), optimizer, max_grad_norm=0.1)
    data_of_rank = batches(args.steps, TOKENS, seed=10 + rank)
    if rank == 1:
        x, y = data_of_rank[BAD_AT - 1]
        data_of_rank[BAD_AT - 1] = (x * 1000, y)
    data = ds.GeneratorDataset(data_of_rank, ["x", "y"], shuffle=False)
    seen: dict[int, dict] = {}
    profiling = {
        "callback": {"params": {"warn_on_value": {"loss": 1e4}}},
        "alerts": {"thresholds": {"actions": ["profile"]}},
        "profile": {"steps": 3},
    }
    monitor = mw.MonitorCallback({**config, **profiling, "project": "train"})
    Model(train_net).train(1, data, callbacks=[monitor, Keep(net, seen)], dataset_sink_mode=False)
    Path(args.save_dir, f"kept.train.rank{rank}.json").write_text(json.dumps(seen))

    net = MoENet(TOKENS)
    optimizer = nn.Adam(net.trainable_params(), 1e-3)
    grad_fn = ms.value_and_grad(nn.WithLossCell(net, nn.MSELoss()), None, optimizer.parameters)
    reducer = mw.DistributedGradReducer(optimizer.parameters, mean=True)

    @ms.jit
    def train_step(x, y):
        loss, grads = grad_fn(x, y)
        optimizer(reducer(grads))
        return loss, grads

    seen = {}
    with mw.start_run({**config, "project": "loop"}, network=net, optimizer=optimizer, grad_reducer=reducer) as run:
        for step, (x, y) in enumerate(batches(args.steps, TOKENS, seed=20 + rank), start=1):
            loss, grads = train_step(ms.Tensor(x), ms.Tensor(y))
            run.step(loss=loss, grads=grads)
            if step % EVERY == 0:
                seen[step] = counts_of(net)
    Path(args.save_dir, f"kept.loop.rank{rank}.json").write_text(json.dumps(seen))


if __name__ == "__main__":
    main()
