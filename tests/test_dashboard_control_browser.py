"""A person slows, checkpoints, rewinds and stops a live training from the dashboard's run page in headless Chromium (serve
--allow-control, the token), and the dashboard refuses without the token and without --allow-control."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import CHROMIUM, CHROMIUM_ARGS, wait_for
from test_distributed import free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "GLOG_v": "3"}
TOKEN = "browser-test-token-5678"


def status(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "status.rank0.json").read_text())
    except (OSError, ValueError):
        return {}


def records(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.rank0.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def serve(logdir: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "mindwatch.cli",
        "serve",
        str(logdir),
        "--port",
        str(port),
        "--token",
        TOKEN,
        "--no-cache",
        *extra,
    ]
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    import urllib.error
    import urllib.request

    def up() -> bool:
        try:
            urllib.request.urlopen(f"{url}/?token={TOKEN}", timeout=1)
            return True
        except (urllib.error.URLError, OSError):
            return False

    wait_for(up, 30)
    return proc, url


def test_the_stop_button_stops_a_live_run_and_is_refused_without_the_token_or_allow_control(tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    training = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "scripts" / "train_live.py"), str(tmp_path)],
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    run_dir = tmp_path / "live" / "acted"
    servers = []
    try:
        wait_for(lambda: status(run_dir).get("state") == "running" and (status(run_dir).get("last_step") or 0) >= 5, 120)
        plain, plain_url = serve(tmp_path)  # no --allow-control
        servers.append(plain)
        acting, url = serve(tmp_path, "--allow-control")
        servers.append(acting)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            # refused: no token (a fresh context has no cookie), and no --allow-control
            anonymous = browser.new_context()
            r = anonymous.request.post(f"{url}/api/request?run=live%2Facted", data={"action": "stop"})
            assert r.status == 401, r.text()
            signed = browser.new_context(extra_http_headers={"Authorization": f"Bearer {TOKEN}"})
            r = signed.request.post(f"{plain_url}/api/request?run=live%2Facted", data={"action": "stop"})
            assert r.status == 403, r.text()
            page = signed.new_page()
            page.goto(f"{plain_url}/#/run/live%2Facted")
            page.wait_for_selector("#chart-loss", timeout=30_000)
            time.sleep(1.5)  # the page asked /api/control by now
            assert page.locator(".run-actions button").count() == 0, "no buttons without --allow-control"
            assert status(run_dir).get("state") == "running"

            # with --allow-control and the token (the printed sign-in link sets the cookie): the button stops it
            person = browser.new_context()
            page = person.new_page()
            page.on("dialog", lambda d: d.accept())
            page.goto(f"{url}/?token={TOKEN}")
            page.goto(f"{url}/#/run/live%2Facted")
            taken = "() => (document.querySelector('.run-actions-note') || {}).textContent.includes('taken at step')"
            button = lambda action: page.locator(f'.run-actions button[data-action="{action}"]')  # noqa: E731
            button("stop").wait_for(state="visible", timeout=30_000)

            button("lr").click()  # the factor field says 0.5
            page.wait_for_function(taken, timeout=30_000)
            wait_for(lambda: any(r.get("lr", 1) < 0.0075 for r in records(run_dir)), 30)  # the rate was 0.01
            page.evaluate("() => { document.querySelector('.run-actions-note').textContent = ''; }")
            button("checkpoint").click()
            page.wait_for_function(taken, timeout=30_000)
            saved = wait_for(lambda: sorted((run_dir / "checkpoints").glob("*.ckpt")), 30)
            import mindspore as ms

            assert ms.load_checkpoint(str(saved[-1])), "the requested checkpoint loads"
            page.evaluate("() => { document.querySelector('.run-actions-note').textContent = ''; }")
            button("rewind").click()  # back to the newest snapshot (every 10 steps), 3 batches passed over
            page.wait_for_function(taken, timeout=30_000)
            page.evaluate("() => { document.querySelector('.run-actions-note').textContent = ''; }")
            page.fill(".run-actions-reason", "seen from the browser")
            button("stop").click()
            page.wait_for_function(taken, timeout=30_000)
            browser.close()
        training.wait(60)
    finally:
        for s in servers:
            s.kill()
        training.kill()
    final = status(run_dir)
    assert final["state"] == "stopped" and "seen from the browser" in final["reason"]
    alerts = [json.loads(line) for line in (run_dir / "alerts.jsonl").read_text().splitlines() if line.strip()]
    asked = [a for a in alerts if a["rule"] == "request"]
    assert len(asked) == 4, "one request alert each: lr, checkpoint, rewind, stop"
    (rewind,) = [a for a in alerts if a["rule"] == "intervention" and a["actions"] == ["rewind"]]
    assert rewind["request"] == asked[2]["request"] and rewind["to_step"] % 10 == 0 and rewind["skipped_batches"] == 3
    assert all("(dashboard, from 127.0.0.1)" in a["requested_by"] for a in asked)
    assert asked[-1]["reason"] == "seen from the browser"
