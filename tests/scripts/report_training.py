"""Real small trainings for the report/check/export/tail tests: finished, failed or killed.

    python tests/scripts/report_training.py finished SAVE_DIR   # PyNative, attention entropy, ends normally
    python tests/scripts/report_training.py failed SAVE_DIR     # loss NaN from step 5 on, the data source raises at step 9
    python tests/scripts/report_training.py killed SAVE_DIR     # runs until killed; prints "STEP n" per step

Each prints "RUN_DIR <path>" once the run directory exists.
"""

import sys
import time

import mindspore as ms
import numpy as np
from mindspore import dataset as ds
from mindspore import nn
from mindspore.train import Callback, Model

from mindwatch.demo.corpus import ByteWindows, stdlib_corpus
from mindwatch.demo.model import GPTConfig, LanguageModelLoss, TinyGPT
from mindwatch.demo.train import lr_schedule, set_mode
from mindwatch.mindspore import MonitorCallback, TrainOneStepWithGradNorm

BATCH, SEQ = 8, 32
POISON_STEP, RAISE_STEP, FINISHED_STEPS = 5, 9, 16
TRAINED = [0]  # steps finished so far (the data pipeline prefetches: it waits for the training to get there)


class PoisonedLoss(nn.Cell):
    """The language-model loss times a per-batch factor from the data: NaN there makes the run diverge."""

    def __init__(self, loss_net: nn.Cell) -> None:
        super().__init__()
        self.loss_net = loss_net

    def construct(self, ids, targets, factor):
        return self.loss_net(ids, targets) * factor.mean()


class FailingWindows:
    """Byte windows with a factor column: NaN from the batch of POISON_STEP on (every loss NaN: the train cell skips
    a NaN update, so one NaN batch alone would not keep the run NaN); the source raises at RAISE_STEP."""

    def __init__(self, steps: int) -> None:
        self.windows = ByteWindows(stdlib_corpus(200_000), SEQ, steps * BATCH, seed=2)

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, i: int):
        step = i // BATCH + 1
        if step >= RAISE_STEP:
            deadline = time.time() + 60
            while TRAINED[0] < RAISE_STEP - 1 and time.time() < deadline:
                time.sleep(0.01)
            raise OSError(f"corrupt shard: cannot read sample {i}")
        ids, targets = self.windows[i]
        return ids, targets, np.array([np.nan if step >= POISON_STEP else 1.0], np.float32)


class SlowWindows:
    def __init__(self, steps: int) -> None:
        self.windows = ByteWindows(stdlib_corpus(200_000), SEQ, steps * BATCH, seed=3)

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, i: int):
        if i % BATCH == 0:
            time.sleep(0.05)
        return self.windows[i]


class PrintSteps(Callback):
    def on_train_step_end(self, run_context):
        TRAINED[0] = run_context.original_args().cur_step_num
        print(f"STEP {run_context.original_args().cur_step_num}", flush=True)


def main(kind: str, save_dir: str) -> None:
    set_mode("pynative" if kind == "finished" else "graph")
    ms.set_seed(0)
    net = LanguageModelLoss(TinyGPT(GPTConfig(seq_length=SEQ, layers=1, d_model=32, heads=2)))
    steps = {"finished": FINISHED_STEPS, "failed": 40, "killed": 5000}[kind]
    opt = nn.AdamWeightDecay(net.trainable_params(), learning_rate=lr_schedule(steps, 3e-3, 4))
    metrics = ["loss", "lr", "grad_norm", "step_time", "data_time", "throughput", "memory_usage"]
    if kind == "finished":
        metrics.append("attention_entropy")
        source, columns = ByteWindows(stdlib_corpus(200_000), SEQ, steps * BATCH, seed=1), ["ids", "targets"]
    elif kind == "failed":
        net = PoisonedLoss(net)
        source, columns = FailingWindows(steps), ["ids", "targets", "factor"]
    else:
        source, columns = SlowWindows(steps), ["ids", "targets"]
    dataset = ds.GeneratorDataset(source, columns, shuffle=False).batch(BATCH, drop_remainder=True)
    monitor = MonitorCallback(
        {
            "save_dir": save_dir,
            "project": "report-tests",
            "run_name": kind,
            "interval": 1000,
            "flush_secs": 0.5,
            "metrics": metrics,
            "attention_entropy": {"every": 2},
            "tags": {"kind": kind, "model": "tiny-gpt"},
            "checks": ["final(loss) < first(loss)", "nonfinite(loss) == 0"],
        }
    )
    model = Model(TrainOneStepWithGradNorm(net, opt, max_grad_norm=1.0))
    announced = []

    class Announce(Callback):
        def on_train_begin(self, run_context):
            if not announced:
                announced.append(True)
                print(f"RUN_DIR {monitor.run_dir}", flush=True)

    model.train(1, dataset, callbacks=[monitor, Announce(), PrintSteps()], dataset_sink_mode=False)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
