"""Cost of monitoring: the callback's hot path per step, and the slowdown of the demo training.

Run: ``python -m bench overhead [--rounds 15 --steps 200 --skip 100 --hot-steps 200000 --idle-secs 10]``
(``MINDWATCH_BENCH_QUICK=1`` for a short smoke run; ``--help`` for the options).

1. Hot path: ``on_train_step_begin`` + ``on_train_step_end`` per step, driven with MindSpore's own
   ``RunContext``/callback params, against an empty callback, a naive ``json.dumps`` + ``write`` per
   step, and tensorboardX ``add_scalar`` of the same values, in one run. The train cell's outputs
   are host floats here, so the device sync that reading a Tensor loss needs is excluded (it is
   measured separately, as ``+ Tensor outputs``).
2. Demo slowdown: the demo model (GRAPH mode, CPU) trained in rotating rounds on one compiled
   network with no callback, with a callback that only reads the loss each step (what any
   per-step logger does, MindSpore's LossMonitor included: the peer), and with mindwatch (all
   default metrics); median step times and paired per-round ratios, from step ``--skip`` of each round on.
   Next to them, CPU time per thread (:mod:`bench.threadcpu`): the training thread, the arm's own
   step hooks on it (timed from inside), mindwatch's threads and MindSpore's (all others). CPU
   time hardly moves with the machine's load; wall ratios on a shared machine do. The callback's
   wall time minus its CPU time is what its hooks waited: for the GIL, for a core, for the device.
3. Idle: CPU per second of mindwatch's threads while no record comes (compiling; stalled).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass
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


@dataclass
class Round:
    """One arm's round of the demo, from step ``skip`` on."""

    step: float  # mean seconds per step
    steps: int
    seconds: float  # wall seconds
    cpu: dict[str, float]  # CPU seconds per thread group (bench.threadcpu.by_group)
    hook_cpu: float  # CPU seconds in the arm's own step hooks, on the training thread
    hook_wall: float  # wall seconds in them (CPU + waiting for the GIL, the CPU or a device sync)


class HookClock:
    """Times a callback's step hooks from inside: ``time.thread_time_ns`` and ``perf_counter_ns`` around each call."""

    def __init__(self) -> None:
        self.cpu_ns = self.wall_ns = 0

    def wrap(self, callback) -> None:
        for name in ("on_train_step_begin", "on_train_step_end"):
            setattr(callback, name, self._timed(getattr(callback, name)))

    def _timed(self, hook):
        def timed(run_context):
            wall, cpu = time.perf_counter_ns(), time.thread_time_ns()
            hook(run_context)
            self.cpu_ns += time.thread_time_ns() - cpu
            self.wall_ns += time.perf_counter_ns() - wall

        return timed


def _step_timer(skip: int, steps: int):
    """A callback, last in the list: step end times, and the CPU of every thread between step ``skip`` and the last."""
    from mindspore.train import Callback

    from bench import threadcpu

    class StepTimer(Callback):
        def __init__(self, clock: HookClock) -> None:
            self.clock = clock
            self.ends: list[float] = []
            self.cpu: dict[str, float] = {}
            self._before: threadcpu.Snapshot = {}
            self._hooks = (0, 0)

        def on_train_step_end(self, run_context):
            self.ends.append(time.perf_counter())
            step = run_context.original_args().cur_step_num
            if step == skip:
                self._hooks = (self.clock.cpu_ns, self.clock.wall_ns)
                self._before = threadcpu.snapshot()
            elif step == steps:  # before on_train_end: mindwatch's threads are still alive
                self.cpu = threadcpu.by_group(self._before, threadcpu.snapshot(), training=threading.get_native_id())

        def result(self) -> Round:
            ends = self.ends[skip - 1 :]
            n = len(ends) - 1
            cpu0, wall0 = self._hooks
            hook_cpu, hook_wall = (self.clock.cpu_ns - cpu0) / 1e9, (self.clock.wall_ns - wall0) / 1e9
            return Round(float(np.mean(np.diff(ends))), n, ends[-1] - ends[0], self.cpu, hook_cpu, hook_wall)

    return StepTimer


