"""``mindwatch demo``: train the demo model with the monitor on and say where the run went."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from urllib.parse import quote

from mindwatch.demo.train import DemoSettings, build_training, evaluate_every, held_out_text
from mindwatch.serve.process import DashboardProcess


def run_demo(args: argparse.Namespace) -> int:
    from mindwatch.mindspore import MonitorCallback

    if args.steps < 1:
        raise SystemExit("mindwatch demo: --steps must be >= 1")
    moe = bool(getattr(args, "moe", False))
    settings = DemoSettings(steps=args.steps, mode=args.mode, experts=4 if moe else 0)
    kind = f"GPT with a top-{settings.top_k}-of-{settings.experts} mixture of experts" if moe else "GPT"
    source = "the Python standard library's source"
    print(f"mindwatch demo: building a {settings.layers}-layer {kind} ({settings.mode} mode) on {source}")
    model, dataset = build_training(settings)
    metrics = ["loss", "lr", "grad_norm", "step_time", "data_time", "throughput", "memory_usage"]
    if settings.mode == "pynative":
        metrics.append("attention_entropy")
    if moe:
        metrics.append("moe")
    monitor = MonitorCallback(
        {
            "project": args.project,
            "save_dir": args.save_dir,
            "interval": args.interval,
            "metrics": metrics,
            "attention_entropy": {"every": 10},
            "evaluation": {"perplexity": True},  # a next-byte cross-entropy: perplexity = exp(loss)
            "tags": {"model": "tiny-gpt-moe" if moe else "tiny-gpt", "mode": settings.mode, "corpus": "python-stdlib"},
        }
    )
    dashboard = None if getattr(args, "no_dashboard", False) else _start_dashboard(args.save_dir, getattr(args, "port", 8765))
    try:
        start = time.time()
        evaluating = evaluate_every(settings.eval_every, model, held_out_text(settings), monitor)
        model.train(1, dataset, callbacks=[monitor, evaluating], dataset_sink_mode=False)
        print(f"mindwatch demo: trained {settings.steps} steps in {time.time() - start:.1f} s")
        print(f"mindwatch demo: run directory: {monitor.run_dir}")
        if dashboard is not None and monitor.run_dir is not None:
            run_id = Path(monitor.run_dir).relative_to(Path(args.save_dir)).as_posix()
            # Keep showing the result in a terminal; CI, pipes and --exit-when-done end here.
            if not getattr(args, "exit_when_done", False) and sys.stdin.isatty():
                print(f"mindwatch demo: this run on the dashboard: {dashboard.url}#/run/{quote(run_id, safe='')}")
                print("mindwatch demo: the dashboard keeps running; press Ctrl-C to stop it", flush=True)
                dashboard.wait()
                print("mindwatch demo: dashboard stopped")
            else:  # no link to a dashboard that stops in a moment: say how to see the run again
                print(
                    f"mindwatch demo: the dashboard stops with the demo; see this run again with: mindwatch serve {args.save_dir}"
                )
    finally:
        if dashboard is not None:
            dashboard.stop()
    return 0


def _start_dashboard(save_dir: str, port: int) -> DashboardProcess | None:
    """The dashboard beside the training; a warning (never a failed demo) if it cannot start."""
    try:
        dashboard = DashboardProcess(save_dir, port=port).start()
    except (RuntimeError, OSError) as e:
        print(f"mindwatch demo: warning: the dashboard did not start ({e}); training without it", file=sys.stderr)
        return None
    print(f"mindwatch demo: live dashboard at {dashboard.url} (open it now: charts fill in as the model trains)", flush=True)
    return dashboard
