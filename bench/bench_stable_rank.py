"""Cost of the stable rank (``layers.stable_rank_every``) on the demo model (GRAPH, CPU), against its own step.

Run: ``python -m bench stable_rank [--d-model 64 --depth 2 --steps 60 --repeat 20]``

The demo trains ``--steps`` steps with mindwatch's callback and stable ranks off; its median step (wall) is the peer.
Then, on the trained weights, the two halves of a measured step are timed ``--repeat`` times each, as the run does
them: the copy of the weights on the training thread (``StableRanks.attach``), and the arithmetic the worker does
before it writes the step's record (``StableRanks.measure``: ||W||_F^2 and a power iteration warm-started from the
last measurement, as every measurement after the first is). Printed: each half's median and mean (wall and the
thread's CPU), as a share of the median step, and both spread over ``stable_rank_every: 100`` steps. Target (issue
44): a stable-rank step costs at most 5 % of its step.
"""

from __future__ import annotations

import logging
import statistics
import tempfile
import time

EVERY = 100


def stable_rank_cost(model, step: float, repeat: int) -> list[str]:
    """Lines: the two halves of a stable-rank step on ``model``'s trained weights, each timed ``repeat`` times, as a
    share of ``step`` (seconds, the model's median step)."""
    from mindwatch.mindspore.recorder import trained_weights
    from mindwatch.mindspore.stable_rank import StableRanks
    from mindwatch.monitor.worker import DEFERRED

    train_net = model.train_network
    ranks = StableRanks(trained_weights(train_net.optimizer, train_net.network), EVERY)
    shapes = sorted({tuple(p.shape) for p in ranks.params})
    rec: dict = {}
    ranks.attach(rec, 0)
    rec.pop(DEFERRED)()  # the first measurement: from a random vector (a run's first, once)
    copy_wall, copy_cpu, math_wall, math_cpu = [], [], [], []
    for _ in range(repeat):
        w, c = time.perf_counter(), time.thread_time()
        ranks.attach(rec, 0)
        copy_wall.append(time.perf_counter() - w)
        copy_cpu.append(time.thread_time() - c)
        work = rec.pop(DEFERRED)
        w, c = time.perf_counter(), time.thread_time()
        work()
        math_wall.append(time.perf_counter() - w)
        math_cpu.append(time.thread_time() - c)

    def line(what: str, wall: list[float], cpu: list[float]) -> str:
        med = statistics.median(wall)
        return (
            f"  {what:<44} wall median {1e3 * med:8.3f} ms, mean {1e3 * statistics.mean(wall):8.3f} ms; "
            f"CPU median {1e3 * statistics.median(cpu):8.3f} ms  ({100 * med / step:5.2f} % of the step)"
        )

    both = statistics.median(copy_wall) + statistics.median(math_wall)
    return [
        f"  {len(ranks.params)} weight matrices {shapes}",
        line("training thread: copy the weights (attach)", copy_wall, copy_cpu),
        line("worker: ||W||_F^2 + warm power iteration", math_wall, math_cpu),
        f"  a stable-rank step: +{100 * both / step:.2f} % of its step (target <= 5 %); "
        f"the training thread's share +{100 * statistics.median(copy_wall) / step:.2f} %; "
        f"over every={EVERY} steps: +{100 * both / step / EVERY:.4f} % a step",
    ]


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m bench stable_rank", description=__doc__.splitlines()[0])
    parser.add_argument("--d-model", type=int, default=64, help="the demo model's width (the demo's: 64)")
    parser.add_argument("--depth", type=int, default=2, help="the demo model's Transformer blocks (the demo's: 2)")
    parser.add_argument("--steps", type=int, default=60, help="training steps (the step's median from the second half)")
    parser.add_argument("--repeat", type=int, default=20, help="times each half of a measured step is timed")
    args = parser.parse_args(argv or [])
    logging.getLogger("mindwatch").setLevel(logging.WARNING)

    from mindspore.train import Callback

    from mindwatch.demo.train import DemoSettings, build_training
    from mindwatch.mindspore import MonitorCallback

    settings = DemoSettings(steps=args.steps, mode="graph", d_model=args.d_model, layers=args.depth, layer_stats=False)
    model, data = build_training(settings)
    ends: list[float] = []

    class Clock(Callback):
        def on_train_step_end(self, run_context) -> None:  # noqa: ANN001
            ends.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as tmp:
        off = MonitorCallback({"save_dir": tmp, "interval": 3600, "layers": {"stable_rank_every": None}})
        model.train(1, data, callbacks=[off, Clock()], dataset_sink_mode=False)
    steps = [b - a for a, b in zip(ends, ends[1:], strict=False)][len(ends) // 2 :]
    step = statistics.median(steps)
    print(f"demo model d_model={args.d_model} depth={args.depth}:")
    print(f"  median step (stable ranks off, steps {len(ends) // 2}-{len(ends)}): {1e3 * step:.2f} ms")
    for line in stable_rank_cost(model, step, args.repeat):
        print(line)
