"""Prometheus: the /metrics endpoint, the alert rules, and a real Prometheus scraping a real training."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

import mindwatch
from mindwatch.config import load_config
from mindwatch.launch_env import local_rank
from mindwatch.session import RunSession
from mindwatch.sinks.prometheus import PrometheusSink

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "deploy" / "prometheus" / "alerts.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "mindwatch.json"
PROMETHEUS, PROMTOOL = shutil.which("prometheus"), shutil.which("promtool")
needs_prometheus = pytest.mark.skipif(PROMETHEUS is None, reason="prometheus is not installed (scripts/setup.sh installs it)")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (scripts/setup.sh installs prometheus)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(url: str) -> dict[str, list[Any]]:
    """Samples by name, parsed with prometheus_client's own parser."""
    text = httpx.get(url, timeout=5).text
    out: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


# -- the endpoint ------------------------------------------------------------------------------
def test_endpoint_serves_gauges_counters_and_labels_on_loopback() -> None:
    sink = PrometheusSink(project="gpt", run="run_1", rank=3, port=free_port())
    try:
        assert sink.url is not None and sink.url.startswith("http://127.0.0.1:")
        before = scrape(sink.url)  # no step yet: no step series (a 0 timestamp would read as a stall)
        assert "mindwatch_step" not in before and "mindwatch_last_step_timestamp_seconds" not in before
        t = time.time()
        sink.write([{"step": 7, "t": t - 1, "rank": 3, "loss": 2.5, "lr": 1e-4}])
        sink.write([{"step": 8, "t": t, "rank": 3, "loss": float("nan"), "grad_norm": 0.75, "attention_entropy/blocks.0": 1.5}])
        sink.alert({"rule": "loss_nan", "severity": "critical", "step": 8})
        sink.alert({"rule": "loss_nan", "severity": "critical", "step": 9})
        got = scrape(sink.url)
        labels = {"project": "gpt", "run": "run_1", "rank": "3"}
        assert [(s.labels, s.value) for s in got["mindwatch_step"]] == [(labels, 8.0)]
        assert got["mindwatch_last_step_timestamp_seconds"][0].value == t
        assert got["mindwatch_lr"][0].value == 1e-4
        assert got["mindwatch_grad_norm"][0].value == 0.75
        loss = got["mindwatch_loss"][0].value
        assert loss != loss  # NaN
        assert got["mindwatch_attention_entropy"][0].labels == {**labels, "layer": "blocks.0"}
        nonfinite = {s.labels["metric"]: s.value for s in got["mindwatch_nonfinite_values_total"]}
        assert nonfinite == {"loss": 1.0, "grad_norm": 0.0}  # grad_norm starts at 0 so increase() sees its first NaN
        alerts = got["mindwatch_alerts_total"]
        assert [(s.labels, s.value) for s in alerts] == [({**labels, "rule": "loss_nan", "severity": "critical"}, 2.0)]
        assert got["mindwatch_host_memory_total_gb"][0].value > 0.1
        # its own registry: nothing leaks into the process-global one
        assert not [m for m in REGISTRY.collect() if m.name.startswith("mindwatch")]
    finally:
        sink.close("finished")


def test_every_per_layer_family_is_one_metric_with_a_layer_label() -> None:
    sink = PrometheusSink(project="gpt", run="run_1", rank=0, port=free_port())
    try:
        assert sink.url is not None
        layers = ["blocks.0.attn", "blocks.1.attn"]
        rec: dict[str, Any] = {"step": 1, "t": time.time(), "loss": 2.0}
        for i, layer in enumerate(layers):
            rec[f"attention_max_logit/{layer}"] = 10.0 + i
            rec[f"attention_entropy/{layer}"] = 1.0 + i
        sink.write([rec])
        text = httpx.get(sink.url, timeout=5).text
        families = {f.name: f for f in text_string_to_metric_families(text)}
        for family, base in (("attention_max_logit", 10.0), ("attention_entropy", 1.0)):
            samples = families[f"mindwatch_{family}"].samples
            assert sorted((s.labels["layer"], s.value) for s in samples) == [(layer, base + i) for i, layer in enumerate(layers)]
        assert not [name for name in families if "blocks" in name]  # no gauge name per layer
    finally:
        sink.close("finished")
    with pytest.raises(httpx.HTTPError):
        httpx.get(sink.url, timeout=2)  # the endpoint ends with the run


