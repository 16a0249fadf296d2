"""Data-parallel training of a tiny model under ``msrun`` (or a manual dynamic-cluster launch), monitored.

Run by tests/test_distributed.py::

    msrun --worker_num=2 --local_worker_num=2 --master_port=P --join=True --log_dir=DIR \
        tests/dist_scripts/train_dp.py --save-dir OUT --steps 30 --slow-rank 1 --slow-secs 0.15

``--slow-rank R --slow-secs S``: rank R's data pipeline takes S seconds per batch (a straggler).
``--block-rank R --block-at N``: rank R's data pipeline blocks forever at batch N (a hang; the other
rank then waits in the gradient AllReduce).
``--spike-rank R --spike-at N --spike-secs S``: rank R's batch N alone takes S seconds (a data_time spike).
The spike waits until the training has taken every batch before it: its queue is empty, so the step waits the whole
spike for its batch, however far ahead the pipeline had run (on a busy machine a step takes longer than the pace, and
a full queue hid seconds of the spike).
``--pace-secs S``: every batch on every rank takes S seconds (a steady step time). With a spike rank, the others'
batches take 3/4 of that: the spike rank's pipeline sets the pace, so its queue is empty and the spike shows whole
(the rank that waits in the AllReduce instead has a full queue, which would hide seconds of it).
``--late-rank R --late-secs S``: rank R starts training S seconds after the others (a rank that comes back late).
``--save-params PATH``: each rank saves its final weights to ``PATH.rank<R>.npz``.
``--nan-rank R --nan-at N``: rank R's labels of batch N are NaN (so the all-reduced gradients are NaN on every rank).
``--scale-rank R --scale-at N --scale-by F``: rank R's inputs of batch N are multiplied by F (one bad batch);
``--scale-for K``: of K batches from N on (a bad stretch).
``--ckpt-dir DIR --ckpt-every K``: a ``ModelCheckpoint`` saves every K steps into ``DIR/rank<R>``.
``--max-grad-norm X``: clip the gradients to that global norm (in the train cell).
``--loop``: a training loop of its own (value_and_grad, the gradients all-reduced by ``DistributedGradReducer``, a
``train_step`` under ``ms.jit``) monitored with ``start_run`` / ``run.step``, instead of ``Model.train``.
``--signal-in-reducer``: that loop reduces with ``mw.DistributedGradReducer`` (``start_run(grad_reducer=)``).
``--adamw``: ``AdamWeightDecay`` (lr 0.01) in place of ``Momentum``.
``--ids``: a third column, ``ids``, each sample's id (``rank * 100000 + index``), named by ``callback.sample_ids``.
``--then-per-rank``: after the training, a second one (project ``PROJECT_own``) with each rank in its own folder.
``--dynamic-batch MIN``: batched by ``mw.DynamicBatch(8, min=MIN)``, given to the callback or ``start_run`` (``batch=``,
a ``--loop``'s step under ``ms.jit(dynamic=1)``); with
``--rows PATH`` each rank writes the rows of every step's batch, as its network received them, to ``PATH.rank<R>.json``.
``--short-prefetch-rank R``: rank R's pipeline prefetches 2 batches, not 16 (``ds.config.set_prefetch_size(2)``): it
runs 14 batches ahead of the training, the others 84.
``--fault-rank R --fault WHERE:S1,S2``: a bug of mindwatch's own on rank R, at steps S1, S2 (repeatable): ``record``,
the step's timing (``StepTimer.add``) raises; ``sum``, the code just before a loop's own sum of the signal
(``SignalExchange.timed``) raises.
``--eval-rank R``: with ``--loop``, rank R alone calls ``run.eval`` every 5 steps (the other ranks never evaluate).
``--eval-scripted JSON``: with ``--loop``, every rank calls ``run.eval(loss=...)`` every 5 steps with these values (rank
R's each + R / 100).
``--print-steps``: print ``RANK_STEP <rank> <step>`` (flushed) once each step is done: what a test compares with after
``kill -9`` (the metrics file may not hold the last steps yet: its writer flushes every ``flush_secs``).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

import mindspore as ms
import numpy as np
from mindspore import dataset as ds
from mindspore import nn
from mindspore.communication import get_rank, init
from mindspore.train import Model

import mindwatch.mindspore as mw
from mindwatch.mindspore import MonitorCallback, TrainOneStepWithGradNorm

BATCH = 8


class StepsDone:
    """How many steps this rank's training has finished: what the data pipeline may wait for."""

    def __init__(self) -> None:
        self.count = 0
        self.changed = threading.Condition()

    def done(self, step: int) -> None:
        with self.changed:
            self.count = step
            self.changed.notify_all()

    def wait_for(self, step: int, timeout: float = 120.0) -> None:
        with self.changed:
            self.changed.wait_for(lambda: self.count >= step, timeout)


