"""Cost of a profile while it runs (the ``profile`` action) on the demo (GRAPH, CPU): the profiled steps' time against
the steps before them.

Run: ``python -m bench profile [--steps 240 --profile-steps 5]``

The demo trains ``--steps`` steps with mindwatch's callback; at three steps (a fifth, a half and four fifths of the way)
a callback files a ``mindwatch profile`` request (``store.requests.file_request``, as the command does), so the run takes
three profiles (``profile.max``). For each, the profiled steps' mean ``step_time`` against the mean of the 20 steps
before its first step (``store.profiles.step_times``), and the wall seconds from request to the first profiled step.
Before the first request no profiler object exists: the steps before it are the demo's own.
"""

from __future__ import annotations

import logging
import statistics
import tempfile


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m bench profile", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=240, help="demo training steps")
    parser.add_argument("--profile-steps", type=int, default=5, help="steps each profile records")
    args = parser.parse_args(argv or [])
    logging.getLogger("mindwatch").setLevel(logging.WARNING)

    from mindspore.train import Callback

    import mindwatch
    from mindwatch.demo.train import DemoSettings, build_training
    from mindwatch.mindspore import MonitorCallback
    from mindwatch.store.profiles import step_times
    from mindwatch.store.requests import file_request

    at = [args.steps // 5, args.steps // 2, 4 * args.steps // 5]
    model, data = build_training(DemoSettings(steps=args.steps, mode="graph", layer_stats=False))

    class Ask(Callback):
        def __init__(self, monitor: MonitorCallback) -> None:
            self.monitor = monitor

        def on_train_step_end(self, run_context) -> None:  # noqa: ANN001
            if run_context.original_args().cur_step_num in at:
                file_request(self.monitor.run_dir, "profile", steps=args.profile_steps, reason="bench")

    with tempfile.TemporaryDirectory() as tmp:
        monitor = MonitorCallback({"save_dir": tmp, "interval": 3600, "profile": {"steps": args.profile_steps}})
        model.train(1, data, callbacks=[monitor, Ask(monitor)], dataset_sink_mode=False)
        run = mindwatch.open_run(monitor.run_dir)
        series = run.series("step_time")
        profiles = run.profiles
    print(f"demo training (GRAPH, CPU), {args.steps} steps; profiles of {args.profile_steps} steps asked after steps {at}:")
    ratios = []
    for p in profiles:
        t = step_times(p, series.step, series.value)
        if t.ratio is None:
            continue
        ratios.append(t.ratio)
        top = p.ranks[0].top_ops[0] if p.ranks[0].top_ops else None
        print(
            f"  steps {p.first_step}-{p.last_step}: {1e3 * t.profiled:.1f} ms a step against {1e3 * t.before:.1f} ms "  # type: ignore[operator]
            f"the 20 before: x {t.ratio:.2f}; top op type {top.op_type if top else '-'} ({p.ranks[0].note.state})"
        )
    if ratios:
        print(f"  profiled / before: median x {statistics.median(ratios):.2f}, mean x {statistics.mean(ratios):.2f}")
