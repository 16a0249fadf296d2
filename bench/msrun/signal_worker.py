"""One worker of ``python -m bench signal`` (run under msrun by bench/bench_signal.py): paired rounds, rank 0 prints.

Arms, on one data-parallel demo-sized model: our train cell without the signal vector and with it (the AllReduce of
the signal inside the step; the vector written before each step with this rank's timings and the sum read after it,
as the callback does; and the same without the rank's ``local_grad_norm`` in it), and a loop of its own that reads
the loss, without and with the loop's one small AllReduce of the signal every
``distributed.coordination.loop_every`` steps (what ``start_run`` does). Prints one JSON line per arm: seconds per
step per round, CPU seconds per step of the training thread and of all the others, per round.
"""

from __future__ import annotations

import json
import sys
import threading
import time

import mindspore as ms
import numpy as np
from mindspore import nn
from mindspore.communication import get_group_size, get_rank, init

from bench import threadcpu
from mindwatch.config import load_config
from mindwatch.demo.model import GPTConfig, LanguageModelLoss, TinyGPT
from mindwatch.mindspore import TrainOneStepWithGradNorm
from mindwatch.mindspore.loop import _sum
from mindwatch.mindspore.rank_signal import RankSignal


def main(rounds: int, steps: int) -> None:
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    init()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    rank = get_rank()
    ms.set_seed(0)
    cfg = GPTConfig(seq_length=64, layers=2, d_model=64, heads=4)

    class WithoutSignal(TrainOneStepWithGradNorm):
        def _setup_signal(self) -> None:
            self.mindwatch_signal = None

    class WithoutLocalNorm(TrainOneStepWithGradNorm):  # the signal as it was before it carried local_grad_norm
        def _signal(self, local_grads):
            return (self._signal_sum(self.mindwatch_signal),)

    def cell(kind: type) -> TrainOneStepWithGradNorm:
        net = LanguageModelLoss(TinyGPT(cfg))
        return kind(net, nn.AdamWeightDecay(net.trainable_params(), learning_rate=1e-4))

    rng = np.random.default_rng(rank)
    ids = ms.Tensor(rng.integers(0, 256, (16, 64)).astype(np.int32))
    cells = {
        "train cell": cell(WithoutSignal),
        "train cell + signal": cell(TrainOneStepWithGradNorm),
        "+ signal, no local norm": cell(WithoutLocalNorm),
    }
    signal = RankSignal(None, rank=rank, world_size=get_group_size())

    every = load_config({}).distributed.coordination.loop_every  # start_run's default: one sum every N steps
    count = [0]

    signals = {
        arm: RankSignal(cells[arm].mindwatch_signal, rank=rank, world_size=get_group_size())
        for arm in ("train cell + signal", "+ signal, no local norm")
    }
    at = cells["train cell + signal"].mindwatch_outputs.index("signal")
    last = [time.perf_counter()]

    def run(arm: str) -> None:
        if arm in signals:  # what the callback does each step: write the vector, read the sum
            cell_signal = signals[arm]
            cell_signal.send()
            outputs = cells[arm](ids, ids)
            outputs[0].asnumpy()
            reduced = outputs[at].asnumpy()
            cell_signal.read(reduced)
            cell_signal.timings(reduced)
            cell_signal.local_norms(reduced)
            now = time.perf_counter()
            cell_signal.time(now - last[0], 0.0)  # this rank's step time, out with the next step
            last[0] = now
        elif arm == "train cell":
            cells[arm](ids, ids)[0].asnumpy()
        else:
            cells["train cell"](ids, ids)[0].asnumpy()
            count[0] += 1
            if arm.endswith("signal") and count[0] % every == 0:
                _sum(signal.tensor())

    arms = ["train cell", "train cell + signal", "+ signal, no local norm", "loop", "loop + signal"]
    for arm in arms:  # compile
        for _ in range(3):
            run(arm)
    out: dict[str, dict[str, list[float]]] = {a: {"step": [], "training": [], "other": []} for a in arms}
    for r in range(rounds):
        for arm in arms[r % len(arms) :] + arms[: r % len(arms)]:
            before = threadcpu.snapshot()
            t0 = time.perf_counter()
            for _ in range(steps):
                run(arm)
            out[arm]["step"].append((time.perf_counter() - t0) / steps)
            cpu = threadcpu.by_group(before, threadcpu.snapshot(), training=threading.get_native_id())
            out[arm]["training"].append(cpu["training"] / steps)
            out[arm]["other"].append((cpu["other"] + cpu["mindwatch"]) / steps)
    if rank == 0:
        print("SIGNAL_BENCH " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