STEPS_DONE = StepsDone()


class CountSteps(ms.train.Callback):
    """Tells :data:`STEPS_DONE` of every finished step (``Model.train``)."""

    def on_train_step_end(self, run_context) -> None:
        STEPS_DONE.done(run_context.original_args().cur_step_num)


class Batches:
    """Random regression data, different on every rank; slow or stuck on purpose on one rank."""

    def __init__(self, rank: int, steps: int, args: argparse.Namespace) -> None:
        self.rank, self.n, self.args = rank, steps * BATCH, args
        self.rng = np.random.default_rng(100 + rank)
        self.w = np.linspace(-1, 1, 16).astype(np.float32)
        self.never = threading.Event()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[np.ndarray, ...]:
        batch = i // BATCH
        if self.rank == self.args.block_rank and batch >= self.args.block_at:
            self.never.wait()  # a data source that never answers
        if self.rank == self.args.slow_rank and i % BATCH == 0:
            time.sleep(self.args.slow_secs)
        if i % BATCH == 0:
            spiking = self.args.spike_rank >= 0
            pace = self.args.pace_secs * (0.75 if spiking and self.rank != self.args.spike_rank else 1.0)
            if (self.rank, batch) == (self.args.spike_rank, self.args.spike_at):
                STEPS_DONE.wait_for(batch)  # batches 0..batch-1 taken by steps 1..batch: nothing queued hides the spike
                pace += self.args.spike_secs
            time.sleep(pace)
        x = self.rng.standard_normal(16).astype(np.float32)
        y = np.array([x @ self.w], np.float32)
        if (self.rank, batch) == (self.args.nan_rank, self.args.nan_at - 1):
            y[:] = np.nan
        if self.rank == self.args.scale_rank and 0 <= batch - (self.args.scale_at - 1) < self.args.scale_for:
            x = x * self.args.scale_by
        return (x, y, np.array(self.rank * 100000 + i, np.int64)) if self.args.ids else (x, y)


class LossWithIds(nn.Cell):
    """``nn.WithLossCell`` that takes the ids column too (``callback.sample_ids``) and ignores it."""

    def __init__(self, net: nn.Cell) -> None:
        super().__init__(auto_prefix=False)
        self.net, self.loss = net, nn.MSELoss()

    def construct(self, x, y, ids):
        return self.loss(self.net(x), y)


class Rows(ms.train.Callback):
    """The rows of each step's batch (``train_dataset_element``), written to ``path`` as JSON at train end."""

    def __init__(self, path: str) -> None:
        self.path, self.rows = path, {}

    def on_train_step_end(self, run_context) -> None:
        cb = run_context.original_args()
        self.rows[cb.cur_step_num] = int(cb.train_dataset_element[0].shape[0])

    def on_train_end(self, run_context) -> None:
        with open(self.path, "w") as f:
            json.dump(self.rows, f)


