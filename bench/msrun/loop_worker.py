"""One worker of ``python -m bench loop``'s msrun part (2 workers, data parallel): the functional loop of MindSpore 2.x
(value_and_grad, a ``@ms.jit`` step, the gradients all-reduced) on the demo-sized model, in rotating rounds.

Arms, each its own compiled step: the bare loop (``nn.DistributedGradReducer``, the loss read each step: what any
per-step logger does), the same loop with ``start_run`` / ``run.step(loss, grads)`` (the signal summed by a separate
small ``AllReduce`` every ``loop_every`` steps), and that loop with ``mw.DistributedGradReducer`` (the signal rides on
the gradient reduction, ``start_run(grad_reducer=)``). Rank 0 prints one JSON line: every step's seconds per arm,
and the CPU seconds per step per round of the training thread and of the others.
"""

from __future__ import annotations

import json
import sys
import tempfile
import threading
import time

import mindspore as ms
import numpy as np
from mindspore import nn
from mindspore.communication import get_rank, init

import mindwatch.mindspore as mw
from bench import threadcpu
from mindwatch.demo.model import GPTConfig, LanguageModelLoss, TinyGPT

ARMS = ("bare loop", "mindwatch, loop_every sums", "mindwatch, grad_reducer")


def compiled_step(net: nn.Cell, optimizer: nn.Optimizer, reducer: nn.Cell):
    grad_fn = ms.value_and_grad(net, None, optimizer.parameters)

    @ms.jit
    def train_step(ids, targets):
        loss, grads = grad_fn(ids, targets)
        grads = reducer(grads)
        optimizer(grads)
        return loss, grads

    return train_step


def main(rounds: int, steps: int) -> None:
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    init()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    rank = get_rank()
    ms.set_seed(0)
    net = LanguageModelLoss(TinyGPT(GPTConfig(seq_length=64, layers=2, d_model=64, heads=4)))
    optimizer = nn.AdamWeightDecay(net.trainable_params(), learning_rate=1e-4)
    plain = nn.DistributedGradReducer(optimizer.parameters, mean=True)
    ours = mw.DistributedGradReducer(optimizer.parameters, mean=True)
    step_of = {ARMS[0]: compiled_step(net, optimizer, plain), ARMS[1]: None, ARMS[2]: compiled_step(net, optimizer, ours)}
    step_of[ARMS[1]] = step_of[ARMS[0]]
    rng = np.random.default_rng(rank)
    batches = [tuple(ms.Tensor(rng.integers(0, 256, (16, 64)).astype(np.int32)) for _ in range(2)) for _ in range(8)]
    with tempfile.TemporaryDirectory() as tmp:
        config = {"save_dir": f"{tmp}/rank{rank}", "interval": 1}
        runs = {
            ARMS[0]: None,
            ARMS[1]: mw.start_run({**config, "run_name": "loop_every"}, network=net, optimizer=optimizer),
            ARMS[2]: mw.start_run({**config, "run_name": "reducer"}, network=net, optimizer=optimizer, grad_reducer=ours),
        }

        def one(arm: str, i: int) -> None:
            loss, grads = step_of[arm](*batches[i % len(batches)])  # type: ignore[misc]
            run = runs[arm]
            if run is None:
                loss.asnumpy()
            else:
                run.step(loss=loss, grads=grads)

        for arm in ARMS:  # compile, and the first sums
            for i in range(12):
                one(arm, i)
        out: dict[str, dict[str, list[float]]] = {a: {"steps": [], "training": [], "other": []} for a in ARMS}
        for r in range(rounds):
            for arm in ARMS[r % len(ARMS) :] + ARMS[: r % len(ARMS)]:
                before = threadcpu.snapshot()
                last = time.perf_counter()
                for i in range(steps):
                    one(arm, i)
                    now = time.perf_counter()
                    out[arm]["steps"].append(now - last)
                    last = now
                cpu = threadcpu.by_group(before, threadcpu.snapshot(), training=threading.get_native_id())
                out[arm]["training"].append(cpu["training"] / steps)
                out[arm]["other"].append((cpu["other"] + cpu["mindwatch"]) / steps)
        for run in runs.values():
            if run is not None:
                run.finish()
    if rank == 0:
        print("LOOP_BENCH " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
