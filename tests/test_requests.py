"""A person acts on a live run from a shell: mindwatch lr | checkpoint | set | stop on a real GRAPH training."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import wait_for

import mindwatch
from mindwatch.store.requests import RequestError, file_request, pending_requests, requester

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).parent / "scripts" / "train_live.py"
ENV = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def mindwatch_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mindwatch.cli", *args], capture_output=True, text=True, env=ENV, timeout=120)


def status(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "status.rank0.json").read_text())
    except (OSError, ValueError):
        return {}


def taken_at(answer: str) -> int:
    """The step in the CLI's ``... taken at step N: ...``: the request was carried out after it."""
    return int(answer.split("taken at step ")[1].split(":")[0])


def recorded(run_dir: Path, metric: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows = [json.loads(line) for line in (run_dir / "metrics.rank0.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if metric in r]
    return np.array([r["step"] for r in rows]), np.array([r[metric] for r in rows]), np.array([r["t"] for r in rows])


@pytest.mark.slow
def test_a_person_slows_checkpoints_zooms_into_and_stops_a_live_graph_training(tmp_path: Path) -> None:
    import mindspore as ms

    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), str(tmp_path)], env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    run_dir = tmp_path / "live" / "acted"
    try:
        wait_for(lambda: status(run_dir).get("state") == "running" and (status(run_dir).get("last_step") or 0) >= 20, 120)

        # lr x 0.5: the recorded lr halves from the step after the one the answer names
        out = mindwatch_cli("lr", str(run_dir), "--factor", "0.5", "--reason", "loss climbs", "--wait", "20")
        assert out.returncode == 0, out.stderr
        assert "taken at step" in out.stdout, out.stdout
        lr_at = taken_at(out.stdout)
        wait_for(lambda: (recorded(run_dir, "lr")[1] < 0.0075).any(), 30)
        steps, lr, t = recorded(run_dir, "lr")
        halved = np.flatnonzero(lr < 0.0075)
        first = halved[0]
        assert lr[:first] == pytest.approx(0.01) and lr[first:] == pytest.approx(0.005)
        assert steps[first] == lr_at + 1, (lr_at, steps[first])
        step_secs = float(np.median(np.diff(t[:first])))

        # checkpoint: a file in checkpoints/ that loads
        out = mindwatch_cli("checkpoint", str(run_dir), "--wait", "20")
        assert out.returncode == 0 and "taken at step" in out.stdout, out.stdout + out.stderr
        (ckpt,) = (run_dir / "checkpoints").glob("*.ckpt")
        params = ms.load_checkpoint(str(ckpt))
        assert any(name.endswith("weight") for name in params), sorted(params)

        # set layers.every=1: a layer row every step from then on (before: step 1 only)
        out = mindwatch_cli("set", str(run_dir), "layers.every=1", "--wait", "20")
        assert out.returncode == 0 and "taken at step" in out.stdout, out.stdout + out.stderr
        set_at = taken_at(out.stdout)
        time.sleep(1.5)

        # stop with a reason: the run ends stopped with it, at the step the answer names
        out = mindwatch_cli("stop", str(run_dir), "--reason", "x marks it", "--wait", "20")
        assert out.returncode == 0 and "taken at step" in out.stdout, out.stdout + out.stderr
        stop_at = taken_at(out.stdout)
        proc.wait(60)
        ended = status(run_dir)
        assert ended["state"] == "stopped"
        assert ended["reason"] == f"stopped by {requester()}: x marks it"
        assert ended["last_step"] == stop_at
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert proc.returncode == 0, proc.stderr.read().decode()[-3000:]  # type: ignore[union-attr]

    run = mindwatch.open_run(run_dir)
    layer_metric = next(m for m in run.metrics if m.startswith("weight_norm/"))
    layer_steps = run.series(layer_metric).step.tolist()
    last = run.last_step
    assert last == stop_at and run.series("loss").step.tolist()[-1] == stop_at
    assert layer_steps[0] == 1
    after = [s for s in layer_steps if s > 1]
    assert after and after[0] <= set_at + int(1.0 / step_secs) + 2, (set_at, after[:3])
    assert after == list(range(after[0], last + 1)), "a layer row on every step from the change on"

    alerts = [json.loads(line) for line in (run_dir / "alerts.jsonl").read_text().splitlines()]
    requests = [a for a in alerts if a["rule"] == "request"]
    assert [a.get("lr_factor") or a.get("key") or a["actions"][0] for a in requests] == [
        0.5,
        "checkpoint",
        "layers.every",
        "stop",
    ]
    assert {a["requested_by"] for a in requests} == {requester()}
    assert requests[0]["reason"] == "loss climbs" and requests[-1]["reason"] == "x marks it"
    assert [a["cause"] for a in alerts if a["rule"] == "intervention"] == ["request"] * 3

    # the run no longer runs: a clear error, nothing filed
    out = mindwatch_cli("stop", str(run_dir))
    assert out.returncode == 2 and "is not running (its state is stopped)" in out.stderr


def test_a_request_needs_a_running_run_and_a_known_setting(tmp_path: Path) -> None:
    (tmp_path / "meta.json").write_text("{}")
    (tmp_path / "status.rank0.json").write_text(json.dumps({"state": "finished"}))
    with pytest.raises(RequestError, match="not running"):
        file_request(tmp_path, "stop")
    (tmp_path / "status.rank0.json").write_text(json.dumps({"state": "running", "updated_at": time.time()}))
    with pytest.raises(RequestError, match="cannot change while training"):
        file_request(tmp_path, "set", key="layers.group", value="2")
    with pytest.raises(RequestError, match="> 0"):
        file_request(tmp_path, "lr", factor=0.0)
    req = file_request(tmp_path, "set", key="alerts.spike.enabled", value="false", reason="noisy")
    assert req["value"] is False and req["requested_by"] == requester()
    assert [r["id"] for r in pending_requests(tmp_path)] == [req["id"]]
    out = mindwatch_cli("stop", str(tmp_path / "nowhere"))
    assert out.returncode == 2 and "not a run directory" in out.stderr