class PrintSteps(ms.train.Callback):
    """``RANK_STEP <rank> <step>`` on stdout, flushed, at the end of every step."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def on_train_step_end(self, run_context) -> None:
        # one write (print writes the newline apart when unbuffered): MindSpore's log lines share the file
        sys.stdout.write(f"RANK_STEP {self.rank} {run_context.original_args().cur_step_num}\n")
        sys.stdout.flush()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--save-dir", required=True)
    p.add_argument("--project", default="dist")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-secs", type=float, default=0.0)
    p.add_argument("--block-rank", type=int, default=-1)
    p.add_argument("--block-at", type=int, default=10**9)
    p.add_argument("--spike-rank", type=int, default=-1)
    p.add_argument("--spike-at", type=int, default=-1)
    p.add_argument("--spike-secs", type=float, default=0.0)
    p.add_argument("--pace-secs", type=float, default=0.0)
    p.add_argument("--short-prefetch-rank", type=int, default=-1)
    p.add_argument("--dynamic-batch", type=int, default=0, help="mw.DynamicBatch(8, min=N)")
    p.add_argument("--rows", default=None)
    p.add_argument("--late-rank", type=int, default=-1)
    p.add_argument("--late-secs", type=float, default=0.0)
    p.add_argument("--save-params", default=None)
    p.add_argument("--mode", choices=["graph", "pynative"], default="graph")
    p.add_argument("--config", default="{}", help="JSON merged into the monitor config")
    p.add_argument("--layer-stats", action="store_true", help="per-layer statistics in the train cell")
    p.add_argument("--loop", action="store_true", help="a loop of its own with start_run, not Model.train")
    p.add_argument("--signal-in-reducer", action="store_true", help="--loop with mw.DistributedGradReducer (grad_reducer=)")
    p.add_argument("--nan-rank", type=int, default=-1)
    p.add_argument("--nan-at", type=int, default=-1, help="the step (1-based) whose labels are NaN")
    p.add_argument("--scale-rank", type=int, default=-1)
    p.add_argument("--scale-at", type=int, default=-1, help="the step (1-based) whose inputs are scaled")
    p.add_argument("--scale-by", type=float, default=1.0)
    p.add_argument("--scale-for", type=int, default=1, help="batches scaled from --scale-at on")
    p.add_argument("--ckpt-dir", default=None)
    p.add_argument("--ckpt-every", type=int, default=5)
    p.add_argument("--max-grad-norm", type=float, default=None)
    p.add_argument("--print-steps", action="store_true", help="print RANK_STEP <rank> <step> after each step")
    p.add_argument("--save-dir-per-rank", action="store_true", help="each rank records under SAVE_DIR/rank<R> (no shared folder)")
    p.add_argument("--ids", action="store_true", help="an ids column, named by callback.sample_ids")
    p.add_argument("--adamw", action="store_true", help="AdamWeightDecay in place of Momentum")
    p.add_argument("--then-per-rank", action="store_true", help="then train again, each rank in its own folder")
    p.add_argument("--eval-rank", type=int, default=-1, help="--loop: this rank alone calls run.eval every 5 steps")
    p.add_argument("--eval-scripted", default=None, help="--loop: every rank evaluates every 5 steps: JSON list of losses")
    p.add_argument("--fault-rank", type=int, default=-1)
    p.add_argument("--fault", action="append", default=[], help="WHERE:S1,S2 (record | sum) on --fault-rank")
    args = p.parse_args()

    ms.set_context(mode=ms.GRAPH_MODE if args.mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    init()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    ms.set_seed(0)
    rank = get_rank()
    if rank == args.fault_rank:
        for fault in args.fault:
            where, steps = fault.split(":")
            inject_fault(where, {int(step) for step in steps.split(",")})
    train(rank, args)
    if args.then_per_rank:
        args.project, args.save_dir_per_rank = f"{args.project}_own", True
        train(rank, args)


def inject_fault(where: str, steps: set[int]) -> None:
    """A bug of mindwatch's own at ``steps``: in the step's timing (``record``) or just before a loop's sum (``sum``)."""
    from mindwatch.mindspore.rank_signal import SignalExchange
    from mindwatch.mindspore.timing import StepTimer

    if where == "record":
        add = StepTimer.add

        def faulty_add(self, rec, n, now):  # noqa: ANN001, ANN202
            if rec["step"] in steps:
                raise RuntimeError(f"injected fault in the record of step {rec['step']}")
            add(self, rec, n, now)

        StepTimer.add = faulty_add
    elif where == "sum":
        timed = SignalExchange.timed

        def faulty_timed(self, step, step_secs, data_secs):  # noqa: ANN001, ANN202
            if step in steps:
                raise RuntimeError(f"injected fault before the sum of step {step}")
            timed(self, step, step_secs, data_secs)

        SignalExchange.timed = faulty_timed
    else:
        raise SystemExit(f"--fault {where}: record or sum")


