"""Shared fixtures. Tests train real (small) MindSpore models on CPU."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from mindwatch.store.columns import RankColumns

if TYPE_CHECKING:
    from playwright.sync_api import Browser

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO / "test-artifacts"

#: Debian's Chromium, as the browser tests start it (headless, root, no network of its own).
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow modules (msrun jobs, browsers, installs) first, the quick ones after: under pytest-xdist (``make test``
    runs ``-n 3 --dist loadfile --no-loadscope-reorder``), a long module that starts last would run alone at the end,
    while the quick ones fill whatever time is left on the other workers. A stable sort: each module's order stays."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(scope="module")
def chromium() -> Iterator[Browser]:
    """One headless Chromium for a test module (``browser`` is what a test asks for)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def browser(chromium: Browser) -> Iterator[Browser]:
    """The module's Chromium; the pages a test opened (``browser.new_page()``) are closed after it."""
    yield chromium
    for context in chromium.contexts:
        context.close()


@pytest.fixture
def artifacts_dir() -> Path:
    """Where tests keep screenshots and reports for a person to look at (git-ignored)."""
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


@pytest.fixture(scope="session")
def report_runs(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> dict[str, Path]:
    """Three real small trainings, run once per session: ``finished``, ``failed`` (NaN loss, then the data
    source raises) and ``killed`` (``kill -9`` mid-run). See tests/scripts/report_training.py.

    Under pytest-xdist the first worker that asks trains them in the session's shared temp folder, under a lock;
    the others wait for it and read the same runs."""
    if worker_id == "master":
        return _train_report_runs(tmp_path_factory.mktemp("report-runs"))
    import fcntl

    shared = tmp_path_factory.getbasetemp().parent  # the session's folder, above each worker's own
    with open(shared / "report-runs.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        save_dir, done = shared / "report-runs", shared / "report-runs.done"
        if not done.exists():
            save_dir.mkdir(exist_ok=True)
            _train_report_runs(save_dir)
            done.touch()
    return {kind: save_dir / "report-tests" / kind for kind in ("finished", "failed", "killed")}


def _train_report_runs(save_dir: Path) -> dict[str, Path]:
    import os
    import signal
    import subprocess
    import sys
    import time

    script = REPO / "tests" / "scripts" / "report_training.py"
    env = {**os.environ, "GLOG_v": "3", "PYTHONUNBUFFERED": "1"}

    def start(kind: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, str(script), kind, str(save_dir)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=save_dir,
        )

    procs = {kind: start(kind) for kind in ("finished", "failed", "killed")}
    killed, seen = procs["killed"], []
    deadline = time.time() + 240
    assert killed.stdout is not None
    for line in killed.stdout:  # kill -9 once 8 steps are done
        seen.append(line)
        if line.strip() == "STEP 8" or time.time() > deadline:
            break
    metrics = save_dir / "report-tests" / "killed" / "metrics.rank0.jsonl"
    while time.time() < deadline and '"step":8,' not in (metrics.read_text() if metrics.exists() else ""):
        time.sleep(0.02)  # the worker writes each step within ~50 ms; kill once step 8 is on disk
    killed.send_signal(signal.SIGKILL)
    killed.wait(30)
    assert "STEP 8\n" in seen, "".join(seen[-30:])
    for kind in ("finished", "failed"):
        out, _ = procs[kind].communicate(timeout=300)
        assert ("RUN_DIR" in out) and (procs[kind].returncode == 0) == (kind == "finished"), out[-3000:]
    return {kind: save_dir / "report-tests" / kind for kind in procs}


def parsed_copy(path: Path, tmp_path: Path) -> RankColumns:
    """The same JSONL read the slow way: a copy with no column files beside it."""
    copy = tmp_path / "parsed" / path.name
    copy.parent.mkdir(exist_ok=True)
    shutil.copyfile(path, copy)
    cols = RankColumns(copy, segment_bytes=512)
    cols.refresh()
    assert not cols.from_files
    return cols


def assert_same_columns(a: RankColumns, b: RankColumns) -> None:
    assert a.lines == b.lines
    np.testing.assert_array_equal(a.steps, b.steps)
    assert a.keys == b.keys
    for metric in sorted(b.keys | {"t", "epoch", "absent"}):
        for x, y in zip(a.column(metric), b.column(metric), strict=True):
            np.testing.assert_array_equal(x, y, err_msg=metric)
    line = np.arange(a.lines)
    np.testing.assert_array_equal(a.time_of_lines(line), b.time_of_lines(line))


def dense_training(steps: int, secs_per_step: float = 0.0, fail_at: int | None = None):
    """A one-layer regression in GRAPH mode: ``(model, dataset)``; the data source sleeps ``secs_per_step``
    before each batch (a steady pipeline) and raises ``OSError`` at batch ``fail_at``."""
    import time

    import mindspore as ms
    from mindspore import dataset as ds
    from mindspore import nn
    from mindspore.train import Model

    from mindwatch.demo.train import set_mode

    set_mode("graph")
    ms.set_seed(0)
    net = nn.Dense(4, 1)
    model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), learning_rate=0.01))

    def batches():
        for i in range(steps):
            if fail_at is not None and i == fail_at:
                raise OSError("shard 7 is corrupt")
            time.sleep(secs_per_step)
            yield np.full((8, 4), i % 7, np.float32), np.ones((8, 1), np.float32)

    return model, ds.GeneratorDataset(batches, ["x", "y"], shuffle=False)


def start_printing_steps(args: list[str], seen: dict[int, float], **popen) -> tuple[subprocess.Popen, threading.Thread]:
    """Start a training script in its own process group; a thread fills ``seen`` from its ``STEP <step> <x>`` lines."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True, **popen)

    def read_steps() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            if line.startswith("STEP "):
                _, step, x = line.split()
                seen[int(step)] = float(x)

    reader = threading.Thread(target=read_steps, daemon=True)
    reader.start()
    return proc, reader


def kill_after_steps(proc: subprocess.Popen, reader: threading.Thread, seen: dict[int, float], steps: int, then: float) -> float:
    """Let a training of :func:`start_printing_steps` reach ``steps``, run ``then`` s more, then ``kill -9`` it (returns when)."""
    try:
        deadline = time.time() + 120
        while len(seen) < steps and time.time() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert len(seen) >= steps, f"the training did not reach step {steps} (saw {len(seen)} steps)"
        time.sleep(then)
        killed_at = time.time()
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    reader.join(5)
    return killed_at


def wait_for(probe, timeout: float, what: str = "the condition", interval: float = 0.1, transient: tuple = ()):  # noqa: ANN001, ANN201
    """``probe()`` once it is truthy, asked every ``interval`` s for up to ``timeout`` s.

    An exception of a ``transient`` type counts as "not yet" (a page mid-reload); the last one is named if time runs out.
    """
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            found = probe()
        except transient as error:
            found, last_error = None, error
        if found:
            return found
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}" + (f" (last: {last_error})" if last_error else ""))
