"""Prometheus under msrun: each worker serves on the base port + its local rank (~20 s: one msrun launch)."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

# the msrun launch helpers of the distributed tests (same process-group cleanup)
from test_distributed import Launch, msrun, only_run_dir

pytestmark = pytest.mark.slow


def two_free_ports() -> int:
    """A port P with P + 1 free too."""
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
                return port
    raise RuntimeError("no two consecutive free ports")


def step_labels(url: str) -> dict[str, str] | None:
    try:
        text = httpx.get(url, timeout=2).text
    except httpx.HTTPError:
        return None
    for family in text_string_to_metric_families(text):
        if family.name == "mindwatch_step" and family.samples:
            return family.samples[0].labels
    return None


def test_msrun_workers_serve_on_base_port_plus_local_rank(tmp_path: Path) -> None:
    base = two_free_ports()
    out = tmp_path / "runs"
    config = {"project": "promdist", "prometheus": {"enabled": True, "port": base}}
    launch = Launch()
    try:
        msrun(
            launch,
            tmp_path / "logs",
            *("--save-dir", str(out), "--steps", "80", "--slow-rank", "0", "--slow-secs", "0.25"),  # 20 s to scrape both
            *("--config", json.dumps(config)),
        )
        seen: dict[int, dict[str, str]] = {}
        deadline = time.time() + 120
        while len(seen) < 2 and time.time() < deadline:
            assert all(p.poll() is None for p in launch.procs), (tmp_path / "logs" / "msrun.out").read_text()[-3000:]
            for port in (base, base + 1):
                labels = step_labels(f"http://127.0.0.1:{port}/metrics")
                if labels:
                    seen[port] = labels
            time.sleep(0.2)
        assert set(seen) == {base, base + 1}, f"endpoints found: {seen}"
        assert seen[base]["rank"] == "0" and seen[base + 1]["rank"] == "1"  # msrun's local index = the global rank on one machine
        assert seen[base]["run"] == seen[base + 1]["run"] and seen[base]["project"] == "promdist"
    finally:
        launch.kill()  # both endpoints answered: the rest of the 20 s training is not needed
    assert only_run_dir(out / "promdist").name == seen[base]["run"]
