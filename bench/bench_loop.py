"""Cost of ``run.step`` in a training loop of your own (the MindSpore tutorial's value_and_grad + ``@ms.jit`` loop).

Run: ``python -m bench loop [--rounds 9 --steps 200 --skip 20 --hot-steps 100000]`` (``MINDWATCH_BENCH_QUICK=1``:
a short smoke run).

1. Hot path: ``run.step(loss=2.31)`` with a host float (no tensor to read), the worker held back and drained apart
   (as ``bench overhead`` drives the callback), against an empty function call: what ``step()`` costs the training
   thread apart from reading tensors.
2. Loop slowdown: the demo-sized model (TinyGPT, 2 layers, d_model 64, batch 16 x 64 tokens, AdamWeightDecay) in a
   PyNative context with a ``@ms.jit`` train step, in rotating rounds on one compiled step: a loop that only reads the
   loss (``loss.asnumpy()``: what any per-step logger does; the peer) and the same loop with
   ``run.step(loss=loss, grads=grads)`` (one compiled reduction of the gradients, one host read). Median step times,
   paired per-round ratios, and CPU per thread (the training thread, mindwatch's threads, MindSpore's).
3. The cheapest read: the tutorial's own step (it returns the loss alone) read by a loss reader, against a step that
   also returns ``mw.grad_norm(grads)`` (the norm in the step's graph) with ``run.step(loss=loss, grad_norm=norm)``.
4. Under msrun, 2 workers, data parallel (``bench/msrun/loop_worker.py``; ``--msrun-rounds 0`` skips it): the bare loop
   (``nn.DistributedGradReducer``, the loss read), ``start_run`` with its separate signal ``AllReduce`` every
   ``loop_every`` steps, and ``start_run(grad_reducer=mw.DistributedGradReducer(...))``. The **mean** step beside the
   median, the worst decile (p90) and the slowest step, and the total time: a stall every ``loop_every`` steps hides
   in a median, not in a mean.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from bench import threadcpu

QUICK = os.environ.get("MINDWATCH_BENCH_QUICK") == "1"
#: The arms of the cheapest read and its peer (see the module docstring, 3).
TUTORIAL_READER, NORM_IN_STEP = "tutorial step, loss reader", "mindwatch, norm in the step"
#: Each mindwatch arm and the peer it is paired with.
PAIRS = (("mindwatch", "loss reader"), (NORM_IN_STEP, TUTORIAL_READER))


def hot_path(steps: int) -> dict[str, float]:
    """Seconds per call of ``run.step`` with host values, and of an empty function (the floor)."""
    from mindwatch.mindspore import start_run
    from mindwatch.monitor.worker import Monitor

    def empty(loss=None, grads=None, **kw):
        pass

    results = {"empty function": _per_call(empty, steps)}
    best = []
    for _ in range(3):
        with tempfile.TemporaryDirectory() as tmp:
            start = Monitor.start
            Monitor.start = lambda self: self  # type: ignore[method-assign]  # the worker is drained apart, below
            try:
                run = start_run({"save_dir": tmp, "interval": 3600, "queue_size": steps + 100, "alerts": {"enabled": False}})
            finally:
                Monitor.start = start  # type: ignore[method-assign]
            assert run.recorder is not None
            monitor = run.recorder.session.monitor
            total = 0.0
            for _chunk in range(0, steps, 1000):
                t0 = time.perf_counter()
                for _ in range(1000):
                    run.step(loss=2.31)
                total += time.perf_counter() - t0
                monitor._drain()
            monitor.start()
            run.finish()
            best.append(total / (steps // 1000 * 1000))
    results["run.step(loss=<float>)"] = min(best)
    return results


def _per_call(fn, steps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(steps):
        fn(loss=2.31)
    return (time.perf_counter() - t0) / steps


class Loop:
    """The tutorial loop on the demo-sized model, compiled once for every arm."""

    def __init__(self) -> None:
        import mindspore as ms
        from mindspore import nn

        from mindwatch.demo.corpus import ByteWindows, stdlib_corpus
        from mindwatch.demo.model import GPTConfig, LanguageModelLoss, TinyGPT
        from mindwatch.demo.tutorial_step import jit_train_step

        ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
        ms.set_seed(0)
        self.net = LanguageModelLoss(TinyGPT(GPTConfig(seq_length=64, layers=2, d_model=64, heads=4)))
        self.optimizer = nn.AdamWeightDecay(self.net.trainable_params(), learning_rate=1e-4, weight_decay=0.01)
        self.train_step = jit_train_step(self.net, self.optimizer)
        self.with_norm = jit_train_step(self.net, self.optimizer, norm_in_step=True)
        grad_fn = ms.value_and_grad(self.net, None, self.optimizer.parameters)
        optimizer = self.optimizer

        @ms.jit
        def loss_only(inputs, targets):  # the tutorial's step: it returns the loss alone
            loss, grads = grad_fn(inputs, targets)
            optimizer(grads)
            return loss

        self.loss_only = loss_only
        windows = ByteWindows(stdlib_corpus(), 64, 64 * 16, seed=0)
        pairs = [windows[i] for i in range(len(windows))]
        self.batches = [
            tuple(ms.Tensor(np.stack([p[k] for p in pairs[b * 16 : (b + 1) * 16]])) for k in (0, 1)) for b in range(64)
        ]

    def round(self, arm: str, steps: int, skip: int, tmp: str) -> dict[str, float]:
        """One round of ``steps`` steps: seconds per step from step ``skip`` on, and CPU seconds per step by thread group."""
        from mindwatch.mindspore import start_run

        run = (
            start_run({"save_dir": tmp, "interval": 3600}, network=self.net, optimizer=self.optimizer)
            if arm.startswith("mindwatch")
            else None
        )
        ends, before = [], {}
        for step in range(1, steps + 1):
            ids, targets = self.batches[step % len(self.batches)]
            if arm == TUTORIAL_READER:
                self.loss_only(ids, targets).asnumpy()
            elif arm == NORM_IN_STEP:
                loss, norm = self.with_norm(ids, targets)
                run.step(loss=loss, grad_norm=norm)  # type: ignore[union-attr]
            else:
                loss, grads = self.train_step(ids, targets)
                if run is not None:
                    run.step(loss=loss, grads=grads)
                else:
                    loss.asnumpy()
            ends.append(time.perf_counter())
            if step == skip:
                before = threadcpu.snapshot()
        cpu = threadcpu.by_group(before, threadcpu.snapshot(), training=threading.get_native_id())
        if run is not None:
            run.finish()
        n = steps - skip
        return {"step": (ends[-1] - ends[skip - 1]) / n, **{k: v / n for k, v in cpu.items()}}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench loop", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2 if QUICK else 9)
    p.add_argument("--steps", type=int, default=60 if QUICK else 200)
    p.add_argument("--skip", type=int, default=10 if QUICK else 20)
    p.add_argument("--hot-steps", type=int, default=10_000 if QUICK else 100_000)
    p.add_argument("--msrun-rounds", type=int, default=1 if QUICK else 6, help="rounds of the msrun part (0: skip it)")
    p.add_argument("--msrun-steps", type=int, default=30 if QUICK else 60)
    args = p.parse_args(argv or [])

    hot = hot_path(args.hot_steps)
    print(f"hot path, {args.hot_steps} calls, best of 3 (training thread; the worker drained apart):")
    for name, secs in hot.items():
        print(f"  {name:28s} {secs * 1e6:7.2f} us per step")
    print(
        f"  run.step apart from tensor reads: {(hot['run.step(loss=<float>)'] - hot['empty function']) * 1e6:.2f} us",
        "(target <= 5 us)",
    )

    loop = Loop()
    arms = ["loss reader", "mindwatch", TUTORIAL_READER, NORM_IN_STEP]
    results: dict[str, list[dict[str, float]]] = {arm: [] for arm in arms}
    with tempfile.TemporaryDirectory() as tmp:
        for arm in arms:  # warm-up: compile the steps and the reduction
            loop.round(arm, args.skip + 5, args.skip, tmp)
        for r in range(args.rounds):
            for arm in arms[r % len(arms) :] + arms[: r % len(arms)]:
                results[arm].append(loop.round(arm, args.steps, args.skip, tmp))
    print(
        f"\ntutorial loop (PyNative + @ms.jit, demo-sized model), {args.rounds} rotating rounds x {args.steps} steps,",
        f"from step {args.skip} on:",
    )
    for arm, rs in results.items():
        ts = [x["step"] for x in rs]
        print(
            f"  {arm:28s} median step {statistics.median(ts) * 1e3:.2f} ms  (rounds: {', '.join(f'{t * 1e3:.1f}' for t in ts)})"
        )
    for ours, peer in PAIRS:
        ratios = [m["step"] / b["step"] for m, b in zip(results[ours], results[peer], strict=True)]
        print(
            f"  {ours} / {peer}, paired per round: median {statistics.median(ratios):.4f} "
            f"(min {min(ratios):.4f}, max {max(ratios):.4f}; target <= 1.01)"
        )
    print("  CPU per step, ms (median of rounds):          training thread | mindwatch threads | MindSpore and others")
    for arm, rs in results.items():
        cols = [statistics.median(x[k] for x in rs) * 1e3 for k in ("training", "mindwatch", "other")]
        print(f"  {arm:28s} {cols[0]:15.3f} | {cols[1]:17.3f} | {cols[2]:.3f}")
    for ours, peer in PAIRS:
        process = [
            sum(m[k] for k in ("training", "mindwatch", "other")) / sum(b[k] for k in ("training", "mindwatch", "other"))
            for m, b in zip(results[ours], results[peer], strict=True)
        ]
        train_cpu = [m["training"] / b["training"] for m, b in zip(results[ours], results[peer], strict=True)]
        print(
            f"  {ours} / {peer}, paired: process CPU median {statistics.median(process):.4f}, "
            f"training-thread CPU median {statistics.median(train_cpu):.4f}"
        )
    if args.msrun_rounds:
        msrun_loop(args.msrun_rounds, args.msrun_steps)


def msrun_loop(rounds: int, steps: int) -> None:
    """Part 4: the data-parallel loop under msrun, 2 workers (rank 0's steps)."""
    venv_bin = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}", "GLOG_v": "3"}
    env["PYTHONPATH"] = f"{Path(__file__).resolve().parent.parent}{os.pathsep}{env.get('PYTHONPATH', '')}"
    worker = Path(__file__).resolve().parent / "msrun" / "loop_worker.py"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as logs:
        cmd = [str(venv_bin / "msrun"), "--worker_num=2", "--local_worker_num=2", f"--master_port={port}", "--join=True"]
        cmd += [f"--log_dir={logs}", str(worker), str(rounds), str(steps)]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
        log = Path(logs) / "worker_0.log"
        text = log.read_text(errors="replace") if log.exists() else ""
    line = next((ln for ln in text.splitlines() if ln.startswith("LOOP_BENCH ")), None)
    if done.returncode != 0 or line is None:
        print(f"bench loop: msrun failed ({done.returncode}):\n{text[-3000:]}{done.stdout[-2000:]}", file=sys.stderr)
        raise SystemExit(1)
    out = json.loads(line.split(" ", 1)[1])
    print(f"\nmsrun, 2 workers, data parallel, the functional loop (demo-sized model); {rounds} rotating rounds x {steps}")
    print("steps, rank 0, every step (ms):        mean | median |    p90 |    max |  total s | CPU/step training, others")
    for arm, r in out.items():
        ts = sorted(r["steps"])
        p90 = ts[int(0.9 * (len(ts) - 1))]
        cpu = f"{statistics.median(r['training']) * 1e3:.2f}, {statistics.median(r['other']) * 1e3:.1f}"
        print(
            f"  {arm:28s} {statistics.mean(ts) * 1e3:8.2f} | {statistics.median(ts) * 1e3:6.2f} | {p90 * 1e3:6.2f} |"
            f" {ts[-1] * 1e3:6.1f} | {sum(ts):8.2f} | {cpu}"
        )
    base = out["bare loop"]
    for arm in list(out)[1:]:
        mean = statistics.mean(out[arm]["steps"]) / statistics.mean(base["steps"])
        median = statistics.median(out[arm]["steps"]) / statistics.median(base["steps"])
        cpu = statistics.median(
            (a + b) / (c + d)
            for a, b, c, d in zip(out[arm]["training"], out[arm]["other"], base["training"], base["other"], strict=True)
        )
        print(
            f"  {arm} / bare loop: mean step {mean:.4f} (target <= 1.03), median {median:.4f}, "
            f"process CPU per round (median) {cpu:.4f}"
        )


if __name__ == "__main__":
    main()