def test_port_taken_is_a_warning_not_a_crash(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        sink = PrometheusSink(project="p", run="r", rank=0, port=busy.getsockname()[1])
        assert sink.url is None
        sink.write([{"step": 1, "t": time.time(), "loss": 1.0}])  # still a working sink
        sink.close("finished")
    assert "prometheus.port" in caplog.text


def test_local_rank_under_msrun_and_torchrun_style_launchers() -> None:
    assert local_rank({}) == 0
    assert local_rank({"RANK_ID": "5"}) == 0  # a global rank alone says nothing about this machine
    assert local_rank({"MS_ROLE": "MS_WORKER", "RANK_ID": "13", "DEVICE_ID": "5"}) == 5  # msrun: DEVICE_ID = local rank
    assert local_rank({"DEVICE_ID": "3"}) == 0  # a plain DEVICE_ID outside msrun picks a device, not a port
    assert local_rank({"LOCAL_RANK": "2", "MS_ROLE": "MS_WORKER", "DEVICE_ID": "5"}) == 2


def test_nothing_is_exposed_unless_enabled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    off = RunSession.start(load_config({"save_dir": str(tmp_path), "prometheus": {"port": port}}), rank=0)
    assert not [s for s in off.monitor.sinks if isinstance(s, PrometheusSink)]
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)
    off.close()
    monkeypatch.setenv("MS_ROLE", "MS_WORKER")
    monkeypatch.setenv("DEVICE_ID", "1")  # msrun's second local worker: base port + 1
    on = RunSession.start(load_config({"save_dir": str(tmp_path), "prometheus": {"enabled": True, "port": port - 1}}), rank=1)
    try:
        (sink,) = [s for s in on.monitor.sinks if isinstance(s, PrometheusSink)]
        assert sink.url == f"http://127.0.0.1:{port}/metrics"
        on.monitor.record({"step": 1, "t": time.time(), "loss": 3.0})
        deadline = time.time() + 10
        while "mindwatch_loss" not in (got := scrape(sink.url)) and time.time() < deadline:
            time.sleep(0.05)
        assert got["mindwatch_loss"][0].labels == {"project": "default", "run": on.run_dir.name, "rank": "1"}
    finally:
        on.close()


# -- the rules -------------------------------------------------------------------------------
@needs_promtool
def test_alert_rules_pass_promtool_check_and_their_unit_tests() -> None:
    check = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 7 rules found" in check.stdout
    tests = subprocess.run(
        [PROMTOOL, "test", "rules", "alerts_test.yml"], cwd=RULES.parent, capture_output=True, text=True, timeout=60
    )
    assert tests.returncode == 0, tests.stdout + tests.stderr


# -- a real Prometheus, a real training ------------------------------------------------------
TRAINING = r'''
import sys, time
from pathlib import Path
from mindspore import dataset as ds
from mindwatch.demo.corpus import ByteWindows, stdlib_corpus
from mindwatch.demo.train import DemoSettings, build_training
from mindwatch.mindspore import MonitorCallback

save_dir, port, release, pause_at, steps = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
settings = DemoSettings(steps=steps, layers=1, d_model=32, heads=2, batch_size=8, seq_length=32)
model, _ = build_training(settings)


class PausingWindows:
    """The demo's samples, except that sample `pause_at` waits for the test's release file: a stalled data pipeline."""

    def __init__(self):
        self.windows = ByteWindows(stdlib_corpus(), settings.seq_length, steps * settings.batch_size, seed=0)

    def __len__(self):
        return len(self.windows)

    def __getitem__(self, i):
        deadline = time.time() + 300  # the test releases it; this only keeps a test that died from hanging it
        while i == pause_at and not release.exists() and time.time() < deadline:
            time.sleep(0.05)
        return self.windows[i]


dataset = ds.GeneratorDataset(PausingWindows(), ["ids", "targets"], shuffle=False).batch(settings.batch_size)
monitor = MonitorCallback(
    {"project": "prom", "run_name": "live", "save_dir": save_dir, "interval": 60, "prometheus": {"enabled": True, "port": port}}
)
model.train(1, dataset, callbacks=[monitor], dataset_sink_mode=False)
'''

STALL_SECS = 3  # the test's stall threshold (the shipped rule says 600 s for 1 m)
PAUSE_STEP = 25  # the training's data pipeline pauses after this step, until the test releases it


