"""Cost of ``rewind``'s snapshots on the demo (GRAPH, CPU): the stall of one snapshot, its cost per step at
``every: 100``, the time a rewind takes, and the wall ratio against the same training without snapshots.

Run: ``python -m bench rewind [--rounds 15 --steps 200 --skip 100] [--d-model 64 --depth 2]``
(``MINDWATCH_BENCH_QUICK=1``: a short run).

The snapshot and the rewind are timed directly on the training thread, 20 times each, on the demo's network and
optimizer after it trained (a snapshot: every Parameter copied to a numpy array; a rewind: every one assigned back).
The rounds train two identical demo models with mindwatch's callback, in rotating order: one with
``rewind: {every: 100}`` (so a round of 200 steps takes two snapshots), one without.
"""

from __future__ import annotations

import logging
import statistics

from bench.bench_overhead import call_seconds, paired_ratios, print_rounds, rotating_rounds, round_options


def main(argv: list[str] | None = None) -> None:
    import argparse

    from mindwatch.demo.train import DemoSettings, build_training
    from mindwatch.mindspore import MonitorCallback
    from mindwatch.mindspore.recorder import rewind_state
    from mindwatch.mindspore.rewind import Snapshots

    parser = argparse.ArgumentParser(prog="python -m bench rewind", description=__doc__.splitlines()[0])
    parser.add_argument("--d-model", type=int, default=64, help="the demo model's width (the demo's: 64)")
    parser.add_argument("--depth", type=int, default=2, help="the demo model's Transformer blocks (the demo's: 2)")
    parser.add_argument("--state-mib", type=int, default=256, help="a larger state, timed apart: MiB of Parameters (0: none)")
    args = round_options(parser, argv)
    logging.getLogger("mindwatch").setLevel(logging.WARNING)
    total = args.steps * (2 * args.rounds + 1)

    def training():
        settings = DemoSettings(steps=total, mode="graph", layer_stats=False, d_model=args.d_model, layers=args.depth)
        model, data = build_training(settings)
        return model, data.take(args.steps)

    def monitor(rewind: bool):
        config = {"interval": 3600, **({"rewind": {"every": 100}} if rewind else {})}
        return lambda tmp: [MonitorCallback({"save_dir": tmp, **config})]

    (bare, bare_data), (snapping, snapping_data) = training(), training()
    arms = {"no snapshots": (bare, bare_data, monitor(False)), "every=100": (snapping, snapping_data, monitor(True))}
    results = rotating_rounds(arms, args.steps, args.rounds, args.skip)

    train_net = snapping.train_network
    state = rewind_state(train_net.network, train_net.optimizer)
    snapshots = Snapshots(state, keep=2)
    stalls = call_seconds(lambda: snapshots.take(100), 20)
    stall, stall_mean = statistics.median(stalls), statistics.fmean(stalls)
    snapshot = snapshots.held[-1]
    rewinds = call_seconds(lambda: snapshots.restore(snapshot), 20)
    rewind, rewind_mean = statistics.median(rewinds), statistics.fmean(rewinds)
    step = statistics.median(r.step for r in results["no snapshots"])

    head = f"{args.rounds} rotating rounds x {args.steps} steps, from step {args.skip}"
    print(f"demo training (d_model {args.d_model}, {args.depth} blocks), rewind's snapshots (GRAPH, CPU), {head}:")
    print_rounds(results)
    paired_ratios(results, {"every=100 / no snapshots": ("no snapshots", "every=100")})
    print(f"  a snapshot: {len(state)} Parameters, {snapshots.nbytes / 2**20:.2f} MiB (x keep in host memory)")
    print(f"  the training thread's stall per snapshot: {stall * 1e3:.3f} ms (median of 20; mean {stall_mean * 1e3:.3f} ms)")
    print(
        f"  amortised at every=100: {stall / 100 * 1e3:.4f} ms/step = {stall / 100 / step:.2%} of the "
        f"{step * 1e3:.2f} ms step (ratio {1 + stall / 100 / step:.4f})"
    )
    print(f"  a rewind (every Parameter assigned back): {rewind * 1e3:.3f} ms (median of 20; mean {rewind_mean * 1e3:.3f} ms)")
    print("  (between snapshots the step is what it is without them: the wall ratio is noise on a shared machine)")
    if args.state_mib:
        _large_state(args.state_mib)


def _large_state(mib: int) -> None:
    """A snapshot and a rewind of ``mib`` MiB of float32 Parameters (1 MiB each): how the stall grows with the state."""
    import mindspore as ms
    import numpy as np

    from mindwatch.mindspore.rewind import Snapshots

    state = {f"p{i}": ms.Parameter(ms.Tensor(np.random.rand(512, 512).astype(np.float32)), name=f"p{i}") for i in range(mib)}
    snapshots = Snapshots(state, keep=2)
    first = statistics.median(call_seconds(lambda: Snapshots(state, keep=2).take(1), 5))  # into new arrays
    snapshots.take(1)
    snapshots.take(2)
    reused = statistics.median(call_seconds(lambda: snapshots.take(3), 10))  # into the oldest snapshot's arrays
    rewind = statistics.median(call_seconds(lambda: snapshots.restore(snapshots.held[-1]), 5))
    print(f"a state of {mib} MiB ({len(state)} Parameters of 1 MiB):")
    print(f"  snapshot into new arrays {first * 1e3:.1f} ms, into the oldest snapshot's arrays {reused * 1e3:.1f} ms")
    print(f"  ({reused / mib * 1e3:.3f} ms per MiB); a rewind {rewind * 1e3:.1f} ms")
