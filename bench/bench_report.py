"""After the run on a 1,000,000-step run: report, check and export times, against bare JSON parsing.

    .venv/bin/python -m bench report

The run is the dashboard benchmark's synthetic one (1,000,000 steps x 10 metrics, ~230 MB of
JSONL, one spike), written by RunWriter with its column files; then again without them (a run
from another tool or an older mindwatch: the JSONL is parsed). Baseline: ``json.loads`` of every
line into a list, the least any reader of the run directory must do without column files. Each
command is timed as a user runs it (a fresh process), so the figures include Python start-up
and imports.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.bench_dashboard import SPIKE_STEP, STEPS, write_long_run


def bare_parse(path: Path) -> float:
    t = time.perf_counter()
    with open(path, "rb") as f:
        records = [json.loads(line) for line in f]
    assert len(records) == STEPS
    return time.perf_counter() - t


def timed(args: list[str]) -> tuple[float, float, subprocess.CompletedProcess]:
    """Wall seconds and peak RSS (GB) of ``mindwatch ARGS`` in a fresh process.

    Peak RSS is the process's own high-water mark (VmHWM, reset at exec); ``ru_maxrss`` is not,
    on Linux it keeps the peak of the forked copy of this (large) benchmark process.
    """
    code = (
        "import re, sys; from mindwatch.cli import main; rc = main(sys.argv[1:]); "
        "print('VMHWM', re.search(r'VmHWM:\\s*(\\d+)', open('/proc/self/status').read()).group(1)); sys.exit(rc)"
    )
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    wall = time.perf_counter() - t
    m = re.search(r"VMHWM (\d+)", proc.stdout)
    return wall, (int(m.group(1)) / 1e6 if m else float("nan")), proc


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="mindwatch-bench-report-") as tmp:
        run = Path(tmp) / "bench" / "long"
        t = time.perf_counter()
        path = write_long_run(run)
        print(f"generated {STEPS:,} steps x 10 metrics ({path.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - t:.1f} s")
        base = bare_parse(path)
        print(f"baseline json.loads of every line: {base:.2f} s")
        out = Path(tmp) / "report.html"
        cases = [
            ("report", ["report", str(run), "-o", str(out)]),
            (
                "check (3 rules)",
                [
                    "check",
                    str(run),
                    "--rule",
                    "max(grad_norm, last=100) < 1e5",
                    "--rule",
                    "final(loss) < 2.5",
                    "--rule",
                    "alerts(severity='error') == 0",
                ],
            ),
            ("export csv", ["export", str(run), "--format", "csv", "-o", str(Path(tmp) / "m.csv")]),
            ("export parquet", ["export", str(run), "--format", "parquet", "-o", str(Path(tmp) / "m.parquet")]),
        ]
        for variant in ("with column files", "JSONL only"):
            if variant == "JSONL only":  # a run from another tool or an older mindwatch
                shutil.rmtree(run / "columns.rank0")
            print(f"{variant}:")
            for name, args in cases:
                wall, rss, proc = timed(args)
                if proc.returncode not in (0, 1):
                    print(f"  {name}: failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
                    continue
                print(f"  {name:16s} {wall:7.2f} s  ({wall / base:4.2f}x the bare parse)  peak RSS {rss:.2f} GB")
        html = out.read_text()
        data = json.loads(re.search(r'id="mindwatch-data" type="application/json">(.*?)</script>', html, re.S).group(1))
        loss = next(m for m in data["metrics"] if m["name"] == "loss")["series"][0]["data"]
        spike = [p for p in loss if p[0] == SPIKE_STEP]
        print(
            f"report: {out.stat().st_size / 1e6:.1f} MB HTML, {len(loss)} loss points, spike at step {SPIKE_STEP} kept: {spike}"
        )


if __name__ == "__main__":
    main()
