"""Cost of per-layer statistics on the demo (GRAPH, CPU): layer_stats off, ``layers.every: 10`` and ``every: 1``, and
``every: 1`` without the optimizer's moments (``adam_m_norm``, ``adam_v_norm``: the demo's AdamWeightDecay).

Run: ``python -m bench layers [--rounds 15 --steps 200 --skip 100] [--d-model 64 --depth 2] [--moe]``
(``MINDWATCH_BENCH_QUICK=1``: a short run; ``--d-model 256 --depth 4 --rounds 5 --steps 40 --skip 10``: a wider
model, to see how the cost scales with the size of the parameters).

Every arm trains the demo model with mindwatch's callback (default config) in rotating rounds; the
off arms' train cells have no ``layer_stats``, the other two share one cell with them (docs/layers.md).
A second off arm, a model identical to the first, shows how far two identical arms drift apart (the
noise floor of the wall ratios). Printed: each arm's mean step time per round, CPU per thread
(:mod:`bench.threadcpu`), and the paired per-round wall ratios against the off arm (targets: every=10 <=
1.01, every=1 <= 1.03), and of every=1 against every=1 without the moments: what the moments add.

``--moe``: the demo's mixture of experts (``mindwatch demo --moe``: a top-2-of-4 MoE feed-forward a block) with its
``RouterStats``, per-layer statistics off: the routing counted never (``metrics`` without ``moe``: the cells' branch not
taken), on every step (``moe.every: 1``: each step a measured one, so its ratio to the off arm is what a measured step's
routing statistics cost; target <= 1.01) and every 10; then the graph alone (the train cell called in a Python loop,
no callback: the counting branch on and off in alternating blocks of 25 steps, the median step of each block); then a
stable-rank step on the trained MoE weights, 3-D experts included (``bench stable_rank``'s halves; target <= 5 % of
its step).
"""

from __future__ import annotations

import logging
import statistics

from bench.bench_overhead import paired_ratios, print_cpu_table, print_rounds, rotating_rounds, round_options


def layer_rounds(steps: int, rounds: int, skip: int, d_model: int = 64, depth: int = 2):
    from mindwatch.demo.train import DemoSettings, build_training
    from mindwatch.mindspore import MonitorCallback

    def monitor(every: int):
        return lambda tmp: [MonitorCallback({"save_dir": tmp, "interval": 3600, "layers": {"every": every}})]

    total = steps * (4 * rounds + 1)

    def training(layer_stats: bool, moments: bool = True):
        settings = DemoSettings(steps=total, mode="graph", layer_stats=layer_stats, d_model=d_model, layers=depth)
        model, data = build_training(settings)
        if not moments:  # the same cell measuring the three statistics of any optimizer, before it compiles
            cell = model.train_network
            cell.layer_stats.moments, cell.mindwatch_layer_moments = None, False
        return model, data.take(steps)

    (off, off_data), (twin, twin_data), (on, on_data) = training(False), training(False), training(True)
    bare, bare_data = training(True, moments=False)
    arms = {
        "layer_stats off": (off, off_data, monitor(10)),
        "off, a twin model": (twin, twin_data, monitor(10)),
        "every=1": (on, on_data, monitor(1)),
        "every=10": (on, on_data, monitor(10)),
        "every=1, no moments": (bare, bare_data, monitor(1)),
    }
    return rotating_rounds(arms, steps, rounds, skip)


def moe_rounds(steps: int, rounds: int, skip: int, d_model: int = 64, depth: int = 2):
    """The demo MoE's arms (see the module docstring) and its model, for the stable-rank step after."""
    from mindwatch.demo.train import DemoSettings, build_training
    from mindwatch.mindspore import MonitorCallback

    base = {"interval": 3600, "layers": {"stable_rank_every": None}}
    no_moe = ["loss", "lr", "grad_norm", "step_time", "data_time", "throughput", "memory_usage"]

    def monitor(every: int | None):
        metrics = {"metrics": no_moe} if every is None else {"moe": {"every": every}}
        return lambda tmp: [MonitorCallback({"save_dir": tmp, **base, **metrics})]

    total = steps * (4 * rounds + 1) + GRAPH_ALONE_STEPS  # the learning rate table covers every step the model takes

    def training():
        settings = DemoSettings(steps=total, mode="graph", layer_stats=False, d_model=d_model, layers=depth, experts=4)
        model, data = build_training(settings)
        return model, data.take(steps)

    (moe, moe_data), (twin, twin_data) = training(), training()
    arms = {
        "routing off": (moe, moe_data, monitor(None)),
        "off, a twin model": (twin, twin_data, monitor(None)),
        "moe.every=1": (moe, moe_data, monitor(1)),
        "moe.every=10": (moe, moe_data, monitor(10)),
    }
    return rotating_rounds(arms, steps, rounds, skip), moe, moe_data