class PrometheusServer:
    """/usr/bin/prometheus on a free loopback port, with temp config and storage, 1 s scrapes and rule evaluations."""

    def __init__(self, workdir: Path, target_port: int) -> None:
        rules = yaml.safe_load(RULES.read_text())
        for rule in rules["groups"][0]["rules"]:
            if rule["alert"] == "MindwatchTrainingStalled":
                assert "> 600" in rule["expr"]
                rule["expr"] = rule["expr"].replace("> 600", f"> {STALL_SECS}")
                rule["for"] = "1s"
        (workdir / "alerts.yml").write_text(yaml.safe_dump(rules))
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
            "rule_files": ["alerts.yml"],
            "scrape_configs": [{"job_name": "mindwatch", "static_configs": [{"targets": [f"127.0.0.1:{target_port}"]}]}],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = open(workdir / "prometheus.log", "wb")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [
                str(PROMETHEUS),
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address={self.url.removeprefix('http://')}",
                "--log.level=warn",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self._wait(lambda: httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200, 30, "Prometheus to start")

    def query(self, expr: str) -> list[dict[str, Any]]:
        body = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=5).json()
        assert body["status"] == "success", (expr, body)
        return body["data"]["result"]

    def _wait(self, ready: Any, timeout: float, what: str) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                if ready():
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}; prometheus log: {self.log.name}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


@pytest.fixture
def prometheus_and_training(tmp_path: Path) -> Iterator[tuple[PrometheusServer, subprocess.Popen, Path, Path]]:
    port = free_port()
    server = PrometheusServer(tmp_path, port)
    script, release = tmp_path / "train.py", tmp_path / "release"
    script.write_text(TRAINING)
    steps, batch = 40, 8
    cmd = [sys.executable, str(script), str(tmp_path / "runs"), str(port), str(release), str(PAUSE_STEP * batch), str(steps)]
    training = subprocess.Popen(
        cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**_env(), "GLOG_v": "3"}
    )
    try:
        yield server, training, tmp_path / "runs" / "prom" / "live", release
    finally:
        release.touch()
        try:
            training.wait(60)
        except subprocess.TimeoutExpired:
            training.kill()
        server.stop()


def _env() -> dict[str, str]:
    import os

    return {**os.environ, "PYTHONPATH": str(REPO)}


