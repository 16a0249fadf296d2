"""`mindwatch demo` starts the dashboard beside the training, prints its URL, keeps it until Ctrl-C."""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path

import pexpect
import pytest

pytestmark = pytest.mark.slow


def test_demo_serves_the_run_live_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    save_dir = tmp_path / "out"
    cmd = f"{sys.executable} -m mindwatch.cli demo --steps 12 --save-dir {save_dir} --port 0 --interval 60"
    child = pexpect.spawn(cmd, encoding="utf-8", timeout=240, dimensions=(50, 200))  # a terminal, like `make demo`
    try:
        child.expect(r"live dashboard at (http://127\.0\.0\.1:\d+/)")
        url = child.match.group(1)
        child.expect(r"this run on the dashboard: (http://\S+#/run/demo%2F(run_\w+))")
        run_id = "demo/" + child.match.group(2)
        child.expect("press Ctrl-C to stop it")
        # Training is over; the dashboard still shows the finished run.
        runs = json.loads(urllib.request.urlopen(url + "api/runs", timeout=10).read())["runs"]
        assert [(r["id"], r["state"], r["last_step"]) for r in runs] == [(run_id, "finished", 12)]
        child.sendintr()
        child.expect("dashboard stopped")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
    with pytest.raises(OSError):
        urllib.request.urlopen(url + "api/runs", timeout=2)
