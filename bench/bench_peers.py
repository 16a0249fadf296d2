"""mindwatch against tensorboardX, wandb, MLflow and Aim: the same 6 scalars per step, each logger in its own process.

Run: ``python -m bench peers [--steps 20000 --rounds 1 --only mindwatch,wandb --json peers.json]``.

The peers live in their own virtual environment, ``.venv-peers/`` at the checkout's root, which
this bench creates on its first run (``python -m venv`` + ``pip install`` of the pinned versions
below and of mindwatch's dependencies; the checkout itself goes on ``PYTHONPATH``). It is set up
again when the pins or mindwatch's dependencies change. A peer that cannot be installed or
imported is reported as unavailable, with the reason, and the others still run.

Each logger runs in a subprocess of its own (:mod:`bench.peerlog`), so that its threads and child
processes are counted and no one else's are: per step, the wall time of the logging call on the
training thread (the hot call), and the CPU of the whole process tree from after the logger is
built to after it is closed (its background threads and wandb's service process included),
less the bare loop's. Ratios are peer / mindwatch.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import tomllib

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-peers"

#: What each peer needs, pinned to versions that install together on Python 3.11.
PEERS: dict[str, list[str]] = {
    "tensorboardx": ["tensorboardX==2.6.5", "crc32c==2.9.post0"],
    "wandb": ["wandb==0.31.0"],
    "mlflow": ["mlflow==3.17.2"],
    "aim": ["aim==3.29.1"],
}
#: The order of the table: mindwatch first, the peers, then the baseline.
LOGGERS = ["mindwatch", *PEERS, "bare"]
FIGURES = (
    "hot_median_us",
    "hot_mean_us",
    "hot_p99_us",
    "cpu_us",
    "cpu_loop_us",
    "cpu_children_us",
    "close_s",
    "init_s",
    "loop_s",
    "whole_process_cpu_s",
)


def mindwatch_requirements() -> list[str]:
    """mindwatch's own dependencies, from pyproject.toml (the checkout runs from PYTHONPATH, not installed)."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        return list(tomllib.load(f)["project"]["dependencies"])


