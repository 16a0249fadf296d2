"""Where the cost of per-layer statistics goes: the demo's train cell called directly, one graph or two.

Run: ``python -m bench layer_graphs [--rounds 10 --steps 100]``.

Without ``Model`` or a callback, each arm calls a demo train cell (GRAPH, CPU) in a loop, the arms in
rotating rounds; printed are the median step, CPU of the process, and the paired per-round ratios
against a cell without ``layer_stats``:

- ``off, a twin``: a second, identical cell without ``layer_stats`` (the noise floor);
- ``plain graph``: ``layer_stats=True``, never measuring (the graph compiled without the work);
- ``measure every 10`` / ``measure every step``: ``measure_layers`` as the callback calls it;
- ``switch every 10`` / ``switch every 2``: the plain graph, and every N-th step the branch graph (its
  flag off), so nothing is measured by either: what switching between two graphs costs by itself.
"""

from __future__ import annotations

import time

import numpy as np

from bench.bench_overhead import spread


class Pattern:
    """Calls ``cell``: measuring every ``every`` steps, or (``switch``) the branch graph with its flag off instead."""

    def __init__(self, cell, every: int, switch: bool = False) -> None:
        self.cell, self.every, self.switch, self.n = cell, every, switch, 0

    def __call__(self, *batch):
        self.n += 1
        on = self.every > 0 and self.n % self.every == 0
        if self.switch:
            return self.cell(*batch, measure=None) if on else self.cell(*batch, measure=False)
        self.cell.measure_layers(on)
        return self.cell(*batch)


def arms(steps: int):
    from mindwatch.demo.train import DemoSettings, build_training

    def cell(layer_stats: bool):
        model, data = build_training(DemoSettings(steps=steps, mode="graph", layer_stats=layer_stats))
        net = model._train_network
        net.set_train()
        return net, next(data.create_tuple_iterator())

    made = {"layer_stats off": cell(False), "off, a twin": cell(False)}
    for name, every, switch in (
        ("plain graph", 0, False),
        ("measure every 10", 10, False),
        ("measure every step", 1, False),
        ("switch every 10", 10, True),
        ("switch every 2", 2, True),
    ):
        net, batch = cell(True)
        made[name] = (Pattern(net, every, switch), batch)
    return made


def main(argv: list[str] | None = None) -> None:
    import argparse
    import logging

    parser = argparse.ArgumentParser(prog="python -m bench layer_graphs", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="rotating rounds")
    parser.add_argument("--steps", type=int, default=100, help="steps per round")
    args = parser.parse_args(argv or [])
    logging.getLogger("mindwatch").setLevel(logging.WARNING)
    made = arms(steps=(args.rounds + 1) * args.steps + 100)  # the learning-rate schedule covers every call
    for step, batch in made.values():
        for _ in range(20):  # compiled, warm
            step(*batch)
    names = list(made)
    wall: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            step, batch = made[name]
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(args.steps):
                float(step(*batch)[0].asnumpy())
            wall[name].append((time.perf_counter() - t0) / args.steps * 1e3)
            cpu[name].append((time.process_time() - c0) / args.steps * 1e3)
    base = names[0]
    print(f"demo train cell called directly (GRAPH, CPU), {args.rounds} rotating rounds x {args.steps} steps:")
    for name in names:
        ratios = [a / b for a, b in zip(wall[name], wall[base], strict=True)]
        cpu_ratio = float(np.median([a / b for a, b in zip(cpu[name], cpu[base], strict=True)]))
        print(
            f"  {name:20s} step {np.median(wall[name]):6.2f} ms, process CPU {np.median(cpu[name]):6.2f} ms;"
            f" against off: wall {spread(ratios, 3)}; CPU median {cpu_ratio:.3f}"
        )
