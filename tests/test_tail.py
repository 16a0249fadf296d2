"""``mindwatch tail`` in a pseudo-terminal: new steps and alerts show up as they are written; it exits when the run ends."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pexpect
import pytest

from mindwatch.store.layout import write_json_atomic
from mindwatch.store.writer import RunWriter
from mindwatch.terminal.tail import resolve_run, sparkline
from mindwatch.units import format_number


def spawn_tail(*args: str) -> pexpect.spawn:
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "140", "LINES": "40"}
    return pexpect.spawn(
        sys.executable,
        ["-m", "mindwatch.cli", "tail", *args],
        env=env,
        dimensions=(40, 140),
        encoding="utf-8",
        timeout=30,
    )


def start_run(tmp_path: Path, name: str = "live") -> RunWriter:
    run_dir = tmp_path / "proj" / name
    writer = RunWriter(run_dir, flush_secs=0.5)
    write_json_atomic(run_dir / "meta.json", {"run_id": name, "project": "proj", "started_at": time.time()})
    return writer


def record(step: int, loss: float) -> dict:
    return {"step": step, "epoch": 1, "t": time.time(), "loss": loss, "grad_norm": 1.0 / step, "step_time": 0.1}


def test_tail_follows_a_run_until_it_ends(tmp_path: Path) -> None:
    writer = start_run(tmp_path)
    writer.write([record(s, 3.0 - s / 100) for s in range(1, 4)])
    child = spawn_tail(str(writer.layout.root), "--interval", "0.1")
    try:
        child.expect("proj/live")
        child.expect("running")
        child.expect("step 3")
        writer.write([record(4, 1.2375)])  # a new step, written while tail watches
        child.expect("step 4")
        child.expect("1.238")  # 4 significant digits
        writer.append_alert(
            {
                "t": time.time(),
                "step": 4,
                "rank": 0,
                "rule": "spike",
                "metric": "loss",
                "value": 9.0,
                "severity": "warning",
                "message": "loss spiked to 9.0",
                "actions": [],
            }
        )
        child.expect("loss spiked to 9.0")
        writer.write([record(5, 1.1)])
        writer.close("finished")
        child.expect("run ended: finished at step 5")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0


def test_ctrl_c_leaves_cleanly(tmp_path: Path) -> None:
    writer = start_run(tmp_path)
    writer.write([record(1, 2.0)])
    child = spawn_tail(str(tmp_path), "--interval", "0.1")  # a log directory: its newest run
    try:
        child.expect("step 1")
        child.sendintr()
        child.expect("stopped following")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    assert "Traceback" not in (child.before or "")
    writer.close("finished")


def test_tail_of_a_missing_run(tmp_path: Path) -> None:
    child = spawn_tail(str(tmp_path / "nope"))
    child.expect("no run directory")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 2


def test_newest_run_and_sparkline(tmp_path: Path) -> None:
    old = start_run(tmp_path, "old")
    time.sleep(0.05)
    new = start_run(tmp_path, "new")
    assert resolve_run(tmp_path) == new.layout.root
    assert resolve_run(old.layout.root) == old.layout.root
    line = sparkline([1.0, 2.0, 3.0, float("nan"), 8.0])
    assert line.plain == "▁▂▃!█"
    with pytest.raises(FileNotFoundError):
        resolve_run(tmp_path / "proj" / "old" / "nothing")


def test_tail_of_a_killed_run_exits(tmp_path: Path) -> None:
    writer = start_run(tmp_path)
    writer.write([record(s, 2.0) for s in range(1, 6)])
    status = writer.status()
    status["updated_at"] = time.time() - 120  # the heartbeat stopped two minutes ago: kill -9
    write_json_atomic(writer.layout.status(0), status)
    child = spawn_tail(str(writer.layout.root), "--interval", "0.1")
    try:
        child.expect("stale")
        child.expect("run ended: stale at step 5")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0


def line_reader(proc, timeout: float):  # noqa: ANN001, ANN201
    """``next_line()``: the next line ``proc`` prints within ``timeout`` s, ``""`` once its output has ended (as
    ``readline`` gives). A thread reads the pipe: ``select`` on it misses lines that an earlier ``readline`` already
    buffered (two lines printed at once)."""
    import queue
    import threading

    lines: queue.Queue[str | None] = queue.Queue()
    ended = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()

    def next_line() -> str:
        if ended.is_set():
            return ""
        try:
            line = lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"tail printed nothing within {timeout:g} s") from None
        if line is None:
            ended.set()
            return ""
        return line

    return next_line


def test_without_a_terminal_tail_prints_a_line_a_step_as_it_comes(tmp_path: Path) -> None:
    """Piped into a file or another program (no TTY), ``tail`` prints plain lines while the run goes on."""
    import subprocess

    writer = start_run(tmp_path)
    writer.write([record(s, 3.0 - s / 100) for s in range(1, 4)])
    proc = subprocess.Popen(
        [sys.executable, "-m", "mindwatch.cli", "tail", str(writer.layout.root), "--interval", "0.1"],
        stdout=subprocess.PIPE,
        text=True,
        bufsize=1,
    )
    assert proc.stdout is not None

    next_line = line_reader(proc, 20)

    try:
        first = next_line()
        assert first.startswith("step 3 running") and "loss 2.97" in first, first
        writer.write([record(4, 1.2345)])
        assert next_line().startswith("step 4 running")
        writer.append_alert(
            {"t": time.time(), "step": 4, "rank": 0, "rule": "spike", "metric": "loss", "value": 9.0, "severity": "warning"}
            | {"message": "loss spiked to 9.0", "actions": []}
        )
        assert "ALERT [spike] rank 0 step 4: loss spiked to 9.0" in next_line()
        writer.close("finished")
        rest = [next_line() for _ in range(2)]
        assert any("run ended: finished at step 4" in line for line in rest), rest
        assert proc.wait(20) == 0
    finally:
        proc.kill()


def test_an_evaluation_is_a_line_of_its_own_never_a_step(tmp_path: Path) -> None:
    """A loop that evaluates: ``tail`` (piped) prints each evaluation once, after its step's line, and a step's line
    holds the step's training values even when the newest record is the evaluation after it."""
    import subprocess

    from evaluated_loop import EvaluatedLoop

    with EvaluatedLoop(tmp_path, project="proj") as loop:
        loop.train(3)
        loop.eval(loss=0.551234, accuracy=0.812345, eval_time=0.4, samples=512, epoch=1)
        wait_for_record(loop.run_dir, "eval/accuracy")  # the evaluation is the newest record when tail starts
        proc = subprocess.Popen(
            [sys.executable, "-m", "mindwatch.cli", "tail", str(loop.run_dir), "--interval", "0.1"],
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        assert proc.stdout is not None

        next_line = line_reader(proc, 30)

        try:
            first = next_line()
            assert first.startswith("step 3 running | loss ") and "eval" not in first and "accuracy" not in first, first
            assert f"loss {format_number(loop.losses[3])} " in first, (first, loop.losses[3])
            assert next_line() == "step 3 (epoch 1) eval | loss 0.5512 | accuracy 0.8123 | 0.4 s, 512 samples\n"
            loop.train(2)
            passed = [next_line()]
            while not passed[-1].startswith("step 5 running | loss "):  # tail may read step 4 alone first
                passed.append(next_line())
            assert all(line.startswith(("step 4 running | loss ", "step 5 running | loss ")) for line in passed), passed
            loop.eval(loss=0.4, accuracy=0.9, eval_time=65.0, epoch=2)
            assert next_line() == "step 5 (epoch 2) eval | loss 0.4 | accuracy 0.9 | 1m 05s\n"
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)

    once = subprocess.run(
        [sys.executable, "-m", "mindwatch.cli", "tail", str(loop.run_dir), "--once"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "160"},
    )
    assert "last evaluation: step 5 (epoch 2) eval | loss 0.4 | accuracy 0.9 | 1m 05s" in once.stdout, once.stdout
    rows = {line.split()[0] for line in once.stdout.splitlines() if line.strip()}
    assert {"eval/loss", "eval/accuracy", "loss"} <= rows
    assert not rows & {"eval_time", "eval_samples", "epoch"}, "coordinates and an evaluation's cost are no metric rows"


def wait_for_record(run_dir: Path, key: str, timeout: float = 20) -> None:
    """Until the rank's metrics file holds a record with ``key`` (the worker writes it a moment after the loop's call)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        path = run_dir / "metrics.rank0.jsonl"
        if path.exists() and f'"{key}"' in path.read_text():
            return
        time.sleep(0.05)
    raise AssertionError(f"no record with {key} in {run_dir} within {timeout} s")