#: Steps :func:`graph_alone` takes (its rounds of two blocks, and the two first steps).
GRAPH_ALONE_STEPS = 12 * 2 * 25 + 2 * 25


def graph_alone(model, data, rounds: int = 12, block: int = 25) -> tuple[list[float], list[float]]:
    """The median step (s) of each block of ``block`` steps with the ``RouterStats`` branch on, and off: the train cell
    called directly (no callback, no recording), the blocks alternating, ``rounds`` of each."""
    import time

    import mindspore as ms
    from mindspore import ops

    from mindwatch.mindspore.router_stats import router_stats_cells

    net = model.train_network
    cells = [cell for _, cell in router_stats_cells(net)]
    it = data.create_tuple_iterator()
    batches = [next(it) for _ in range(block)]

    def run(on: bool) -> float:
        for cell in cells:
            ops.assign(cell.on, ms.Tensor(int(on), ms.int32))
        times = []
        for b in batches:
            t = time.perf_counter()
            net(*b)[0].asnumpy()
            times.append(time.perf_counter() - t)
        return statistics.median(times)

    run(True), run(False)  # both graphs' first steps
    on, off = [], []
    for r in range(rounds):
        for flag in (True, False) if r % 2 else (False, True):
            (on if flag else off).append(run(flag))
    return on, off


def _moe(args) -> None:  # noqa: ANN001
    from bench.bench_stable_rank import stable_rank_cost

    results, model, model_data = moe_rounds(args.steps, args.rounds, args.skip, args.d_model, args.depth)
    head = f"{args.rounds} rotating rounds x {args.steps} steps, from step {args.skip}"
    print(f"demo MoE training (top-2 of 4 experts, d_model {args.d_model}, {args.depth} blocks, GRAPH, CPU), {head}:")
    print_rounds(results)
    print_cpu_table(results)
    paired_ratios(
        results,
        {
            "moe.every=1 / off (each step measured)": ("routing off", "moe.every=1"),
            "moe.every=10 / off": ("routing off", "moe.every=10"),
            "twin / off (noise floor)": ("routing off", "off, a twin model"),
        },
    )
    print("  (target: a measured step's routing statistics <= 1 % of the step: moe.every=1 / off <= 1.01)")
    on, off = graph_alone(model, model_data)
    ratios = [a / b for a, b in zip(on, off, strict=True)]
    print(
        f"the graph alone (no callback), blocks of 25 steps: counting on {1e3 * statistics.median(on):.3f} ms, off "
        f"{1e3 * statistics.median(off):.3f} ms (median of the blocks' medians); paired ratio median "
        f"{statistics.median(ratios):.4f}, mean {statistics.mean(ratios):.4f}"
    )
    step = statistics.median(r.step for r in results["routing off"])
    print(f"a stable-rank step on the trained MoE weights (the rounds' median mean step, routing off: {1e3 * step:.2f} ms):")
    for line in stable_rank_cost(model, step, 20):
        print(line)


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m bench layers", description=__doc__.splitlines()[0])
    parser.add_argument("--d-model", type=int, default=64, help="the demo model's width (the demo's: 64)")
    parser.add_argument("--depth", type=int, default=2, help="the demo model's Transformer blocks (the demo's: 2)")
    parser.add_argument("--moe", action="store_true", help="the demo's mixture of experts: the routing statistics' cost")
    args = round_options(parser, argv)
    logging.getLogger("mindwatch").setLevel(logging.WARNING)
    if args.moe:
        _moe(args)
        return
    results = layer_rounds(args.steps, args.rounds, args.skip, args.d_model, args.depth)
    head = f"{args.rounds} rotating rounds x {args.steps} steps, from step {args.skip}"
    print(f"demo training (d_model {args.d_model}, {args.depth} blocks) with per-layer statistics (GRAPH, CPU), {head}:")
    print_rounds(results)
    print_cpu_table(results)
    paired_ratios(
        results,
        {
            "every=10 / off": ("layer_stats off", "every=10"),
            "every=1 / off": ("layer_stats off", "every=1"),
            "every=1 / every=1 without the moments": ("every=1, no moments", "every=1"),
            "twin / off (noise floor)": ("layer_stats off", "off, a twin model"),
        },
    )
    print(
        "  (targets: every=10 <= 1.01, every=1 <= 1.03; wall ratios on a shared machine are noise: trust the CPU columns there)"
    )
