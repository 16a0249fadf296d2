"""Cost of monitoring: the callback's hot path per step, and the slowdown of the demo training.

Run: ``python -m bench overhead`` (``MINDWATCH_BENCH_QUICK=1`` for a short smoke run).

1. Hot path: ``on_train_step_begin`` + ``on_train_step_end`` per step, driven with MindSpore's own
   ``RunContext``/callback params, against an empty callback, a naive ``json.dumps`` + ``write`` per
   step, and tensorboardX ``add_scalar`` of the same values, in one run. The train cell's outputs
   are host floats here, so the device sync that reading a Tensor loss needs is excluded (it is
   measured separately, as ``+ Tensor outputs``).
2. Demo slowdown: the demo model (GRAPH mode, CPU) trained in rotating rounds on one compiled
   network with no callback, with a callback that only reads the loss each step (what any
   per-step logger does, MindSpore's LossMonitor included: the peer), and with mindwatch (all
   default metrics); median step times and paired per-round ratios.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

QUICK = os.environ.get("MINDWATCH_BENCH_QUICK") == "1"


def _run_context(outputs):
    from mindspore.train.callback import RunContext, _InternalCallbackParam

    cb = _InternalCallbackParam()
    cb.cur_step_num, cb.cur_epoch_num = 0, 1
    cb.net_outputs = outputs
    cb.train_network = cb.optimizer = cb.network = None
    cb.train_dataset_element = (np.zeros((16, 64), np.int32), np.zeros((16, 64), np.int32))
    return RunContext(cb), cb


def _drive(callback, steps: int, outputs, chunk: int = 1000) -> tuple[float, float | None]:
    """Seconds per step of the begin+end hooks; for mindwatch also the worker's seconds per record.

    mindwatch's worker thread is held back while the hooks run, so the first figure is the training
    thread's own cost; every ``chunk`` steps the worker's drain runs (timed apart), so the queue stays
    as short as it is in a real training, where steps take milliseconds.
    """
    from mindwatch.monitor.worker import Monitor

    rc, cb = _run_context(outputs)
    start = Monitor.start
    Monitor.start = lambda self: self  # type: ignore[method-assign]
    try:
        callback.on_train_begin(rc)
    finally:
        Monitor.start = start  # type: ignore[method-assign]
    session = getattr(callback, "session", None)
    begin, end = callback.on_train_step_begin, callback.on_train_step_end
    hooks = worker = 0.0
    for first in range(1, steps + 1, chunk):
        t0 = time.perf_counter()
        for step in range(first, min(first + chunk, steps + 1)):
            cb.cur_step_num = step
            begin(rc)
            end(rc)
        t1 = time.perf_counter()
        if session is not None:
            session.monitor._drain()
            worker += time.perf_counter() - t1
        hooks += t1 - t0
    if session is not None:
        session.monitor.start()
    callback.on_train_end(rc)
    return hooks / steps, (worker / steps if session is not None else None)


def hot_path(steps: int) -> dict[str, float]:
    import mindspore as ms
    from mindspore.train import Callback
    from tensorboardX import SummaryWriter

    from mindwatch.mindspore import MonitorCallback

    floats = (2.31, 0.93, 1e-4)
    values = {"loss": 2.31, "grad_norm": 0.93, "lr": 1e-4, "step_time": 0.08, "data_time": 0.001, "tokens_per_second": 12000.0}

    class Empty(Callback):
        def on_train_step_begin(self, run_context):
            pass

        def on_train_step_end(self, run_context):
            pass

    class NaiveJson(Callback):
        def __init__(self, path: Path) -> None:
            self.f = open(path, "a")  # noqa: SIM115

        def on_train_step_end(self, run_context):
            cb = run_context.original_args()
            self.f.write(json.dumps({"step": cb.cur_step_num, **values}) + "\n")

    class TensorboardX(Callback):
        def __init__(self, logdir: str) -> None:
            self.w = SummaryWriter(logdir)

        def on_train_step_end(self, run_context):
            step = run_context.original_args().cur_step_num
            for k, v in values.items():
                self.w.add_scalar(k, v, step)

        def on_train_end(self, run_context):
            self.w.close()

    class Declared:  # a train network that names its outputs, as TrainOneStepWithGradNorm does
        mindwatch_outputs = ("loss", "grad_norm", "lr")

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        mw_config = {"save_dir": tmp, "interval": 3600, "queue_size": steps + 100}

        def mindwatch_cb():
            cb = MonitorCallback(mw_config)
            orig = cb.on_train_begin

            def begin(rc):
                rc.original_args().train_network = Declared()
                orig(rc)

            cb.on_train_begin = begin
            return cb

        tensor_outputs = (ms.Tensor(2.31, ms.float32), ms.Tensor(0.93, ms.float32), ms.Tensor(1e-4, ms.float32))
        contenders = {
            "empty callback": lambda: (Empty(), floats),
            "mindwatch": lambda: (mindwatch_cb(), floats),
            "mindwatch + Tensor outputs (3 device reads)": lambda: (mindwatch_cb(), tensor_outputs),
            "naive json.dumps+write": lambda: (NaiveJson(Path(tmp) / "naive.jsonl"), floats),
            "tensorboardX add_scalar x6": lambda: (TensorboardX(str(Path(tmp) / "tbx")), floats),
        }
        for name, make in contenders.items():
            n = steps // 50 if name.startswith("tensorboardX") else steps
            runs = []
            for _ in range(3):
                cb, outputs = make()
                runs.append(_drive(cb, n, outputs))
            results[name] = min(r[0] for r in runs)
            if runs[0][1] is not None:
                results[f"{name} [worker thread, per record]"] = min(r[1] for r in runs)  # type: ignore[type-var]
    return results


def demo_slowdown(steps: int, rounds: int) -> dict[str, list[float]]:
    """Mean step time per round of each arm: no callback, a loss reader (the peer), mindwatch; arms rotate."""
    from mindspore.train import Callback

    from mindwatch.demo.train import DemoSettings, build_training
    from mindwatch.mindspore import MonitorCallback

    class StepTimer(Callback):
        def __init__(self) -> None:
            self.ends: list[float] = []

        def on_train_step_end(self, run_context):
            self.ends.append(time.perf_counter())

        def mean_step(self, skip: int = 5) -> float:
            return float(np.mean(np.diff(self.ends[skip:])))

    class ReadLoss(Callback):
        """What any per-step loss logger does, MindSpore's LossMonitor included: the loss on the host."""

        def on_train_step_end(self, run_context):
            out = run_context.original_args().net_outputs
            (out[0] if isinstance(out, (tuple, list)) else out).asnumpy()

    arms = ("no callback", "loss reader", "mindwatch")
    model, dataset = build_training(DemoSettings(steps=steps * (len(arms) * rounds + 1), mode="graph"))
    dataset = dataset.take(steps)  # the lr schedule covers every round; each round trains `steps` batches
    model.train(1, dataset, callbacks=[StepTimer()], dataset_sink_mode=False)  # compile once, warm up
    times: dict[str, list[float]] = {arm: [] for arm in arms}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for arm in arms[r % len(arms) :] + arms[: r % len(arms)]:  # each arm goes first, second, third in turn
                timer = StepTimer()
                if arm == "mindwatch":
                    extra = [MonitorCallback({"save_dir": tmp, "interval": 3600})]
                else:
                    extra = [ReadLoss()] if arm == "loss reader" else []
                model.train(1, dataset, callbacks=[*extra, timer], dataset_sink_mode=False)
                times[arm].append(timer.mean_step())
    return times


