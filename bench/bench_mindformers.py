"""Cost of mindwatch's callback in a MindFormers training: a tiny Llama through ``mindformers.Trainer``, with and without
``MonitorCallback``, timed by MindFormers' own step log.

Run: ``python -m bench mindformers [--pairs 5 --steps 300 --config '{"column_files": false}']``
(``MINDWATCH_BENCH_QUICK=1``: 2 pairs of 60 steps; ``--help`` for the options).

Each training runs in the MindFormers environment (``.venv-mindformers``, MindSpore 2.9 + MindFormers 1.9; the bench
itself runs in ``.venv``) as a subprocess of its own, :mod:`bench.mindformers_train`: the YAML lists MindFormers'
``MFLossMonitor`` and, in the mindwatch arm, ``MonitorCallback`` with the default config (``--config`` merges into it).
One training of the bare arm runs first and is not counted (``--warmup``); then pairs of trainings, one of each
arm, the arm that goes first alternating from pair to pair. Per training:

- wall: from the timestamp of ``MFLossMonitor``'s line for step 2 to that of the last step (milliseconds in the log;
  compilation and the first step left out), per step;
- MindFormers' ``per_step_time`` (its own step begin to step end, whole milliseconds), the mean of steps 3 to the last;
- the CPU of every thread over the same steps (:mod:`bench.threadcpu`): the training thread, mindwatch's step hooks on
  it (timed from inside), each mindwatch thread, and MindSpore's (all the others); wall ratios on a shared machine move
  by more than the cost measured, CPU per step hardly does.

Per pair it prints the ratios (with / without); then mean, median, min and max of each, the CPU per step of each
thread group per arm, and mindwatch's own CPU per step (its hooks and its threads) as a share of the step without it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

QUICK = os.environ.get("MINDWATCH_BENCH_QUICK") == "1"
ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-mindformers"

#: ``2026-12-06 12:12:53,498 [mindformers/core/callback/callback.py:747] print_output_info: { Epoch:[  1/  1],
#: step:[    2/  300], loss:[...], per_step_time: 19ms, ...`` (MFLossMonitor's step line in ``info.log``)
_STEP_LINE = re.compile(
    r"(?P<t>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \[[^\]]*\] print_output_info: \{ Epoch:\[[^\]]*\], "
    r"step:\[\s*(?P<step>\d+)/\s*\d+\].*?per_step_time: (?P<ms>\d+)ms"
)
ARMS = ("without", "mindwatch")


@dataclass
class Training:
    """One training's figures, from the end of step 2 to the end of the last step."""

    steps: int  # steps timed (the last step - 2)
    wall: float  # seconds, from MFLossMonitor's log
    per_step_ms: float  # mean of MFLossMonitor's per_step_time, steps 3 to the last
    threads: dict[str, float]  # CPU seconds by thread name (``training``: the main thread)
    hook_cpu: float  # CPU seconds in MonitorCallback's step hooks
    hook_wall: float  # wall seconds in them

    @property
    def step(self) -> float:
        return self.wall / self.steps

    def cpu(self, group: str) -> float:
        """CPU seconds per step of a thread group: ``training``, ``mindwatch`` (its threads), ``other``, ``process``."""
        if group == "process":
            return sum(self.threads.values()) / self.steps
        if group == "training":
            return self.threads.get("training", 0.0) / self.steps
        mine = sum(v for k, v in self.threads.items() if k.startswith("mindwatch"))
        if group == "mindwatch":
            return mine / self.steps
        return (sum(self.threads.values()) - self.threads.get("training", 0.0) - mine) / self.steps


def step_log(path: Path) -> dict[int, tuple[float, int]]:
    """MFLossMonitor's step lines in ``info.log``: ``{step: (timestamp seconds, per_step_time ms)}``."""
    steps = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        m = _STEP_LINE.search(line)
        if m:
            t = datetime.strptime(m["t"], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            steps[int(m["step"])] = (t, int(m["ms"]))
    return steps


def train(python: Path, steps: int, monitor: dict | None, timeout: float) -> Training:
    """One training in its own process and scratch directory; ``monitor``: mindwatch's config (None: without)."""
    with tempfile.TemporaryDirectory(prefix="bench-mindformers-") as tmp:
        cmd = [str(python), "-m", "bench.mindformers_train", "--steps", str(steps)]
        if monitor is not None:
            cmd += ["--monitor", json.dumps({"save_dir": f"{tmp}/monitor_output", **monitor})]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "GLOG_v": "3"}
        done = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise SystemExit(f"bench mindformers: the training failed ({done.returncode}):\n{done.stderr[-3000:]}")
        out = json.loads(done.stdout.strip().splitlines()[-1])
        log = step_log(Path(out["log"]))
    if sorted(log) != list(range(1, steps + 1)):
        raise SystemExit(f"bench mindformers: MFLossMonitor's lines for steps 1-{steps} not all found in {out['log']}")
    per_step = [log[s][1] for s in range(3, steps + 1)]
    return Training(
        steps=steps - 2,
        wall=log[steps][0] - log[2][0],
        per_step_ms=statistics.fmean(per_step),
        threads=out["threads"],
        hook_cpu=out["hook_cpu"],
        hook_wall=out["hook_wall"],
    )


