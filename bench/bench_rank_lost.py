"""Is the first dead rank named under ``msrun --join=True``? (10 kills, ~30 s each.)

``python -m bench rank_lost``

``msrun --join=True`` polls its workers once a second and SIGKILLs the survivors as soon as one
exits non-zero, so rank 0 has between 0 and ~1 s to notice that rank 1 is gone (its liveness
check of the local pids, every ``distributed.liveness_secs``) and to write it down. Each trial
trains ``tests/dist_scripts/train_dp.py`` on 2 workers, ``kill -9``s rank 1 after 30 recorded steps
and reads the run afterwards: named when ``open_run(...).lost`` holds rank 1.

Also: the coordination's cost, paired against coordination off, on the same job (one launch each).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import mindwatch

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tests" / "dist_scripts" / "train_dp.py"
VENV_BIN = Path(sys.executable).parent
KILLS = 10


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}"
    env.setdefault("GLOG_v", "3")
    for k in [k for k in env if k.startswith("MS_") or k in ("RANK_ID", "RANK_SIZE", "MINDWATCH_RUN_ID")]:
        del env[k]
    return env


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _msrun(tmp: Path, *args: str) -> subprocess.Popen[bytes]:
    cmd = [str(VENV_BIN / "msrun"), "--worker_num=2", "--local_worker_num=2", f"--master_port={_port()}", "--join=True"]
    cmd += [f"--log_dir={tmp / 'logs'}", str(SCRIPT), "--save-dir", str(tmp / "out"), *args]
    out = open(tmp / "msrun.out", "wb")  # noqa: SIM115 (closed with the process)
    return subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except OSError:
        return 0


def _end(proc: subprocess.Popen[bytes], timeout: float) -> None:
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout)
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def one_kill(tmp: Path) -> tuple[bool, float | None, str]:
    proc = _msrun(tmp, "--steps", "3000", "--pace-secs", "0.02")
    try:
        deadline = time.monotonic() + 240
        status1 = None
        while time.monotonic() < deadline and proc.poll() is None:
            status1 = next(iter((tmp / "out").glob("dist/*/status.rank1.json")), None)
            if status1 is not None and _lines(status1.parent / "metrics.rank1.jsonl") >= 30:
                break
            time.sleep(0.1)
        if status1 is None:
            return False, None, "no run started"
        pid = json.loads(status1.read_text())["pid"]
        os.kill(pid, signal.SIGKILL)
        killed = time.time()
        _end(proc, 60)
    finally:
        _end(proc, 0)
    run = mindwatch.open_run(status1.parent)
    lost = run.lost.get(1)
    state0 = run.states().get(0)
    if lost is None:
        return False, None, f"rank 0 ended {state0} without naming rank 1"
    return True, lost["t"] - killed, f"named {1000 * (lost['t'] - killed):.0f} ms after the kill; rank 0 {state0}"


def bench_kills(n: int = KILLS) -> None:
    named, delays = 0, []
    for i in range(n):
        with tempfile.TemporaryDirectory() as tmp:
            ok, delay, note = one_kill(Path(tmp))
        named += ok
        if delay is not None:
            delays.append(delay)
        print(f"  kill {i + 1}: {note}", flush=True)
    median = f"; median {1000 * statistics.median(delays):.0f} ms from kill -9 to the record" if delays else ""
    print(f"first-dead rank named under msrun --join=True: {named}/{n} kills{median}")


def bench_coordination_cost(steps: int = 400) -> None:
    """Seconds per step of the same 2-worker job with coordination on and off (msrun, GRAPH mode)."""
    per_step = {}
    for on in (True, False):
        with tempfile.TemporaryDirectory() as tmp:
            config = json.dumps({"distributed": {"coordination": {"enabled": on}}})
            proc = _msrun(Path(tmp), "--steps", str(steps), "--config", config)
            _end(proc, 300)
            run = mindwatch.open_run(next(Path(tmp).glob("out/dist/*")))
            times = run.series("step_time", 0).value[10:]  # after compilation and the prefetch warm-up
            per_step[on] = float(statistics.median(times))
    on, off = per_step[True], per_step[False]
    print(f"median step time, {steps} steps, 2 workers: coordination on {on * 1000:.2f} ms | off {off * 1000:.2f} ms")
    print(f"  ratio on / off: {on / off:.3f} (nothing is exchanged until an action is requested)")


def main() -> None:
    bench_coordination_cost()
    bench_kills()


if __name__ == "__main__":
    main()
