"""One logger of ``bench peers`` timed in this process: the loggers, the timed loop, the CPU of the process tree.

Example::

    python -m bench.peerlog wandb --steps 20000 --out wandb.json    # in .venv-peers, the checkout on PYTHONPATH

Runs on the main thread of a subprocess that ``bench peers`` starts, one per logger, so that each
logger's threads and child processes (wandb's service) are this process's alone. Each logger gets
the same 6 scalars per step in a bare loop; the loop times the logging call only. CPU is read for
the whole process tree: every thread of this process, the children it reaped, and the descendants
still alive, from after the logger is built to after it is closed (its queues flushed).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

SCALARS = ("loss", "lr", "grad_norm", "step_time", "data_time", "samples_per_second")


def scalars(step: int) -> dict[str, float]:
    """The 6 values a training step logs (what the demo's records carry)."""
    return {
        "loss": 2.0 + 1.0 / step,
        "lr": 1e-4,
        "grad_norm": 0.5 + (step % 7) * 0.01,
        "step_time": 0.01,
        "data_time": 0.001,
        "samples_per_second": 800.0,
    }


class BareLoop:
    """No logging: the same dict built and the same timer around an empty call (the baseline)."""

    def __init__(self, tmp: Path, steps: int) -> None:
        pass

    def log(self, step: int, values: dict[str, float]) -> None:
        pass

    def close(self) -> None:
        pass


class Mindwatch:
    """The engine the MindSpore callback drives, without MindSpore: a RunSession's ``monitor.record``."""

    def __init__(self, tmp: Path, steps: int) -> None:
        from mindwatch.config import load_config
        from mindwatch.session import RunSession

        # a bare loop outruns any writer: a queue as long as the run, so that no record is dropped and none goes uncounted
        config = load_config({"project": "bench", "save_dir": str(tmp), "queue_size": steps + 16})
        self.session = RunSession.start(config, rank=0, world_size=1)
        self.monitor = self.session.monitor

    def log(self, step: int, values: dict[str, float]) -> None:
        values["step"] = step
        values["t"] = time.time()
        self.monitor.record(values)

    def close(self) -> None:
        self.session.close("finished")
        if self.monitor.dropped:
            raise RuntimeError(f"mindwatch dropped {self.monitor.dropped} records: the figures would undercount")


class TensorBoardX:
    """tensorboardX ``SummaryWriter.add_scalar`` per value (its writer thread writes the event file)."""

    def __init__(self, tmp: Path, steps: int) -> None:
        import crc32c  # noqa: F401  # tensorboardX uses it when importable; without it, its pure-Python CRC
        from tensorboardX import SummaryWriter

        self.writer = SummaryWriter(str(tmp))

    def log(self, step: int, values: dict[str, float]) -> None:
        for name, value in values.items():
            self.writer.add_scalar(name, value, step)

    def close(self) -> None:
        self.writer.close()


class Wandb:
    """wandb offline: ``run.log``; its service process (wandb-core) writes the run, and its CPU is counted."""

    def __init__(self, tmp: Path, steps: int) -> None:
        os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DIR=str(tmp))
        import wandb

        self.wandb = wandb
        self.run = wandb.init(project="bench", dir=str(tmp), mode="offline")

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()
        self.wandb.teardown()  # the service exits, and this process reaps it: its CPU lands in children_*


class MLflow:
    """MLflow with async logging to a local file store: ``mlflow.log_metrics(..., synchronous=False)``."""

    def __init__(self, tmp: Path, steps: int) -> None:
        import mlflow

        self.mlflow = mlflow
        os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # mlflow 3 keeps the file store in maintenance mode
        mlflow.set_tracking_uri((tmp / "mlruns").as_uri())
        mlflow.config.enable_async_logging(True)
        mlflow.start_run()

    def log(self, step: int, values: dict[str, float]) -> None:
        self.mlflow.log_metrics(values, step=step, synchronous=False)

    def close(self) -> None:
        self.mlflow.flush_async_logging()
        self.mlflow.end_run()


class Aim:
    """Aim ``run.track`` of the dict (its own repo in the tmp folder; its default system tracking on)."""

    def __init__(self, tmp: Path, steps: int) -> None:
        import aim

        self.run = aim.Run(repo=str(tmp), experiment="bench")

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.track(values, step=step)

    def close(self) -> None:
        self.run.close()


#: The distribution whose version each logger reports (mindwatch: the checkout's ``__version__``).
DISTRIBUTIONS = {"tensorboardx": "tensorboardX", "wandb": "wandb", "mlflow": "mlflow", "aim": "aim"}

LOGGERS: dict[str, type] = {
    "bare": BareLoop,
    "mindwatch": Mindwatch,
    "tensorboardx": TensorBoardX,
    "wandb": Wandb,
    "mlflow": MLflow,
    "aim": Aim,
}


def tree_cpu(proc: psutil.Process) -> tuple[float, float]:
    """CPU seconds of this process (its threads) and of its child processes: reaped ones plus the live descendants."""
    children = proc.children(recursive=True)
    own = proc.cpu_times()  # in clock ticks: the process's own CPU comes from process_time (ns) instead
    below = own.children_user + own.children_system
    for child in children:
        try:
            t = child.cpu_times()
        except psutil.Error:  # ended meanwhile: counted in its parent's children_* once reaped
            continue
        below += t.user + t.system + t.children_user + t.children_system
    return time.process_time(), below


def version(name: str) -> str | None:
    if name == "mindwatch":
        import mindwatch

        return mindwatch.__version__
    return importlib.metadata.version(DISTRIBUTIONS[name]) if name in DISTRIBUTIONS else None


def measure(name: str, steps: int, tmp: Path) -> dict[str, Any]:
    """Build the logger, log ``steps`` steps timing each call, close it; wall and CPU figures."""
    proc = psutil.Process()
    started = time.perf_counter()
    logger = LOGGERS[name](tmp, steps)
    init_s = time.perf_counter() - started
    own0, below0 = tree_cpu(proc)
    calls = [0] * steps
    clock = time.perf_counter_ns
    loop_start = time.perf_counter()
    for step in range(1, steps + 1):
        values = scalars(step)
        t0 = clock()
        logger.log(step, values)
        calls[step - 1] = clock() - t0
    loop_s = time.perf_counter() - loop_start
    own_loop, below_loop = tree_cpu(proc)
    closing = time.perf_counter()
    logger.close()
    close_s = time.perf_counter() - closing
    own1, below1 = tree_cpu(proc)
    return {
        "version": version(name),
        "steps": steps,
        "init_s": init_s,
        "loop_s": loop_s,
        "close_s": close_s,
        "hot_median_us": statistics.median(calls) / 1e3,
        "hot_mean_us": statistics.fmean(calls) / 1e3,
        "hot_p99_us": sorted(calls)[int(0.99 * (steps - 1))] / 1e3,
        "cpu_loop_us": ((own_loop - own0) + (below_loop - below0)) / steps * 1e6,
        "cpu_us": ((own1 - own0) + (below1 - below0)) / steps * 1e6,
        "cpu_children_us": (below1 - below0) / steps * 1e6,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peerlog", description=__doc__.splitlines()[0])
    parser.add_argument("logger", choices=sorted(LOGGERS))
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--out", type=Path, required=True, help="where the figures go, as JSON")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix=f"mindwatch-bench-peers-{args.logger}-") as tmp:
        try:
            figures = measure(args.logger, args.steps, Path(tmp))
        except ImportError as e:
            figures = {"unavailable": f"cannot import: {e}"}
    args.out.write_text(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