def main() -> None:
    import logging

    logging.getLogger("mindwatch").setLevel(logging.WARNING)
    steps = 20_000 if QUICK else 200_000
    res = hot_path(steps)
    empty = res["empty callback"]
    print(f"hot path, {steps:,} steps (tensorboardX: {steps // 50:,}), best of 3, per step:")
    for name, dt in res.items():
        if "worker" in name:
            print(f"  {name:56s} {dt * 1e6:8.2f} us   (off the training thread)")
            continue
        extra = f"{dt / res['mindwatch']:6.1f}x mindwatch" if name != "mindwatch" else ""
        print(f"  {name:56s} {dt * 1e6:8.2f} us   (above empty: {(dt - empty) * 1e6:7.2f} us) {extra}")
    print(f"  mindwatch cost above an empty callback: {(res['mindwatch'] - empty) * 1e6:.2f} us/step (target <= 5 us)")

    demo_steps, rounds = (60, 3) if QUICK else (150, 9)
    times = demo_slowdown(demo_steps, rounds)
    off = times["no callback"]
    print(f"demo training (GRAPH, CPU), {rounds} rounds x {demo_steps} steps, mean step time per round (arms rotate):")
    for arm, ts in times.items():
        print(f"  {arm:12s} {', '.join(f'{x * 1e3:.1f}' for x in ts)} ms  (median {statistics.median(ts) * 1e3:.2f} ms)")
    for arm in ("loss reader", "mindwatch"):
        paired = statistics.median(b / a for a, b in zip(off, times[arm], strict=True))
        print(f"  {arm} / no callback: median paired ratio {paired:.4f} ({(paired - 1) * 100:+.2f} %)")
    paired = statistics.median(b / a for a, b in zip(times["loss reader"], times["mindwatch"], strict=True))
    print(f"  mindwatch / loss reader (the least a per-step logger costs): median paired ratio {paired:.4f}")
    print("  (target: <= 2 % slowdown)")
