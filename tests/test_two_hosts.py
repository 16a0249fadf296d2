"""Two hosts without a shared file system: two network namespaces joined by a veth pair, one msrun node in each.

Each node records under its own save_dir; the job trains from step 1 on both, a stop that rank 1's rule alone
asks for ends both ranks at one step, and the two folders read as one run. Needs root (``ip netns``); skips with
the reason otherwise. The namespaces carry traffic only between themselves and are deleted afterwards.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import wait_for
from test_distributed import SCRIPT, VENV_BIN, Launch, base_env, last_printed_step, only_run_dir, raw_records

import mindwatch
from mindwatch.report.html import render_report
from mindwatch.store.jsonl import read_last_record

HOOK_SERVER = Path(__file__).parent / "scripts" / "hook_server.py"

pytestmark = pytest.mark.slow


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)


@pytest.fixture
def two_hosts() -> Iterator[tuple[str, str, str]]:
    """``(namespace 1, namespace 2, the first one's address)``."""
    tag = os.getpid() % 200 + 20
    h1, h2, va, vb = f"mwh1_{tag}", f"mwh2_{tag}", f"mwva{tag}", f"mwvb{tag}"
    first = _ip("netns", "add", h1)
    if first.returncode != 0:
        pytest.skip(f"cannot make network namespaces here (ip netns add: {first.stderr.strip()}); needs root and iproute2")
    try:
        _ip("netns", "add", h2)
        steps = [
            ("link", "add", va, "type", "veth", "peer", "name", vb),
            ("link", "set", va, "netns", h1),
            ("link", "set", vb, "netns", h2),
            ("-n", h1, "addr", "add", f"10.231.{tag}.1/24", "dev", va),
            ("-n", h2, "addr", "add", f"10.231.{tag}.2/24", "dev", vb),
            ("-n", h1, "link", "set", va, "up"),
            ("-n", h2, "link", "set", vb, "up"),
            ("-n", h1, "link", "set", "lo", "up"),
            ("-n", h2, "link", "set", "lo", "up"),
        ]
        for step in steps:
            done = _ip(*step)
            if done.returncode != 0:
                pytest.skip(f"cannot join the namespaces (ip {' '.join(step)}: {done.stderr.strip()})")
        yield h1, h2, f"10.231.{tag}.1"
    finally:
        _ip("netns", "del", h1)
        _ip("netns", "del", h2)


def start_nodes(job: Launch, tmp_path: Path, two_hosts: tuple[str, str, str], *args: str) -> None:
    """One msrun node in each namespace (one worker each), node N recording under ``tmp_path/nodeN``; ``args`` to
    the training script."""
    h1, h2, master = two_hosts
    env = base_env()
    for node, ns in enumerate((h1, h2)):
        log_dir = tmp_path / f"logs{node}"
        log_dir.mkdir()
        cmd = ["ip", "netns", "exec", ns, "env", f"PATH={env['PATH']}", str(VENV_BIN / "msrun")]
        cmd += ["--worker_num=2", "--local_worker_num=1", f"--node_rank={node}", f"--master_addr={master}"]
        cmd += ["--master_port=8118", "--join=True", f"--log_dir={log_dir}", str(SCRIPT)]
        cmd += ["--save-dir", str(tmp_path / f"node{node}"), *args]
        job.start(cmd, env, log_dir / "msrun.out")
        job.expect_workers(log_dir, 1)


def test_two_hosts_with_their_own_save_dirs_train_from_step_1_and_stop_together(tmp_path: Path, two_hosts) -> None:
    config = {
        "callback": {"params": {"warn_on_value": {"data_time": 0.5}}},
        "alerts": {"thresholds": {"actions": ["stop"]}},
    }
    job = Launch()
    try:
        spike = ["--spike-rank", "1", "--spike-at", "60", "--spike-secs", "1.5", "--config", json.dumps(config)]
        start_nodes(job, tmp_path, two_hosts, "--steps", "160", "--pace-secs", "0.02", *spike)
        codes = job.wait(300)
        assert codes == [0, 0], f"msrun failed ({codes}):\n{(tmp_path / 'logs0' / 'msrun.out').read_text()[-2000:]}"
    finally:
        job.kill()
    dirs = [only_run_dir(tmp_path / f"node{node}" / "dist") for node in (0, 1)]
    assert dirs[0].name == dirs[1].name, "one run id on both hosts"
    assert [p.name for p in dirs[0].glob("metrics.rank*.jsonl")] == ["metrics.rank0.jsonl"]
    assert [p.name for p in dirs[1].glob("metrics.rank*.jsonl")] == ["metrics.rank1.jsonl"]
    steps = {rank: [r["step"] for r in raw_records(dirs[rank] / f"metrics.rank{rank}.jsonl")] for rank in (0, 1)}
    assert steps[0][0] == steps[1][0] == 1
    assert steps[0][-1] == steps[1][-1] < 160, "both ranks stopped at one step, before the data ran out"
    run = mindwatch.open_run(dirs[0], dirs[1])
    assert run.ranks == [0, 1] and run.state == "stopped"
    assert [a["rank"] for a in run.alerts if a["rule"] == "threshold"] == [1]
    assert not [a for a in run.alerts if a["rule"] == "rank_lost"], "a clean stop is not a lost rank"


@pytest.mark.parametrize("victim", [0, 1])
def test_on_two_hosts_without_a_shared_folder_the_other_rank_names_a_killed_one(tmp_path: Path, two_hosts, victim: int) -> None:
    """``kill -9`` of one rank on its own host: the other rank names it in its own folder (its lifeline to rank 0
    closed), with the killed process's pid and its last step: rank 1 names rank 0, rank 0 names rank 1."""
    job = Launch()
    try:
        start_nodes(job, tmp_path, two_hosts, "--steps", "400", "--pace-secs", "0.05", "--print-steps")
        deadline = time.monotonic() + 180
        while True:
            found = list((tmp_path / f"node{victim}").glob(f"dist/*/status.rank{victim}.json"))
            status = json.loads(found[0].read_text()) if found else {}
            if (status.get("last_step") or 0) >= 20:
                break
            assert time.monotonic() < deadline, "the training did not reach step 20"
            time.sleep(0.2)
        os.kill(status["pid"], signal.SIGKILL)
        survivor = 1 - victim
        folder = only_run_dir(tmp_path / f"node{survivor}" / "dist")
        deadline = time.monotonic() + 30  # named within a second; msrun itself takes ~50 s to end the job
        while not (lost := _lost(folder)):
            assert time.monotonic() < deadline, f"rank {survivor} did not name rank {victim}"
            time.sleep(0.1)
        time.sleep(0.5)  # a second alert, if one were raised, would be here by now
        lost = _lost(folder)
    finally:
        job.kill()
    named = [(a["rank"], a["reported_by"], a["how"], a["pid"]) for a in lost]
    assert named == [(victim, survivor, "disconnected", status["pid"])]
    # at least what the killed rank's writer flushed (the survivor names the step its own worker last saw, which
    # lags the training as that writer does), at most one more than the killed rank printed (train_dp.py
    # --print-steps: its last finished step, whatever kill -9 cut from its files)
    written = raw_records(only_run_dir(tmp_path / f"node{victim}" / "dist") / f"metrics.rank{victim}.jsonl")[-1]["step"]
    printed = last_printed_step(tmp_path / f"logs{victim}", victim)
    assert written <= lost[0]["step"] <= printed + 1, (written, lost[0]["step"], printed)
    assert f"rank {victim} is gone" in lost[0]["message"]
    status = json.loads((folder / f"status.rank{survivor}.json").read_text())
    assert str(victim) in status["lost_ranks"]


def _lost(folder: Path) -> list[dict]:
    """The ``rank_lost`` alerts in a run folder's alerts.jsonl so far (a line being written is read next time)."""
    return [a for a in _alerts_in(folder) if a.get("rule") == "rank_lost"]


def _alerts_in(folder: Path) -> list[dict]:
    try:
        lines = (folder / "alerts.jsonl").read_text().splitlines()
    except OSError:
        return []
    alerts = []
    for line in lines:
        try:
            alerts.append(json.loads(line))
        except ValueError:
            continue
    return alerts


def test_a_host_that_vanishes_is_named_within_the_keep_alive_and_every_channel_hears_it(tmp_path: Path, two_hosts) -> None:
    """Rank 1's link goes down mid-run (power, network: nothing comes back, no process exits). Rank 0 names rank 1
    within ``distributed.lifeline_keepalive_secs`` and tells its channel (a webhook on rank 0's host)."""
    h1, h2, _ = two_hosts
    keepalive, hooks = 6.0, tmp_path / "hooks.jsonl"
    server = subprocess.Popen(["ip", "netns", "exec", h1, sys.executable, str(HOOK_SERVER), "8119", str(hooks)])
    config = {
        "distributed": {"lifeline_keepalive_secs": keepalive},
        "notify": [{"type": "webhook", "url": "http://127.0.0.1:8119/hook"}],
    }
    job = Launch()
    try:
        start_nodes(job, tmp_path, two_hosts, "--steps", "2000", "--pace-secs", "0.05", "--config", json.dumps(config))
        folder = wait_for(lambda: next(iter((tmp_path / "node0").glob("dist/*/metrics.rank0.jsonl")), None), 180).parent
        wait_for(lambda: (read_last_record(folder / "metrics.rank0.jsonl") or {}).get("step", 0) >= 20, 120)
        assert _ip("-n", h2, "link", "set", _peer_link(h2), "down").returncode == 0
        down = time.time()
        lost = wait_for(lambda: _lost(folder), keepalive + 30)
        told = wait_for(lambda: [b for b in _posts(hooks) if b.get("rule") == "rank_lost"], 20)
    finally:
        job.kill()
        server.kill()
    named = [(a["rank"], a["reported_by"], a["how"]) for a in lost]
    assert named == [(1, 0, "unreachable")], lost
    assert lost[0]["t"] - down <= keepalive + 10.0, "named within the keep-alive (a margin for a loaded machine)"
    assert "stopped answering" in lost[0]["message"]
    assert [(b["lost_rank"], b["reported_by"]) for b in told] == [(1, 0)]


def test_a_hang_on_two_hosts_brings_both_stack_dumps_into_rank_0s_folder(tmp_path: Path, two_hosts) -> None:
    """Rank 1's data pipeline blocks; each node records in its own folder. Rank 1's stall dump travels over the
    lifeline: rank 0's folder holds both dumps, its hang alert names rank 1, and the report shows both dumps."""
    job = Launch()
    try:
        start_nodes(job, tmp_path, two_hosts, "--steps", "400", "--block-rank", "1", "--block-at", "20")
        hang = wait_for(lambda: [a for a in _alerts(tmp_path / "node0") if a.get("rule") == "hang"], 240)
    finally:
        job.kill()
    folder = only_run_dir(tmp_path / "node0" / "dist")
    dumps = sorted({p.name.split("_")[1] for p in (folder / "stacks").glob("stall_rank*_*.txt")})
    assert dumps == ["rank0", "rank1"], dumps
    assert hang[0]["culprits"] == [1], hang[0]["message"]
    assert hang[0]["places"]["1"]["where"] == "data", hang[0]["places"]
    html = render_report([mindwatch.open_run(folder)])
    for rank in (0, 1):
        assert f"stall_rank{rank}_" in html, f"the report shows rank {rank}'s dump"


def _peer_link(ns: str) -> str:
    """The name of the veth end inside namespace ``ns``."""
    out = _ip("-n", ns, "-o", "link", "show").stdout
    return next(line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if "veth" in line or "mwvb" in line)


def _posts(path: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return []


def _alerts(node: Path) -> list[dict]:
    """The alerts of the run recorded under a node's save_dir, so far."""
    found = list(node.glob("dist/*/alerts.jsonl"))
    return _alerts_in(found[0].parent) if found else []
