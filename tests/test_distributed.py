"""Distributed training under MindSpore's own launcher: 2 data-parallel workers on CPU, monitored.

Each launch costs ~30 s here (msrun, the scheduler and two MindSpore imports on 2 cores), so the
module runs three: a straggler run that also checks the run layout, a hang that the test ends
itself, and a manual dynamic-cluster launch without msrun.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil
import pytest

import mindwatch
from mindwatch.analysis.bands import CROSS_RANK_METRICS, band
from mindwatch.cli import main

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tests" / "dist_scripts" / "train_dp.py"
VENV_BIN = Path(sys.executable).parent

pytestmark = pytest.mark.slow


#: train_dp.py's last line, once its training and its mindwatch run are done
FINISHED = re.compile(r"^train_dp: rank \d+ finished", re.M)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Launch:
    """A group of processes started for one test, ended by the test (all of them, by process group)."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.seen: set[int] = set()
        self.worker_logs: list[tuple[Path, int]] = []  # msrun's log folders, and how many train_dp.py workers log there

    def start(self, cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        out = open(log, "wb")  # noqa: SIM115 (closed with the process)
        # in the log's folder: a worker whose graph fails to compile leaves rank_<R>/om/analyze_fail.ir in its working directory
        p = subprocess.Popen(cmd, cwd=log.parent, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        out.close()
        self.procs.append(p)
        self.seen.add(p.pid)
        return p

    def remember_children(self) -> None:
        # msrun starts each worker in a session of its own: note them while msrun still knows them
        for p in self.procs:
            with contextlib.suppress(psutil.Error):
                self.seen.update(c.pid for c in psutil.Process(p.pid).children(recursive=True))

    def alive(self) -> list[int]:
        out = []
        for pid in self.seen:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    out.append(pid)
            except psutil.Error:
                pass
        return out

    def expect_workers(self, log_dir: Path, local_workers: int) -> None:
        """The msrun job just started logs its ``local_workers`` train_dp.py workers to ``log_dir/worker_<rank>.log``."""
        self.worker_logs.append((log_dir, local_workers))

    def workers_finished(self) -> bool:
        """Every worker of :meth:`expect_workers` printed train_dp.py's last line: its training, mindwatch's run
        (mindwatch registers no exit hook) and the script are done."""

        def finished(log_dir: Path, workers: int) -> bool:
            logs = sorted(log_dir.glob("worker_*.log"))
            return len(logs) == workers and all(FINISHED.search(log.read_text(errors="replace")) for log in logs)

        return bool(self.worker_logs) and all(finished(*each) for each in self.worker_logs)

    def wait(self, timeout: float) -> list[int]:
        """The processes' exit codes once they have ended, or ``[0, ...]`` as soon as every msrun worker has
        finished: what follows is MindSpore's own teardown (each worker's finalize, the scheduler's, msrun's 1 s
        poll; ~5 s a launch here), which no test of mindwatch is about. :meth:`kill` then ends them. A job in which
        some worker does not finish (killed, failed, hung) is waited for to the end, and its codes are msrun's."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(p.poll() is None for p in self.procs):
            self.remember_children()
            if self.workers_finished():
                return [0 if p.poll() is None else p.returncode for p in self.procs]
            time.sleep(0.2)
        return [p.returncode for p in self.procs]

    def kill(self) -> None:
        self.remember_children()
        mine = os.getpgid(0)
        for pid in sorted(self.seen):
            try:
                pgid = os.getpgid(pid)
                if pgid != mine:
                    os.killpg(pgid, signal.SIGKILL)
                else:
                    os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)
        deadline = time.monotonic() + 15  # SIGKILL is delivered asynchronously: give the kernel a moment
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.1)


def base_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"  # msrun starts `python` from PATH
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}"
    env.setdefault("GLOG_v", "3")
    for k in [k for k in env if k.startswith("MS_") or k in ("RANK_ID", "RANK_SIZE", "MINDWATCH_RUN_ID")]:
        del env[k]
    # MindSpore's dynamic cluster retries a message (a worker's registration while the scheduler is not up yet) every
    # 3-5 s by default: 1 s instead takes ~3 s off each launch here, and changes nothing mindwatch does
    env.update(MS_RETRY_INTERVAL_LOWER="1", MS_RETRY_INTERVAL_UPPER="1")
    return env


def msrun(launch: Launch, log_dir: Path, *args: str, script: Path = SCRIPT) -> int:
    port = free_port()
    cmd = [
        str(VENV_BIN / "msrun"),
        "--worker_num=2",
        "--local_worker_num=2",
        f"--master_port={port}",
        "--join=True",
        f"--log_dir={log_dir}",
        str(script),
        *args,
    ]
    log_dir.mkdir(parents=True, exist_ok=True)
    launch.start(cmd, base_env(), log_dir / "msrun.out")
    launch.expect_workers(log_dir, 2)
    return port


def msrun_to_the_end(log_dir: Path, *args: str, expect_ok: bool = True, script: Path = SCRIPT) -> None:
    """One msrun job of ``script`` (train_dp.py) with ``args``, waited for; it must end well unless not ``expect_ok``."""
    launch = Launch()
    try:
        msrun(launch, log_dir, *args, script=script)
        codes = launch.wait(300)
        assert codes == [0] or not expect_ok, f"msrun failed ({codes}):\n{(log_dir / 'msrun.out').read_text()[-3000:]}"
    finally:
        launch.kill()


def only_run_dir(project_dir: Path) -> Path:
    runs = [p for p in project_dir.iterdir() if p.is_dir() and not p.name.startswith(".")]
    assert len(runs) == 1, f"every rank must write into one run directory, found {runs}"
    return runs[0]


def last_printed_step(log_dir: Path, rank: int) -> int:
    """The last ``RANK_STEP`` that ``rank`` printed (train_dp.py ``--print-steps``) into the worker logs in ``log_dir``:
    the step it finished last, whatever its writer had flushed when it was killed (the metrics file may lag: the
    writer flushes every ``flush_secs``)."""
    line = re.compile(rf"^RANK_STEP {rank} (\d+)$", re.MULTILINE)
    steps = [int(step) for log in log_dir.glob("*.log") for step in line.findall(log.read_text(errors="replace"))]
    assert steps, f"rank {rank} printed no step into {log_dir}"
    return max(steps)


def raw_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def worker_log(log_dir: Path, rank: int) -> str:
    return (log_dir / f"worker_{rank}.log").read_text(errors="replace")


# -- a straggler: rank 1's data pipeline takes 0.4 s per batch --------------------------------------------


class Webhooks:
    """A local webhook endpoint that notes each post and which process sent it."""

    def __init__(self) -> None:
        self.posts: list[tuple[int | None, dict]] = []
        hooks = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                hooks.posts.append((sender_pid(self.client_address[1]), body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def sender_pid(client_port: int) -> int | None:
    """The process whose TCP socket has local port ``client_port`` (the connection is open while we answer)."""
    for conn in psutil.net_connections(kind="tcp"):
        if conn.laddr and conn.laddr.port == client_port and conn.pid:
            return conn.pid
    return None


@dataclass
class DistRun:
    run_dir: Path
    logs: Path
    port: int
    posts: list[tuple[int | None, dict]]


@pytest.fixture(scope="module")
def straggler_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DistRun]:
    tmp = tmp_path_factory.mktemp("straggler")
    launch = Launch()
    hooks = Webhooks()
    try:
        notify = json.dumps({"notify": [{"type": "webhook", "url": hooks.url}]})
        port = msrun(
            launch,
            tmp / "logs",
            # 0.4 s a batch: more than a loaded machine's step, which would hide a shorter wait behind the prefetch
            *("--save-dir", str(tmp / "out"), "--steps", "30", "--slow-rank", "1", "--slow-secs", "0.4", "--config", notify),
        )
        codes = launch.wait(300)
        assert codes == [0], f"msrun failed ({codes}); see {tmp / 'logs'}:\n{(tmp / 'logs' / 'msrun.out').read_text()[-3000:]}"
        yield DistRun(only_run_dir(tmp / "out" / "dist"), tmp / "logs", port, hooks.posts)
    finally:
        launch.kill()
        hooks.close()


def test_every_rank_writes_its_own_files_and_steps_align(straggler_run: DistRun) -> None:
    run_dir = straggler_run.run_dir
    records = {rank: raw_records(run_dir / f"metrics.rank{rank}.jsonl") for rank in (0, 1)}
    for rank in (0, 1):
        assert {r["rank"] for r in records[rank]} == {rank}
        status = json.loads((run_dir / f"status.rank{rank}.json").read_text())
        assert status["rank"] == rank and status["state"] == "finished" and status["last_step"] == 30
    assert [r["step"] for r in records[0]] == [r["step"] for r in records[1]] == list(range(1, 31))
    # data parallel: each rank's loss is its own batch's, the gradient norm (after the AllReduce) is shared
    assert any(abs(a["loss"] - b["loss"]) > 1e-4 for a, b in zip(records[0], records[1], strict=True))
    assert [r["grad_norm"] for r in records[0]] == pytest.approx([r["grad_norm"] for r in records[1]], rel=1e-5)


def test_meta_has_world_size_and_only_rank_zero_wrote_it(straggler_run: DistRun) -> None:
    run_dir, port = straggler_run.run_dir, straggler_run.port
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["world_size"] == 2
    assert meta["launcher"] == "msrun" and meta["scheduler"] == f"127.0.0.1:{port}"
    status0 = json.loads((run_dir / "status.rank0.json").read_text())
    assert meta["pid"] == status0["pid"], "meta.json must come from rank 0"
    # the run id was agreed through rank 0's rendezvous file, keyed by the launch
    rendezvous = json.loads((run_dir.parent / ".rendezvous" / f"127.0.0.1_{port}_w2.json").read_text())
    assert rendezvous["run_id"] == run_dir.name == meta["run_id"]


def test_console_summaries_only_on_rank_zero(straggler_run: DistRun) -> None:
    logs = straggler_run.logs
    summary = re.compile(r"mindwatch step \d+[^\n|]*(\| ETA [^\n|]*)?\| loss")  # step 12/30 (40 %) | ETA 3 s | loss ...
    assert len(summary.findall(worker_log(logs, 0))) >= 2
    assert summary.findall(worker_log(logs, 1)) == []


def test_only_rank_zero_notifies_and_it_forwards_the_other_ranks_alerts(straggler_run: DistRun) -> None:
    run_dir, posts = straggler_run.run_dir, straggler_run.posts
    rank0_pid = json.loads((run_dir / "status.rank0.json").read_text())["pid"]
    assert posts, "no webhook post arrived"
    assert {pid for pid, _ in posts} == {rank0_pid}, "every post must come from rank 0's process"
    alerts = raw_records(run_dir / "alerts.jsonl")
    assert [b["event"] for _, b in posts].count("end") == 1  # one end-of-run message, from rank 0 too
    posts = [(pid, b) for pid, b in posts if b["event"] == "alert"]
    sent = sorted((b["rule"], b["rank"], b["step"]) for _, b in posts)
    assert sent == sorted((a["rule"], a["rank"], a["step"]) for a in alerts)  # each alert once, whoever raised it
    assert any(b["rank"] == 1 and "reported_by" not in b for _, b in posts)  # rank 1's own alert, forwarded


def test_straggler_alert_names_the_slow_rank(straggler_run: DistRun) -> None:
    run_dir, logs = straggler_run.run_dir, straggler_run.logs
    alerts = [a for a in raw_records(run_dir / "alerts.jsonl") if a["rule"] == "straggler"]
    assert alerts, f"no straggler alert; alerts: {raw_records(run_dir / 'alerts.jsonl')}"
    assert {a["rank"] for a in alerts} == {1}
    first = alerts[0]
    assert first["metric"] == "data_time" and first["reported_by"] == 0
    assert first["value"] > 0.1 and first["value"] > 2 * first["others_median"]
    assert "rank 1 is a straggler" in first["message"]
    assert "rank 1 is a straggler" in worker_log(logs, 0)  # rank 0 raised it


def test_cross_rank_band_matches_the_per_rank_series(straggler_run: DistRun) -> None:
    run_dir = straggler_run.run_dir
    run = mindwatch.open_run(run_dir)
    per_rank = {r: {rec["step"]: rec for rec in raw_records(run_dir / f"metrics.rank{r}.jsonl")} for r in (0, 1)}
    for metric in CROSS_RANK_METRICS:
        if metric == "tokens_per_second":
            continue  # the model reads float features, not token ids
        if metric == "throughput_linearity":
            continue  # no throughput.baseline in this run
        b = band(run, metric)
        assert b.ranks == [0, 1] and b.step.tolist() == list(range(1, 31)), metric
        for i, step in enumerate(b.step.tolist()):
            values = [per_rank[r][step][metric] for r in (0, 1)]
            assert b.min[i] == pytest.approx(min(values)) and b.max[i] == pytest.approx(max(values)), (metric, step)
            assert b.mean[i] == pytest.approx(sum(values) / 2)
            assert b.argmax[i] == int(np.argmax(values)) and b.count[i] == 2
    # the band shows who the straggler is: rank 1 waits for data at (nearly) every step once the prefetch ran dry
    data = band(run, "data_time")
    assert (data.argmax[-10:] == 1).all()


def test_dashboard_band_and_rank_lines_come_from_the_rank_files(straggler_run: DistRun) -> None:
    from starlette.testclient import TestClient

    from mindwatch.serve.app import create_app

    run_dir = straggler_run.run_dir
    per_rank = {r: {rec["step"]: rec for rec in raw_records(run_dir / f"metrics.rank{r}.jsonl")} for r in (0, 1)}
    run = f"dist/{run_dir.name}"
    with TestClient(create_app(run_dir.parent.parent)) as c:
        assert c.get("/api/run", params={"run": run}).json()["ranks"] == [0, 1]
        for metric in ("loss", "data_time", "step_time"):
            lines = {r: c.get("/api/series", params={"run": run, "metric": metric, "rank": r}).json()["points"] for r in (0, 1)}
            for r in (0, 1):
                assert lines[r] == [[s, pytest.approx(per_rank[r][s][metric])] for s in range(1, 31)], (metric, r)
            body = c.get("/api/band", params={"run": run, "metric": metric}).json()
            assert body["ranks"] == [0, 1]
            for step, lo, mean, hi in body["points"]:
                values = [per_rank[r][step][metric] for r in (0, 1)]
                assert (lo, mean, hi) == pytest.approx((min(values), sum(values) / 2, max(values))), (metric, step)
            assert [p[0] for p in body["points"]] == list(range(1, 31))


# -- a hang: rank 1's data pipeline blocks, rank 0 waits in the gradient AllReduce -----------------------


@pytest.mark.parametrize("mode", ["graph", "pynative"])
def test_hang_alert_names_the_blocked_rank_not_the_one_in_allreduce(
    tmp_path: Path, mode: str, capsys: pytest.CaptureFixture[str]
) -> None:
    launch = Launch()
    out = tmp_path / "out"
    try:
        msrun(
            launch,
            tmp_path / "logs",
            "--save-dir",
            str(out),
            "--steps",
            "40",
            "--block-rank",
            "1",
            "--block-at",
            "10",
            "--mode",
            mode,
        )
        # MindSpore's CPU AllReduce gives up after 30 s; the watchdogs (4 s) and rank 0's diagnosis come first
        hang = None
        deadline = time.monotonic() + 240
        while hang is None and time.monotonic() < deadline:
            launch.remember_children()
            alerts_files = list(out.glob("dist/*/alerts.jsonl"))
            if alerts_files:
                hang = next((a for a in raw_records(alerts_files[0]) if a["rule"] == "hang"), None)
            time.sleep(0.5)
        assert hang is not None, f"no hang alert; logs in {tmp_path / 'logs'}"
    finally:
        launch.kill()
    assert launch.alive() == [], (
        f"the test must end every process it started: {[psutil.Process(p).cmdline() for p in launch.alive()]}"
    )

    run_dir = only_run_dir(out / "dist")
    assert hang["culprits"] == [1] and hang["rank"] == 1
    assert hang["waiting"] == [0]
    assert "likely culprit: rank 1" in hang["message"]
    assert hang["places"]["0"]["where"] == "step" and hang["places"]["1"]["where"] == "data"
    assert "train_dp.py" in hang["places"]["1"]["detail"]  # where the stuck dataset code is
    dumps = {r: sorted((run_dir / "stacks").glob(f"stall_rank{r}_*.txt")) for r in (0, 1)}
    dumps = {r: [p for p in paths if not p.name.endswith(".faulthandler.txt")] for r, paths in dumps.items()}
    assert dumps[0] and dumps[1], f"both ranks dump their stacks: {list((run_dir / 'stacks').iterdir())}"
    # rank 0 in GRAPH mode: inside the compiled graph; in PyNative: in the step's ops, after the async AllReduce
    assert ("_exec_pip" if mode == "graph" else "mindspore/ops/") in dumps[0][0].read_text()
    assert "iterators.py" in dumps[1][0].read_text()  # rank 1: inside the dataset iterator
    stalls = [a for a in raw_records(run_dir / "alerts.jsonl") if a["rule"] == "stall"]
    assert {a["rank"] for a in stalls} == {0, 1}
    # the same verdict offline, from the run directory alone
    assert main(["hang", str(run_dir)]) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[0] == "likely culprit: rank 1, which the others wait for"
    assert "rank 1: waiting for its data pipeline" in printed


# -- a manual dynamic-cluster launch: scheduler and workers started by hand, no msrun -------------------


def test_manual_dynamic_cluster_launch(tmp_path: Path) -> None:
    launch = Launch()
    out = tmp_path / "out"
    port = free_port()
    try:
        # no MS_NODE_ID: the scheduler assigns the ranks when the cluster forms, so only the communication
        # layer knows them (from the environment alone both workers would claim rank 0)
        for i, role in enumerate(("MS_SCHED", "MS_WORKER", "MS_WORKER")):
            env = base_env()
            env.update(MS_ROLE=role, MS_WORKER_NUM="2", MS_SCHED_HOST="127.0.0.1", MS_SCHED_PORT=str(port))
            log = tmp_path / f"{role}_{i}.log"
            launch.start([sys.executable, str(SCRIPT), "--save-dir", str(out), "--steps", "6"], env, log)
        codes = launch.wait(300)
        assert codes == [0, 0, 0], [p.read_text()[-2000:] for p in sorted(tmp_path.glob("*.log"))]
    finally:
        launch.kill()
    run_dir = only_run_dir(out / "dist")
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["world_size"] == 2 and meta["launcher"] == "dynamic-cluster" and meta["scheduler"] == f"127.0.0.1:{port}"
    for rank in (0, 1):
        assert [r["step"] for r in raw_records(run_dir / f"metrics.rank{rank}.jsonl")] == list(range(1, 7))