def train(rank: int, args: argparse.Namespace) -> None:
    ms.set_seed(0)
    net = nn.SequentialCell(nn.Dense(16, 32), nn.ReLU(), nn.Dense(32, 1))
    if args.adamw:
        optimizer = nn.AdamWeightDecay(net.trainable_params(), learning_rate=0.01)
    else:
        optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.02, momentum=0.9)
    # the gradient norm is taken after the AllReduce: the same on every rank (the loss is each rank's own)
    loss_net = LossWithIds(net) if args.ids else nn.WithLossCell(net, nn.MSELoss())
    cell = TrainOneStepWithGradNorm(loss_net, optimizer, layer_stats=args.layer_stats, max_grad_norm=args.max_grad_norm)
    model = Model(cell)
    if rank == args.short_prefetch_rank:
        ds.config.set_prefetch_size(2)
    batch = mw.DynamicBatch(BATCH, min=args.dynamic_batch) if args.dynamic_batch else None
    columns = ["x", "y", "ids"] if args.ids else ["x", "y"]
    data = ds.GeneratorDataset(Batches(rank, args.steps, args), columns, shuffle=False).batch(batch or BATCH)
    config = {
        "project": args.project,
        "save_dir": f"{args.save_dir}/rank{rank}" if args.save_dir_per_rank else args.save_dir,
        "interval": 0.2,
        "flush_secs": 0.5,
        "alerts": {"stall_timeout": 4.0},
        "distributed": {"poll_secs": 0.2, "straggler": {"count": 5}, "hang": {"wait": 8.0}},
    }
    if args.ids:
        config["callback"] = {"sample_ids": "ids"}
    for key, value in json.loads(args.config).items():  # one level deep: {"alerts": {...}} keeps stall_timeout
        config[key] = {**config[key], **value} if isinstance(value, dict) and isinstance(config.get(key), dict) else value
    if rank == args.late_rank:
        time.sleep(args.late_secs)
    if args.loop:
        rows = f"{args.rows}.rank{rank}.json" if args.rows else None
        scripted = json.loads(args.eval_scripted) if args.eval_scripted else None
        evaluates = rank == args.eval_rank or scripted is not None
        run_dir = train_loop(
            net,
            optimizer,
            data,
            config,
            in_reducer=args.signal_in_reducer,
            batch=batch,
            rows=rows,
            evaluates=evaluates,
            scripted=[v + rank / 100 for v in scripted] if scripted else None,  # each rank's own, the ranks alike
        )
    else:
        cb = MonitorCallback(config, batch=batch)
        callbacks = [cb, CountSteps(), PrintSteps(rank)] if args.print_steps else [cb, CountSteps()]
        if args.rows:
            callbacks.append(Rows(f"{args.rows}.rank{rank}.json"))
        if args.ckpt_dir:
            from mindspore.train import CheckpointConfig, ModelCheckpoint

            ckpt = CheckpointConfig(save_checkpoint_steps=args.ckpt_every, keep_checkpoint_max=1000)
            callbacks.append(ModelCheckpoint(prefix="dp", directory=f"{args.ckpt_dir}/rank{rank}", config=ckpt))
        model.train(1, data, callbacks=callbacks, dataset_sink_mode=False)
        run_dir = cb.run_dir
    if args.save_params:
        np.savez(f"{args.save_params}.rank{rank}.npz", **{p.name: p.asnumpy() for p in net.trainable_params()})
    if args.then_per_rank and not args.save_dir_per_rank:
        return  # "finished" (what the test waits for) after the last training
    print(f"train_dp: rank {rank} finished, run dir {run_dir}", flush=True)


def train_loop(
    net: nn.Cell,
    optimizer: nn.Optimizer,
    data: ds.Dataset,
    config: dict,
    *,
    in_reducer: bool,
    batch: mw.DynamicBatch | None = None,
    rows: str | None = None,
    evaluates: bool = False,
    scripted: list[float] | None = None,
) -> object:
    """The data-parallel functional loop: each rank's gradients all-reduced (mean), then the update; ``in_reducer``:
    mindwatch's signal rides on that reduction (``mw.DistributedGradReducer``), else the loop sums it itself. With a
    ``batch``, the step compiles for any batch size and ``rows`` gets each step's rows."""
    loss_net = nn.WithLossCell(net, nn.MSELoss())
    grad_fn = ms.value_and_grad(loss_net, None, optimizer.parameters)
    kind = mw.DistributedGradReducer if in_reducer else nn.DistributedGradReducer
    reducer = kind(optimizer.parameters, mean=True)

    @ms.jit(dynamic=1 if batch is not None else 0)
    def train_step(x, y):
        loss, grads = grad_fn(x, y)
        grads = reducer(grads)
        optimizer(grads)
        return loss, grads

    total = data.get_dataset_size()
    grad_reducer = reducer if in_reducer else None
    seen: dict[int, int] = {}
    start = mw.start_run(config, network=net, optimizer=optimizer, total_steps=total, grad_reducer=grad_reducer, batch=batch)
    with start as run:
        for step, (x, y) in enumerate(run.batches(data.create_tuple_iterator()), start=1):
            seen[step] = int(x.shape[0])
            loss, grads = train_step(x, y)
            run.step(loss=loss, grads=grads)
            if evaluates and step % 5 == 0:
                value = scripted[step // 5 - 1] if scripted else float(loss.asnumpy())
                run.eval(loss=value)  # a rank alone: nothing acts on it (no early stopping), so no collective waits
            STEPS_DONE.done(STEPS_DONE.count + 1)
            if run.should_stop:
                break
    if rows:
        with open(rows, "w") as f:
            json.dump(seen, f)
    return run.run_dir


if __name__ == "__main__":
    main()