def rotating_rounds(arms: dict, steps: int, rounds: int, skip: int) -> dict[str, list[Round]]:
    """Train each arm ``rounds`` times, the arms in rotating order, and time each round from step ``skip`` on.

    ``arms``: ``{name: (model, dataset, callbacks)}``, where ``callbacks(tmp_dir)`` returns the arm's callbacks
    (timed from inside by :class:`HookClock`). Each model is trained once before the rounds (compiled, warm), with the
    callbacks of the last arm that uses it.
    """
    timer_class = _step_timer(skip, steps)
    names = list(arms)
    with tempfile.TemporaryDirectory() as tmp:  # warm-up with the model's last arm: what it switches on is compiled in
        for model, dataset, callbacks in {id(a[0]): a for a in arms.values()}.values():
            model.train(1, dataset, callbacks=[*callbacks(tmp), timer_class(HookClock())], dataset_sink_mode=False)
    results: dict[str, list[Round]] = {arm: [] for arm in names}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for arm in names[r % len(names) :] + names[: r % len(names)]:  # each arm goes first, second, third in turn
                model, dataset, callbacks = arms[arm]
                clock = HookClock()
                timer = timer_class(clock)
                extra = callbacks(tmp)
                for cb in extra:
                    clock.wrap(cb)
                model.train(1, dataset, callbacks=[*extra, timer], dataset_sink_mode=False)
                results[arm].append(timer.result())
    return results


def demo_slowdown(steps: int, rounds: int, skip: int) -> dict[str, list[Round]]:
    """Each arm's rounds: no callback, a loss reader (the peer), mindwatch; arms rotate; figures from step ``skip`` on."""
    from mindspore.train import Callback

    from mindwatch.demo.train import DemoSettings, build_training
    from mindwatch.mindspore import MonitorCallback

    class ReadLoss(Callback):
        """What any per-step loss logger does, MindSpore's LossMonitor included: the loss on the host."""

        def on_train_step_begin(self, run_context):
            pass

        def on_train_step_end(self, run_context):
            out = run_context.original_args().net_outputs
            (out[0] if isinstance(out, (tuple, list)) else out).asnumpy()

    # the plain demo cell: per-layer statistics have their own benchmark (python -m bench layers)
    settings = DemoSettings(steps=steps * (3 * rounds + 1), mode="graph", layer_stats=False)
    model, dataset = build_training(settings)
    dataset = dataset.take(steps)  # the lr schedule covers every round; each round trains `steps` batches
    arms = {
        "no callback": (model, dataset, lambda tmp: []),
        "loss reader": (model, dataset, lambda tmp: [ReadLoss()]),
        "mindwatch": (model, dataset, lambda tmp: [MonitorCallback({"save_dir": tmp, "interval": 3600})]),
    }
    return rotating_rounds(arms, steps, rounds, skip)


def idle_cpu(seconds: float) -> dict[str, float]:
    """CPU per second of mindwatch's threads while no record comes: before the first step, and stalled after steps."""
    from bench import threadcpu
    from mindwatch.config import load_config
    from mindwatch.session import RunSession
    from mindwatch.system import host_memory_sampler

    def mindwatch_cpu() -> float:
        before = threadcpu.snapshot()
        time.sleep(seconds)
        return threadcpu.by_group(before, threadcpu.snapshot(), training=threading.get_native_id())["mindwatch"] / seconds

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        session = RunSession.start(load_config({"save_dir": tmp, "interval": 3600}), samplers=[host_memory_sampler()])
        if session.watchdog is not None:
            session.watchdog.started = time.perf_counter()
        time.sleep(0.5)
        out["before the first step (compiling)"] = mindwatch_cpu()
        for step in range(1, 6):
            session.monitor.record({"step": step, "t": time.time(), "loss": 2.0})
            if session.watchdog is not None:
                session.watchdog.last_beat = time.perf_counter()
            time.sleep(0.01)
        time.sleep(0.5)
        out["stalled after 5 steps"] = mindwatch_cpu()
        session.close()
    return out


def call_seconds(fn, times: int) -> list[float]:  # noqa: ANN001
    """The wall seconds of each of ``times`` calls of ``fn()``."""
    seconds = []
    for _ in range(times):
        began = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - began)
    return seconds


def spread(xs: list[float], digits: int = 4) -> str:
    """``median, mean, min, max`` of ``xs`` (ratios of rounds): the mean beside the median shows a skewed round."""
    xs = list(xs)
    return ", ".join(
        f"{k} {v:.{digits}f}"
        for k, v in (("median", statistics.median(xs)), ("mean", statistics.fmean(xs)), ("min", min(xs)), ("max", max(xs)))
    )


def report_demo(results: dict[str, list[Round]], steps: int, rounds: int, skip: int) -> None:
    print(f"demo training (GRAPH, CPU), {rounds} rotating rounds x {steps} steps, figures from step {skip} on:")
    print_rounds(results)
    print_cpu_table(results)
    _demo_ratios(results)


def print_rounds(results: dict[str, list[Round]]) -> None:
    """Each arm's mean step time, round by round, and its median."""
    for arm, rs in results.items():
        ts = [r.step for r in rs]
        per_round = ", ".join(f"{x * 1e3:.1f}" for x in ts)
        mid, mean = statistics.median(ts) * 1e3, statistics.fmean(ts) * 1e3
        print(f"  {arm:12s} mean step per round {per_round} ms  (median {mid:.2f} ms, mean {mean:.2f} ms)")


