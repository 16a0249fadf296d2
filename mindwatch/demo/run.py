"""``mindwatch demo``: train the demo model with the monitor on and say where the run went."""

from __future__ import annotations

import argparse
import time

from mindwatch.demo.train import DemoSettings, build_training


def run_demo(args: argparse.Namespace) -> int:
    from mindwatch.mindspore import MonitorCallback

    if args.steps < 1:
        raise SystemExit("mindwatch demo: --steps must be >= 1")
    settings = DemoSettings(steps=args.steps, mode=args.mode)
    print(
        f"mindwatch demo: building a {settings.layers}-layer GPT ({settings.mode} mode) on the Python standard library's source"
    )
    model, dataset = build_training(settings)
    metrics = ["loss", "lr", "grad_norm", "step_time", "data_time", "throughput", "memory_usage"]
    if settings.mode == "pynative":
        metrics.append("attention_entropy")
    monitor = MonitorCallback(
        {
            "project": args.project,
            "save_dir": args.save_dir,
            "interval": args.interval,
            "metrics": metrics,
            "attention_entropy": {"every": 10},
            "tags": {"model": "tiny-gpt", "mode": settings.mode, "corpus": "python-stdlib"},
        }
    )
    start = time.time()
    model.train(1, dataset, callbacks=[monitor], dataset_sink_mode=False)
    print(f"mindwatch demo: trained {settings.steps} steps in {time.time() - start:.1f} s")
    print(f"mindwatch demo: run directory: {monitor.run_dir}")
    return 0
