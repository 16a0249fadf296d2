"""Cost of the cross-rank signal under msrun (2 workers, the demo-sized model, data parallel, GRAPH mode, CPU).

Run: ``python -m bench signal [--rounds 8 --steps 40]`` (``MINDWATCH_BENCH_QUICK=1``: a short smoke run).

Paired rounds in the same two processes, the arms rotating: our train cell without the signal vector and with
it (its AllReduce inside the step, with the rank's ``local_grad_norm`` added in the graph; a third arm without that
norm gives its own cost), and a loop that reads the loss, without and with the loop's one small
AllReduce of the signal every ``distributed.coordination.loop_every`` steps (10, as ``start_run`` does).
Prints rank 0's median step times, the paired per-round ratios and the CPU seconds per step of the training
thread and of the others (MindSpore's runtime): wall time on 2 shared cores swings; CPU time much less.
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
from pathlib import Path

from bench.bench_overhead import spread

QUICK = os.environ.get("MINDWATCH_BENCH_QUICK") == "1"
WORKER = Path(__file__).resolve().parent / "msrun" / "signal_worker.py"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench signal", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2 if QUICK else 8)
    p.add_argument("--steps", type=int, default=10 if QUICK else 40)
    args = p.parse_args(argv or [])
    venv_bin = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}", "GLOG_v": "3"}
    env["PYTHONPATH"] = f"{Path(__file__).resolve().parent.parent}{os.pathsep}{env.get('PYTHONPATH', '')}"
    with tempfile.TemporaryDirectory() as logs:
        cmd = [str(venv_bin / "msrun"), "--worker_num=2", "--local_worker_num=2", f"--master_port={_port()}", "--join=True"]
        cmd += [f"--log_dir={logs}", str(WORKER), str(args.rounds), str(args.steps)]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
        text = (Path(logs) / "worker_0.log").read_text(errors="replace") if (Path(logs) / "worker_0.log").exists() else ""
    line = next((ln for ln in text.splitlines() if ln.startswith("SIGNAL_BENCH ")), None)
    if done.returncode != 0 or line is None:
        print(f"bench signal: msrun failed ({done.returncode}):\n{text[-3000:]}{done.stdout[-2000:]}", file=sys.stderr)
        raise SystemExit(1)
    out = json.loads(line.split(" ", 1)[1])
    print(
        f"msrun, 2 workers, data parallel, GRAPH, demo-sized model; {args.rounds} rotating rounds x {args.steps} steps (rank 0):"
    )
    for arm, r in out.items():
        print(
            f"  {arm:20s} median step {statistics.median(r['step']) * 1e3:7.2f} ms | CPU per step: training thread "
            f"{statistics.median(r['training']) * 1e3:6.2f} ms, others {statistics.median(r['other']) * 1e3:6.2f} ms"
        )
    pairs = (("train cell", "train cell + signal"), ("+ signal, no local norm", "train cell + signal"), ("loop", "loop + signal"))
    for base, arm in pairs:
        wall = [a / b for a, b in zip(out[arm]["step"], out[base]["step"], strict=True)]
        cpu = [
            (a1 + a2) / (b1 + b2)
            for a1, a2, b1, b2 in zip(
                out[arm]["training"], out[arm]["other"], out[base]["training"], out[base]["other"], strict=True
            )
        ]
        print(f"  {arm} / {base}: wall {spread(wall)}; process CPU {spread(cpu)} (target <= 1.01)")


if __name__ == "__main__":
    main()