def run_pairs(python: Path, pairs: int, steps: int, monitor: dict, timeout: float) -> dict[str, list[Training]]:
    """``pairs`` pairs of trainings, one of each arm, the first arm alternating; printed pair by pair."""
    results: dict[str, list[Training]] = {arm: [] for arm in ARMS}
    print("  pair  first      ms/step without  mindwatch | ratios: wall  per_step_time  process CPU", flush=True)
    for pair in range(pairs):
        order = ARMS if pair % 2 == 0 else ARMS[::-1]
        for arm in order:
            results[arm].append(train(python, steps, monitor if arm == "mindwatch" else None, timeout))
        off, on = results["without"][-1], results["mindwatch"][-1]
        ratios = (on.step / off.step, on.per_step_ms / off.per_step_ms, on.cpu("process") / off.cpu("process"))
        print(
            f"  {pair + 1:4d}  {order[0]:9s} {off.step * 1e3:16.2f} {on.step * 1e3:10.2f} |"
            f" {ratios[0]:12.4f} {ratios[1]:14.4f} {ratios[2]:12.4f}",
            flush=True,
        )
    return results


def report(results: dict[str, list[Training]]) -> None:
    pairs = list(zip(results["without"], results["mindwatch"], strict=True))
    figures = {
        "wall per step (MFLossMonitor's log)": [b.step / a.step for a, b in pairs],
        "MindFormers' per_step_time": [b.per_step_ms / a.per_step_ms for a, b in pairs],
        "process CPU per step": [b.cpu("process") / a.cpu("process") for a, b in pairs],
        "training-thread CPU per step": [b.cpu("training") / a.cpu("training") for a, b in pairs],
    }
    print(f"  {'with / without':36s} {'mean':>7s} {'median':>7s} {'min':>7s} {'max':>7s}")
    for name, xs in figures.items():
        spread = (statistics.fmean(xs), statistics.median(xs), min(xs), max(xs))
        print(f"  {name:36s} " + " ".join(f"{x:7.4f}" for x in spread))
    threads = sorted({k for _, b in pairs for k in b.threads if k.startswith("mindwatch")})
    columns = ["training", "its hooks", "hooks wall", *threads, "MindSpore"]
    print("  CPU per step (us, median of the trainings); 'hooks wall': the wall time in MonitorCallback's step hooks")
    print(f"  {'arm':10s} " + " ".join(f"{c:>{max(10, len(c))}s}" for c in columns))
    for arm, rs in results.items():
        cells = [
            statistics.median(r.cpu("training") for r in rs),
            statistics.median(r.hook_cpu / r.steps for r in rs),
            statistics.median(r.hook_wall / r.steps for r in rs),
            *(statistics.median(r.threads.get(t, 0.0) / r.steps for r in rs) for t in threads),
            statistics.median(r.cpu("other") for r in rs),
        ]
        print(f"  {arm:10s} " + " ".join(f"{x * 1e6:{max(10, len(c))}.1f}" for x, c in zip(cells, columns, strict=True)))
    own = [b.hook_cpu / b.steps + b.cpu("mindwatch") for _, b in pairs]
    share = [o / a.step for o, (a, _) in zip(own, pairs, strict=True)]
    print(
        f"  mindwatch's own CPU per step (its hooks + its threads): median {statistics.median(own) * 1e6:.1f} us, "
        f"{statistics.median(share) * 100:.2f} % of the step without it (min {min(share) * 100:.2f}, "
        f"max {max(share) * 100:.2f})"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench mindformers", description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2 if QUICK else 5, help="pairs of trainings (one of each arm)")
    parser.add_argument("--steps", type=int, default=60 if QUICK else 300, help="steps per training")
    parser.add_argument("--config", default="{}", help="JSON merged into mindwatch's config (default: its defaults)")
    parser.add_argument("--venv", type=Path, default=VENV, help=f"the MindFormers environment (default {VENV})")
    parser.add_argument("--warmup", type=int, default=1, help="trainings run first, not counted")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a training may take")
    args = parser.parse_args(argv or [])
    if args.steps < 10:
        parser.error("--steps must be at least 10")
    python = args.venv / "bin" / "python"
    if not python.exists():
        print(f"  skipped: {python} is missing (scripts/setup.sh creates the MindFormers environment)")
        return
    monitor = json.loads(args.config)
    if not isinstance(monitor, dict):
        parser.error(f"--config must be a JSON object (got {args.config})")
    print(
        f"MindFormers (tiny Llama, GRAPH, CPU), {args.pairs} pairs x {args.steps} steps, figures from the end of step 2; "
        f"mindwatch's config: defaults{' + ' + args.config if monitor else ''}",
        flush=True,
    )
    print(f"  load average before: {os.getloadavg()[0]:.2f}", flush=True)
    for _ in range(args.warmup):  # in a trial here the first training after an idle spell ran 20 % faster than the next
        train(python, args.steps, None, args.timeout)
    results = run_pairs(python, args.pairs, args.steps, monitor, args.timeout)
    print(f"  load average after: {os.getloadavg()[0]:.2f} (on a shared machine the wall ratios swing; the CPU ones less)")
    report(results)


if __name__ == "__main__":
    main(sys.argv[1:])
