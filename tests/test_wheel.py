"""mindwatch as a user gets it: `make dist`, then the wheel alone in a fresh virtual environment, far from the checkout."""

from __future__ import annotations

import csv
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import REPO
from test_report import canvas_ink, open_page

import mindwatch
from mindwatch.store.layout import write_json_atomic
from mindwatch.store.writer import RunWriter

pytestmark = pytest.mark.slow


def clean_env(bin_dir: Path | None = None, path: str = "/usr/bin:/bin") -> dict[str, str]:
    """A user's shell: no PYTHONPATH to the checkout, no MINDWATCH_NODE_MODULES."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MINDWATCH_NODE_MODULES", "VIRTUAL_ENV")}
    env["PATH"] = f"{bin_dir}:{path}" if bin_dir else path
    env["GLOG_v"] = "3"
    return env


def run(cmd: list[str | Path], cwd: Path, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def new_venv(path: Path, requirement: str, *, installer: str = "pip") -> Path:
    """A fresh virtual environment with ``<requirement>`` installed; returns its bin folder.

    ``installer="pip"``: ``python -m venv`` plus ``pip install`` (``--no-compile``: Python compiles what it imports anyway,
    and byte-compiling all of MindSpore first costs ~10 s here). ``installer="uv"``: ``uv venv`` plus ``uv pip install``
    (uv is in the dev environment): it resolves the wheel's extras from its metadata as pip does, and takes MindSpore from
    the cache ``make setup`` filled, where pip downloaded its ~300 MB again (3.5 of the suite's minutes).
    """
    if installer == "uv":
        uv = Path(sys.executable).parent / "uv"
        made = run([uv, "venv", "-q", "--python", sys.executable, path], cwd=path.parent, env=clean_env())
        assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
        cmd = [uv, "pip", "install", "-q", "--python", path / "bin" / "python", requirement]
    else:
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
        cmd = [path / "bin" / "pip", "install", "-q", "--no-compile", requirement]
    installed = run(cmd, cwd=path, env=clean_env(path / "bin"))
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    return path / "bin"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's own build command, into a temporary folder."""
    out = tmp_path_factory.mktemp("dist")
    made = run(["make", "dist", f"DIST={out}", f"PY={sys.executable}"], cwd=REPO, env=clean_env(path=os.environ["PATH"]))
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == [
        f"mindwatch-{mindwatch.__version__}-py3-none-any.whl",
        f"mindwatch-{mindwatch.__version__}.tar.gz",
    ]
    with tarfile.open(out / f"mindwatch-{mindwatch.__version__}.tar.gz") as sdist:  # enough to rebuild the wheel without npm
        names = {n.split("/", 1)[-1] for n in sdist.getnames()}
    assert {"setup.py", "package.json", "package-lock.json", "mindwatch/assets/vendor/echarts.min.js"} <= names
    return out / f"mindwatch-{mindwatch.__version__}-py3-none-any.whl"


@pytest.fixture(scope="module")
def user_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder far from the checkout with no node_modules anywhere above it."""
    home = tmp_path_factory.mktemp("user")
    assert not any((d / "node_modules").exists() for d in [home, *home.parents])
    return home


def write_run(run_dir: Path) -> None:
    """A small finished run, written the way the callback writes it (no MindSpore needed)."""
    t0 = time.time() - 100
    w = RunWriter(run_dir, rank=0)
    recs = [
        {"step": s, "epoch": 1, "t": t0 + s, "rank": 0, "loss": 5.0 / s, "lr": 1e-3, "grad_norm": 1.0 + s % 3}
        | {"step_time": 0.1, "data_time": 0.01, "samples_per_second": 100.0 + s}
        for s in range(1, 41)
    ]
    w.write(recs)
    w.append_alert({"t": t0 + 5, "step": 5, "rank": 0, "rule": "spike", "metric": "loss", "severity": "warning"})
    w.close("finished")
    meta = {"run_id": run_dir.name, "project": run_dir.parent.name, "tags": ["wheel"], "started_at": t0, "ended_at": t0 + 41}
    write_json_atomic(run_dir / "meta.json", meta)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_wheel_alone_serves_reports_checks_and_exports(wheel: Path, user_home: Path, browser, tmp_path: Path) -> None:
    bin_dir = new_venv(tmp_path / "venv", str(wheel))
    env = clean_env(bin_dir)
    where = run(["python", "-c", "import mindwatch; print(mindwatch.__file__)"], cwd=user_home, env=env)
    assert where.stdout.startswith(str(tmp_path / "venv")), where
    assert run(["python", "-c", "import mindspore"], cwd=user_home, env=env).returncode != 0  # the core needs no MindSpore
    version = run(["mindwatch", "--version"], cwd=user_home, env=env)
    assert version.stdout.strip() == f"mindwatch {mindwatch.__version__}"

    logdir = user_home / "monitor_output"
    run_dir = logdir / "wheel" / "run_1"
    write_run(run_dir)

    port = free_port()
    server = subprocess.Popen(
        ["mindwatch", "serve", str(logdir), "--port", str(port)], cwd=user_home, env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        assert f"at http://127.0.0.1:{port}/" in server.stdout.readline()
        for _ in range(100):
            try:
                page = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5).read().decode()
                break
            except OSError:
                time.sleep(0.1)
        assert '<script src="/static/echarts.min.js"></script>' in page
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/static/echarts.min.js", timeout=5) as r:
            assert r.headers["Content-Type"].startswith("text/javascript")
            assert b"echarts" in r.read()[:2000]
    finally:
        server.terminate()
        server.wait(10)

    report = run(["mindwatch", "report", run_dir, "-o", "report.html"], cwd=user_home, env=env)
    assert report.returncode == 0, report.stderr
    page, problems, requests = open_page(browser, user_home / "report.html")
    try:
        assert problems == [] and requests == []
        ink = canvas_ink(page)
        assert ink and all(n > 0 for n in ink), ink
    finally:
        page.close()

    check = run(["mindwatch", "check", run_dir, "--rule", "final(loss) < first(loss)", "--rule", "steps() == 40"], user_home, env)
    assert check.returncode == 0, check.stdout + check.stderr
    export = run(["mindwatch", "export", run_dir, "-o", "metrics.csv"], cwd=user_home, env=env)
    assert export.returncode == 0, export.stderr
    rows = list(csv.DictReader((user_home / "metrics.csv").open()))
    assert [int(r["step"]) for r in rows] == list(range(1, 41))


def test_the_mindspore_extra_trains_the_demo(wheel: Path, user_home: Path, tmp_path: Path) -> None:
    bin_dir = new_venv(tmp_path / "venv", f"{wheel}[mindspore]", installer="uv")
    demo = run(
        ["mindwatch", "demo", "--no-dashboard", "--steps", "20", "--save-dir", "out"], cwd=user_home, env=clean_env(bin_dir)
    )
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    (run_dir,) = (user_home / "out" / "demo").iterdir()
    assert mindwatch.open_run(run_dir).series("loss").step.tolist() == list(range(1, 21))


def tree_copy(dest: Path) -> Path:
    """The checkout's files as git sees them (tracked and new, not ignored): no node_modules, no built copies."""
    names = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO, capture_output=True, check=True
    ).stdout.decode()
    for name in filter(None, names.split("\0")):
        if (REPO / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            (dest / name).write_bytes((REPO / name).read_bytes())
    return dest


def test_a_build_without_echarts_fails_and_says_what_to_run(tmp_path: Path) -> None:
    tree = tree_copy(tmp_path / "tree")
    built = run([sys.executable, "-m", "build", "--outdir", tmp_path / "dist"], cwd=tree, env=clean_env(path=os.environ["PATH"]))
    assert built.returncode != 0
    assert "mindwatch build: ECharts is missing from" in built.stdout + built.stderr
    assert "Run `npm ci` in the checkout first" in built.stdout + built.stderr
    assert not (tmp_path / "dist").exists() or not list((tmp_path / "dist").glob("*.whl"))

    make = shutil.which("make") or "make"
    no_npm = run([make, "dist", f"PY={sys.executable}"], cwd=tree, env=clean_env(path=str(tmp_path / "empty-bin")))
    assert no_npm.returncode != 0
    assert "make dist: npm not found: install Node.js and npm" in no_npm.stderr
