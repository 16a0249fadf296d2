"""`mindwatch demo` starts the dashboard beside the training, prints its URL, keeps it until Ctrl-C.

With ``MINDWATCH_UPDATE_SCREENSHOT=1`` the demo trains its default 300 steps and the run page's picture goes
to docs/images/run-page.png (the one the README shows); otherwise 12 steps, and the picture stays in tmp.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import urllib.request
from pathlib import Path
from urllib.parse import quote

import pexpect
import pytest
from conftest import CHROMIUM, CHROMIUM_ARGS, REPO
from test_dashboard_browser import CHART_POINTS, wait_for

pytestmark = pytest.mark.slow


UPDATE_SCREENSHOT = os.environ.get("MINDWATCH_UPDATE_SCREENSHOT") == "1"


def screenshot_run_page(url: str, run_id: str, steps: int, path: Path) -> None:
    """The finished run's page in headless Chromium, every loss point drawn, no page errors."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 860})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{url}#/run/{quote(run_id, safe='')}")
        wait_for(lambda: page.evaluate(CHART_POINTS) == steps, 30, f"all {steps} loss points")
        page.wait_for_selector("#banner.banner-finished", timeout=20_000)
        page.wait_for_timeout(500)  # the charts' entry animation
        page.screenshot(path=str(path))
        browser.close()
    assert errors == []


def test_demo_serves_the_run_live_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    save_dir = tmp_path / "out"
    steps = 300 if UPDATE_SCREENSHOT else 12
    cmd = f"{sys.executable} -m mindwatch.cli demo --steps {steps} --save-dir {save_dir} --port 0 --interval 60"
    child = pexpect.spawn(cmd, encoding="utf-8", timeout=240, dimensions=(50, 200))  # a terminal, like `make demo`
    try:
        child.expect(r"live dashboard at (http://127\.0\.0\.1:\d+/)")
        url = child.match.group(1)
        child.expect(r"this run on the dashboard: (http://\S+#/run/demo%2F(run_\w+))")
        run_id = "demo/" + child.match.group(2)
        child.expect("press Ctrl-C to stop it")
        # Training is over; the dashboard still shows the finished run.
        runs = json.loads(urllib.request.urlopen(url + "api/runs", timeout=10).read())["runs"]
        assert [(r["id"], r["state"], r["last_step"]) for r in runs] == [(run_id, "finished", steps)]
        if shutil.which(CHROMIUM):
            picture = REPO / "docs" / "images" / "run-page.png" if UPDATE_SCREENSHOT else tmp_path / "run-page.png"
            screenshot_run_page(url, run_id, steps, picture)
        child.sendintr()
        child.expect("dashboard stopped")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
    with pytest.raises(OSError):
        urllib.request.urlopen(url + "api/runs", timeout=2)