def print_cpu_table(results: dict[str, list[Round]]) -> None:
    """CPU per step and per second of each thread group, per arm (medians over the rounds)."""
    print("  CPU per step (median over rounds), by thread; per second in brackets:")
    columns = ("training", "its callback", "mindwatch*", "other (MindSpore)")
    print(f"  {'arm':12s} " + " ".join(f"{c:>18s}" for c in columns) + "   callback wall-CPU")
    for arm, rs in results.items():

        def cell(per_round: list[tuple[float, Round]]) -> str:
            per_step = statistics.median(v / r.steps for v, r in per_round) * 1e3
            per_sec = statistics.median(v / r.seconds for v, r in per_round) * 1e3
            return f"{per_step:7.3f} ms ({per_sec:5.1f})"

        wait = statistics.median((r.hook_wall - r.hook_cpu) / r.steps for r in rs) * 1e6
        cells = [cell([(r.cpu["training"], r) for r in rs]), cell([(r.hook_cpu, r) for r in rs])]
        cells += [cell([(r.cpu["mindwatch"], r) for r in rs]), cell([(r.cpu["other"], r) for r in rs])]
        print(f"  {arm:12s} " + " ".join(f"{c:>18s}" for c in cells) + f"   {wait:7.1f} us/step")


def paired_ratios(results: dict[str, list[Round]], pairs: dict[str, tuple[str, str]]) -> None:
    """Print ``b / a`` of the mean step time, round by round, for each ``name: (a, b)``."""
    for name, (a, b) in pairs.items():
        xs = [y.step / x.step for x, y in zip(results[a], results[b], strict=True)]
        print(f"  paired wall ratio {name:26s} {spread(xs)}")


def _demo_ratios(results: dict[str, list[Round]]) -> None:
    off, peer, mw = (results[a] for a in ("no callback", "loss reader", "mindwatch"))
    paired_ratios(
        results,
        {
            "loss reader / no callback": ("no callback", "loss reader"),
            "mindwatch / no callback": ("no callback", "mindwatch"),
            "mindwatch / loss reader": ("loss reader", "mindwatch"),
        },
    )
    extra = [(m.cpu["mindwatch"] + m.hook_cpu - p.hook_cpu) / m.steps for p, m in zip(peer, mw, strict=True)]
    print(
        f"  mindwatch's CPU above the loss reader's (its threads + its hooks - the reader's hooks): "
        f"median {statistics.median(extra) * 1e3:.3f} ms/step"
    )
    print("  (targets: mindwatch* <= 0.1 ms CPU/step; wall ratio mindwatch / loss reader <= 1.01, median of >= 15 rounds;")
    print("   wall ratios on a shared machine are noise: trust the CPU columns there)")


def round_options(parser, argv: list[str] | None):
    """Add --rounds, --steps and --skip (the issue's defaults; short ones with MINDWATCH_BENCH_QUICK=1) and parse."""
    parser.add_argument("--rounds", type=int, default=3 if QUICK else 15, help="rotating rounds (0: skip the demo)")
    parser.add_argument("--steps", type=int, default=120 if QUICK else 200, help="steps per round")
    parser.add_argument("--skip", type=int, default=20 if QUICK else 100, help="figures from this step of a round on")
    args = parser.parse_args(argv or [])
    if not 1 <= args.skip < args.steps:
        parser.error(f"--skip must be between 1 and --steps - 1 (got {args.skip} with --steps {args.steps})")
    return args


def main(argv: list[str] | None = None) -> None:
    import argparse
    import logging

    parser = argparse.ArgumentParser(prog="python -m bench overhead", description=__doc__.splitlines()[0])
    parser.add_argument("--hot-steps", type=int, default=20_000 if QUICK else 200_000, help="hot path steps (0: skip it)")
    parser.add_argument("--idle-secs", type=float, default=2.0 if QUICK else 10.0, help="seconds per idle phase (0: skip)")
    args = round_options(parser, argv)
    logging.getLogger("mindwatch").setLevel(logging.WARNING)
    if args.hot_steps:
        report_hot_path(args.hot_steps)
    if args.idle_secs:
        print(f"idle, no record comes ({args.idle_secs:g} s each): CPU of mindwatch's threads per second")
        for phase, cpu in idle_cpu(args.idle_secs).items():
            print(f"  {phase:36s} {cpu * 1e3:7.3f} ms/s   (target <= 1 ms/s)")
    if args.rounds:
        report_demo(demo_slowdown(args.steps, args.rounds, args.skip), args.steps, args.rounds, args.skip)


def report_hot_path(steps: int) -> None:
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