def setup_venv(venv: Path) -> dict[str, str]:
    """Create or update ``venv``; the peers that could not be installed, each with the reason."""
    wanted = {"mindwatch": mindwatch_requirements(), **PEERS}
    stamp = venv / "bench-peers.json"
    if stamp.exists():
        done = json.loads(stamp.read_text())
        if done.get("wanted") == wanted:
            return done["unavailable"]
    print(f"setting up {venv} (pip install of the peers: a minute or two, once)", flush=True)
    if not (venv / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    log = venv / "pip.log"

    def pip_install(requirements: list[str]) -> str | None:
        """None when it installed, else the last line pip wrote to stderr."""
        cmd = [str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", "-q", *requirements]
        done = subprocess.run(cmd, capture_output=True, text=True)
        with log.open("a") as f:
            f.write(f"$ {' '.join(cmd)}\n{done.stdout}{done.stderr}\n")
        if done.returncode == 0:
            return None
        errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")]
        return (errors or done.stderr.splitlines() or [f"pip exited {done.returncode}"])[-1]

    failed = pip_install(wanted["mindwatch"])
    if failed:
        raise SystemExit(f"cannot install mindwatch's dependencies into {venv}: {failed} (see {log})")
    unavailable: dict[str, str] = {}
    if pip_install([r for peer in PEERS.values() for r in peer]):  # together they may conflict: one by one then
        for peer, requirements in PEERS.items():
            failed = pip_install(requirements)
            if failed:
                unavailable[peer] = f"pip install {' '.join(requirements)}: {failed}"
    stamp.write_text(json.dumps({"wanted": wanted, "unavailable": unavailable}, indent=1))
    return unavailable


def run_logger(python: Path, name: str, steps: int, timeout: float) -> dict[str, Any]:
    """One logger's figures from its own subprocess, or ``{"unavailable": reason}``."""
    with tempfile.TemporaryDirectory(prefix=f"mindwatch-bench-peers-{name}-") as tmp:
        out = Path(tmp) / "figures.json"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        cmd = [str(python), "-m", "bench.peerlog", name, "--steps", str(steps), "--out", str(out)]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        try:
            done = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"unavailable": f"did not finish {steps} steps in {timeout:.0f} s"}
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode != 0 or not out.exists():
            last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
            return {"unavailable": f"failed: {last}"}
        figures = json.loads(out.read_text())
        # the whole subprocess tree, interpreter start and imports included: a check that no CPU escaped the count
        figures["whole_process_cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        return figures


def median_figures(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over the rounds; a logger unavailable in any round is unavailable."""
    for r in rounds:
        if "unavailable" in r:
            return {"unavailable": r["unavailable"]}
    merged: dict[str, Any] = {k: statistics.median(r[k] for r in rounds) for k in FIGURES}
    merged["version"] = rounds[0].get("version")
    return merged


def ratios(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per peer: hot-call mean / mindwatch's, and CPU per step above the bare loop / mindwatch's."""
    ours, bare = results.get("mindwatch", {}), results.get("bare", {})
    if "cpu_us" not in ours or "cpu_us" not in bare:
        return {}
    ours_cpu = ours["cpu_us"] - bare["cpu_us"]
    out = {}
    for name, fig in results.items():
        if name in ("mindwatch", "bare") or "cpu_us" not in fig:
            continue
        out[name] = {
            "hot_mean": fig["hot_mean_us"] / ours["hot_mean_us"],
            "cpu": (fig["cpu_us"] - bare["cpu_us"]) / ours_cpu if ours_cpu > 0 else float("inf"),
        }
    return out


def report(results: dict[str, dict[str, Any]], steps: int, rounds: int) -> str:
    """The table: mindwatch first, each peer with its ratios, the bare loop, then the unavailable ones."""
    bare = results.get("bare", {}).get("cpu_us", 0.0)
    rel = ratios(results)
    lines = [
        f"{steps:,} steps x 6 scalars, each logger in its own process"
        + (f", median of {rounds} rounds" if rounds > 1 else "")
        + "; CPU: the process's threads + its child processes, to after close, less the bare loop's",
        f"{'logger':<13} {'version':<11} {'hot call us: median':>19} {'mean':>8} {'x mw':>7}"
        f" {'CPU us/step':>12} {'x mw':>7} {'in children':>12} {'close s':>8} {'init s':>7}",
    ]
    missing = []
    for name in [n for n in LOGGERS if n in results] + [n for n in results if n not in LOGGERS]:
        fig = results[name]
        if "unavailable" in fig:
            missing.append(f"  {name}: unavailable ({fig['unavailable']})")
            continue
        hot_x = f"{rel[name]['hot_mean']:6.0f}x" if name in rel else ""
        cpu_x = f"{rel[name]['cpu']:6.0f}x" if name in rel else ""
        cpu = fig["cpu_us"] if name == "bare" else fig["cpu_us"] - bare
        label = "bare loop" if name == "bare" else name
        note = "  (baseline: its own CPU/step, not subtracted)" if name == "bare" else ""
        lines.append(
            f"{label:<13} {fig.get('version') or '':<11} {fig['hot_median_us']:19.2f} {fig['hot_mean_us']:8.2f} {hot_x:>7}"
            f" {cpu:12.1f} {cpu_x:>7} {fig['cpu_children_us']:12.1f} {fig['close_s']:8.2f} {fig['init_s']:7.2f}{note}"
        )
    return "\n".join(lines + missing)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench peers", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000, help="steps each logger logs (default 20,000)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of every logger, in rotating order; figures are medians")
    parser.add_argument("--only", help="comma-separated loggers (mindwatch and the bare loop always run)")
    parser.add_argument("--json", type=Path, help="also write the figures here, as JSON")
    parser.add_argument("--venv", type=Path, default=VENV, help=f"the peers' virtual environment (default {VENV})")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds one logger's run may take")
    args = parser.parse_args(argv)
    names = LOGGERS
    if args.only:
        chosen = {n.strip() for n in args.only.split(",")} | {"mindwatch", "bare"}
        unknown = chosen - set(LOGGERS)
        if unknown:
            parser.error(f"unknown logger(s) {', '.join(sorted(unknown))}; choose from {', '.join(LOGGERS)}")
        names = [n for n in LOGGERS if n in chosen]

    unavailable = setup_venv(args.venv)
    python = args.venv / "bin" / "python"
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for name in names:
        if name in unavailable:
            runs[name].append({"unavailable": unavailable[name]})
    todo = [n for n in names if n not in unavailable]
    for r in range(args.rounds):
        for name in todo[r % len(todo) :] + todo[: r % len(todo)]:
            print(f"  round {r + 1}/{args.rounds}: {name} ...", flush=True)
            runs[name].append(run_logger(python, name, args.steps, args.timeout))
    results = {name: median_figures(rs) for name, rs in runs.items()}
    print(report(results, args.steps, args.rounds))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "steps": args.steps,
                    "rounds": args.rounds,
                    "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
                    "pins": PEERS,
                    "results": results,
                    "ratios": ratios(results),
                    "runs": runs,
                },
                indent=1,
            )
        )
        print(f"figures written to {args.json}")
