"""Cost of per-layer statistics on the demo (GRAPH, CPU): layer_stats off, ``layers.every: 10`` and ``every: 1``.

Run: ``python -m bench layers [--rounds 15 --steps 200 --skip 100]`` (``MINDWATCH_BENCH_QUICK=1``: a short run).

Every arm trains the demo model with mindwatch's callback (default config) in rotating rounds; the
off arm's train cell has no ``layer_stats``, the other two share one compiled cell with them (docs/layers.md).
Printed: each arm's mean step time per round, CPU per thread (:mod:`bench.threadcpu`), and the paired
per-round wall ratios against the off arm (targets: every=10 <= 1.01, every=1 <= 1.03).
"""

from __future__ import annotations

import logging

from bench.bench_overhead import paired_ratios, print_cpu_table, print_rounds, rotating_rounds, round_options


def layer_rounds(steps: int, rounds: int, skip: int):
    from mindwatch.demo.train import DemoSettings, build_training
    from mindwatch.mindspore import MonitorCallback

    def monitor(every: int, histogram_every: int | None = 100):
        layers = {"every": every, "histogram_every": histogram_every}
        return lambda tmp: [MonitorCallback({"save_dir": tmp, "interval": 3600, "layers": layers})]

    total = steps * (4 * rounds + 1)
    off, off_data = build_training(DemoSettings(steps=total, mode="graph", layer_stats=False))
    on, on_data = build_training(DemoSettings(steps=total, mode="graph", layer_stats=True))
    bare, bare_data = build_training(DemoSettings(steps=total, mode="graph", layer_stats=True))
    off_data, on_data, bare_data = off_data.take(steps), on_data.take(steps), bare_data.take(steps)
    arms = {
        "layer_stats off": (off, off_data, monitor(10)),
        "every=10, no histograms": (bare, bare_data, monitor(10, None)),
        "every=1": (on, on_data, monitor(1)),
        "every=10": (on, on_data, monitor(10)),
    }
    return rotating_rounds(arms, steps, rounds, skip)


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m bench layers", description=__doc__.splitlines()[0])
    args = round_options(parser, argv)
    logging.getLogger("mindwatch").setLevel(logging.WARNING)
    results = layer_rounds(args.steps, args.rounds, args.skip)
    head = f"{args.rounds} rotating rounds x {args.steps} steps, from step {args.skip}"
    print(f"demo training with per-layer statistics (GRAPH, CPU), {head}:")
    print_rounds(results)
    print_cpu_table(results)
    paired_ratios(
        results,
        {
            "every=10 / off": ("layer_stats off", "every=10"),
            "every=10, no histograms / off": ("layer_stats off", "every=10, no histograms"),
            "every=1 / off": ("layer_stats off", "every=1"),
        },
    )
    print(
        "  (targets: every=10 <= 1.01, every=1 <= 1.03; wall ratios on a shared machine are noise: trust the CPU columns there)"
    )
