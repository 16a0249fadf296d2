"""Cost of a batch size that changes (``DynamicBatch``): a dynamic-shape train cell against a static one, GRAPH, CPU.

Run: ``python -m bench batch [--rounds 5 --steps 40 --batch 16]`` (``MINDWATCH_BENCH_QUICK=1``: a short smoke run).

The demo-sized model (TinyGPT, 2 layers, d_model 64, seq 64) in mindwatch's ``TrainOneStepWithGradNorm``, four cells
in one process, paired rounds with the arms rotating:

- ``static B``: a cell compiled for batch B (what a fixed batch size trains with);
- ``dynamic B``: a cell whose batch axis is dynamic (``batch_axis_dynamic``, as ``MonitorCallback`` sets it for a
  ``DynamicBatch``), at batch B;
- ``dynamic B -> B/2``: the same kind of cell, trained at B first, then at B/2 (after a ``shrink_batch``);
- ``static B/2``: a cell compiled for B/2.

Prints each arm's median step time and the paired per-round ratios ``dynamic B / static B`` and
``dynamic after the change / static B/2``; then how far the data pipeline runs ahead of a 1 ms step (where a change
lands) with MindSpore's default prefetch and with ``ds.config.set_prefetch_size(2)``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import mindspore as ms
import numpy as np
from mindspore import dataset as ds
from mindspore import nn
from mindspore.train import Callback, Model

from bench.bench_overhead import call_seconds, spread
from mindwatch.demo.model import GPTConfig, LanguageModelLoss, TinyGPT
from mindwatch.mindspore import DynamicBatch, TrainOneStepWithGradNorm
from mindwatch.mindspore.dynamic_batch import batch_axis_dynamic

QUICK = os.environ.get("MINDWATCH_BENCH_QUICK") == "1"
GPT = GPTConfig()


def _cell() -> nn.Cell:
    ms.set_seed(0)
    net = TinyGPT(GPT)
    return TrainOneStepWithGradNorm(LanguageModelLoss(net), nn.SGD(net.trainable_params(), learning_rate=0.01))


def _inputs(batch: int) -> tuple[ms.Tensor, ms.Tensor]:
    ids = np.random.default_rng(batch).integers(0, GPT.vocab_size, size=(batch, GPT.seq_length + 1), dtype=np.int32)
    return ms.Tensor(ids[:, :-1]), ms.Tensor(ids[:, 1:])


def _median_step(cell: nn.Cell, inputs: tuple[ms.Tensor, ms.Tensor], steps: int) -> tuple[float, float]:
    """The median wall time of a step, and the process's CPU time per step (every thread: MindSpore's runtime too),
    which a machine shared with other work disturbs much less."""
    cpu = time.process_time()
    times = call_seconds(lambda: cell(*inputs)[0].asnumpy(), steps)  # asnumpy: wait for the step
    return statistics.median(times), (time.process_time() - cpu) / steps


def step_times(rounds: int, steps: int, batch: int) -> dict[str, list[tuple[float, float]]]:
    """Each arm's ``(median wall time, CPU time)`` of a step per round (the arms rotate; every cell compiled and
    warmed first)."""
    half = batch // 2
    big, small = _inputs(batch), _inputs(half)
    cells = {"static B": _cell(), "dynamic B": _cell(), "dynamic B -> B/2": _cell(), "static B/2": _cell()}
    for name in ("dynamic B", "dynamic B -> B/2"):
        batch_axis_dynamic(cells[name], big)
    feeds = {"static B": big, "dynamic B": big, "dynamic B -> B/2": small, "static B/2": small}
    _median_step(cells["dynamic B -> B/2"], big, 5)  # it trained at B before the change
    for name, cell in cells.items():
        _median_step(cell, feeds[name], 5)
    out: dict[str, list[tuple[float, float]]] = {name: [] for name in cells}
    names = list(cells)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            out[name].append(_median_step(cells[name], feeds[name], steps))
    return out


def pipeline_lead(prefetch: int | None, steps: int = 150) -> int:
    """In ``Model.train`` (1 ms steps of a small cell): the median number of batches the pipeline has made beyond the
    step that runs, the steps a change decided now waits before it lands."""
    default = ds.config.get_prefetch_size()
    if prefetch is not None:
        ds.config.set_prefetch_size(prefetch)
    try:
        batch = DynamicBatch(32)
        x = np.zeros((32 * 2000, 16), np.float32)
        data = ds.NumpySlicesDataset((x, x[:, :1]), ["x", "y"], shuffle=False).batch(batch)
        net = nn.Dense(16, 1)
        leads: list[int] = []

        class Lead(Callback):
            def on_train_step_end(self, run_context) -> None:
                step = run_context.original_args().cur_step_num
                batch.took(step)
                leads.append(batch.next_unmade() - step - 1)
                time.sleep(0.001)
                if step == steps:
                    run_context.request_stop()

        Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.01)).train(1, data, callbacks=[Lead()], dataset_sink_mode=False)
        return int(statistics.median(leads[steps // 2 :]))
    finally:
        ds.config.set_prefetch_size(default)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench batch", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2 if QUICK else 5)
    p.add_argument("--steps", type=int, default=10 if QUICK else 40)
    p.add_argument("--batch", type=int, default=16)
    args = p.parse_args(argv or [])
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    out = step_times(args.rounds, args.steps, args.batch)
    b = args.batch
    print(f"GRAPH, CPU, demo-sized TinyGPT (seq {GPT.seq_length}); B = {b}; {args.rounds} rotating rounds x {args.steps} steps:")
    for name, rounds in out.items():
        wall, cpu = (statistics.median(r[i] for r in rounds) * 1e3 for i in (0, 1))
        print(f"  {name:18s} median step {wall:7.2f} ms wall, {cpu:7.2f} ms CPU")
    for arm, base in (("dynamic B", "static B"), ("dynamic B -> B/2", "static B/2")):
        for i, what in ((0, "wall"), (1, "CPU")):
            ratios = [a[i] / s[i] for a, s in zip(out[arm], out[base], strict=True)]
            print(f"  {arm} / {base}, {what:4s}: {spread(ratios, 3)}")
    default = ds.config.get_prefetch_size()
    print("where a change lands: batches the pipeline made beyond the running step (Model.train, 1 ms steps):")
    for prefetch in (None, 2):
        label = f"default prefetch ({default})" if prefetch is None else f"set_prefetch_size({prefetch})"
        print(f"  {label:24s} {pipeline_lead(prefetch)} batches ahead")


if __name__ == "__main__":
    main()