@pytest.mark.slow
@needs_prometheus
def test_real_prometheus_scrapes_a_real_training_and_the_stall_rule_fires(prometheus_and_training) -> None:
    server, training, run_dir, release = prometheus_and_training

    # the data pipeline stalls mid-run: Prometheus must raise the stall alert while the process still answers scrapes
    stalled: list[dict[str, Any]] = []
    selector = '{project="prom", run="live", rank="0"}'

    def stall_firing() -> bool:
        assert training.poll() is None, training.stdout.read().decode()[-3000:]
        stalled[:] = server.query('ALERTS{alertname="MindwatchTrainingStalled", alertstate="firing"}')
        # the pause, not a slow early step on a loaded machine (a 3 s limit): Prometheus holds the paused step
        scraped = server.query(f"mindwatch_step{selector}")
        return bool(stalled) and bool(scraped) and int(scraped[0]["value"][1]) == PAUSE_STEP

    def at_the_pause() -> bool:
        assert training.poll() is None, training.stdout.read().decode()[-3000:]
        scraped = server.query(f"mindwatch_step{selector}")
        return bool(scraped) and int(scraped[0]["value"][1]) == PAUSE_STEP

    # getting there is no part of the rule (a loaded machine took 58 s to compile and train 25 steps), firing is
    server._wait(at_the_pause, 300, "the training to reach the pause")
    server._wait(stall_firing, 60, "the stall alert to fire at the pause")
    assert stalled[0]["metric"]["project"] == "prom" and stalled[0]["metric"]["run"] == "live"
    assert stalled[0]["metric"]["rank"] == "0" and stalled[0]["metric"]["severity"] == "critical"
    alerts_api = httpx.get(f"{server.url}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
    firing = [a["labels"] for a in alerts_api if a["state"] == "firing"]
    assert "MindwatchTrainingStalled" in [a["alertname"] for a in firing]

    # what Prometheus holds equals what the run directory holds (the training is paused: both are final for now)
    run = mindwatch.open_run(run_dir)
    # besides: mindwatch's own alerts (its stall watchdog may have fired too), forwarded with their rule name
    forwarded = {a["rule"] for a in firing if a["alertname"] == "MindwatchAlert"}
    assert {a["alertname"] for a in firing} <= {"MindwatchTrainingStalled", "MindwatchAlert"}
    assert forwarded <= {a["rule"] for a in run.alerts}
    last = run.last_record[0]
    assert run.state in ("running", "stalled") and last["step"] == PAUSE_STEP  # "stalled": its own watchdog noticed too
    (step,) = server.query(f"mindwatch_step{selector}")
    (loss,) = server.query(f"mindwatch_loss{selector}")
    (stamp,) = server.query(f"mindwatch_last_step_timestamp_seconds{selector}")
    assert int(step["value"][1]) == last["step"]
    assert float(loss["value"][1]) == last["loss"]
    assert float(stamp["value"][1]) == last["t"]
    history = server.query(f"mindwatch_loss{selector}[1m]")[0]["values"]
    losses = dict(zip(run.series("loss").step.tolist(), run.series("loss").value.tolist(), strict=True))
    assert {float(v) for _, v in history} <= set(losses.values())  # every scraped loss is a recorded one

    # the dashboard's queries are valid PromQL and find the training's series
    for title, expr in dashboard_queries():
        result = server.query(expr)
        if re.search(r"mindwatch_(loss|lr|grad_norm|step|samples_per_second|step_time|host_rss_gb)\{", expr):
            assert result, f"panel {title!r}: {expr} found nothing"

    # released, the training goes on, finishes, and the alert resolves once the endpoint is gone
    release.touch()
    assert training.wait(120) == 0, training.stdout.read().decode()[-3000:]
    run.refresh()
    assert run.state == "finished" and run.last_step == 40
    server._wait(lambda: not server.query('ALERTS{alertname="MindwatchTrainingStalled"}'), 30, "the alert to resolve")


@pytest.mark.slow
@needs_prometheus
def test_a_real_prometheus_scrapes_each_evaluation_as_gauges_of_its_own(tmp_path: Path) -> None:
    """A loop that evaluates, scraped by a real Prometheus: ``eval/loss`` is ``mindwatch_eval_loss`` (and so on), the
    newest evaluation's values as handed to ``run.eval``; ``mindwatch_step`` and its timestamp stay the last step's."""
    from conftest import wait_for
    from evaluated_loop import EvaluatedLoop

    port = free_port()
    server = PrometheusServer(tmp_path, port)
    selector = '{project="evals", rank="0"}'

    def scraped(name: str) -> float | None:
        found = server.query(f"{name}{selector}")
        return float(found[0]["value"][1]) if found else None

    try:
        with EvaluatedLoop(tmp_path / "runs", interval=60, prometheus={"enabled": True, "port": port}) as loop:
            for epoch, (loss, accuracy) in enumerate([(0.75, 0.61), (0.5, 0.72)], start=1):
                loop.train(3)
                loop.eval(loss=loss, accuracy=accuracy, eval_time=0.25 * epoch, samples=128, epoch=epoch)
                wait_for(lambda loss=loss: scraped("mindwatch_eval_loss") == loss, 30, f"Prometheus to scrape eval/loss {loss}")
                assert scraped("mindwatch_eval_accuracy") == accuracy
                assert scraped("mindwatch_eval_time") == 0.25 * epoch and scraped("mindwatch_eval_samples") == 128
                assert scraped("mindwatch_step") == loop.step  # the evaluation is no step
                run = mindwatch.open_run(loop.run_dir)
                assert scraped("mindwatch_last_step_timestamp_seconds") == run.series("loss").t[-1]
            url = f"http://127.0.0.1:{port}/metrics"
            families = {f.name: f for f in text_string_to_metric_families(httpx.get(url, timeout=5).text)}
            assert families["mindwatch_eval_loss"].documentation.startswith("mindwatch evaluation result 'eval/loss'")
            assert families["mindwatch_eval_loss"].type == "gauge"
            history = server.query(f"mindwatch_eval_loss{selector}[1m]")[0]["values"]
            assert {float(v) for _, v in history} <= {0.75, 0.5}  # every scraped value is one the loop evaluated
    finally:
        server.stop()


def dashboard_queries() -> list[tuple[str, str]]:
    """Every panel's PromQL with Grafana's variables filled in for the test's run."""
    dash = json.loads(DASHBOARD.read_text())
    subs = {"$project": "prom", "$run": "live", "$rank": "0", "$__rate_interval": "1m", "$__interval": "1s", "$__range": "5m"}
    out = []
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for k, v in subs.items():
                expr = expr.replace(k, v)
            out.append((panel["title"], expr))
    return out
