"""Webhook notifications against real local HTTP servers: payload shapes, DingTalk signing, retries,
a black-hole endpoint, and secrets that never reach logs or files."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import socket
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import dense_training

import mindwatch
from mindwatch.alerts.alert import make_alert
from mindwatch.config import NotifyChannel, load_config
from mindwatch.mindspore import MonitorCallback
from mindwatch.sinks.channels import DingTalk, Slack, Webhook, WeCom, build_channels, dingtalk_sign
from mindwatch.sinks.notify import NotifySink

CONTEXT = {"project": "gpt", "run": "run_1", "rank": 0, "host": "node-7", "run_dir": "/runs/gpt/run_1"}


class Hook:
    """A webhook receiver on 127.0.0.1: records each request; ``answers`` scripts the replies (status, body)."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.answers: list[tuple[int, bytes]] = []
        self.default = (200, b'{"errcode": 0, "errmsg": "ok"}')
        self.by_path: dict[str, tuple[int, bytes]] = {}
        self.arrived = threading.Condition()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                parts = urllib.parse.urlsplit(self.path)
                status, reply = hook.answers.pop(0) if hook.answers else hook.by_path.get(parts.path, hook.default)
                self.send_response(status)
                self.end_headers()
                self.wfile.write(reply)
                with hook.arrived:
                    hook.requests.append(
                        {
                            "path": parts.path,
                            "query": dict(urllib.parse.parse_qsl(parts.query)),
                            "type": self.headers["Content-Type"],
                            "json": json.loads(body),
                            "at": time.time(),
                        }
                    )
                    hook.arrived.notify_all()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait(self, n: int, timeout: float = 10.0) -> list[dict]:
        with self.arrived:
            self.arrived.wait_for(lambda: len(self.requests) >= n, timeout)
        return self.requests

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hook():
    h = Hook()
    yield h
    h.close()


@pytest.fixture
def black_hole():
    """Accepts TCP connections and never answers."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
                held.append(conn)
            except OSError:
                continue

    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{srv.getsockname()[1]}/hook"
    stop.set()
    for c in held:
        c.close()
    srv.close()


def spike_alert() -> dict:
    return make_alert(
        "spike", step=120, rank=0, metric="grad_norm", value=45.2, threshold=12.0, message="grad_norm spiked", actions=["stop"]
    )


def test_each_channel_gets_the_payload_its_service_expects(hook: Hook) -> None:
    secret = "SEC0123456789abcdef"
    channels = [
        DingTalk(NotifyChannel(type="dingtalk", url=f"{hook.url}/robot/send?access_token=dt-token", secret=secret)),
        WeCom(NotifyChannel(type="wecom", url=f"{hook.url}/cgi-bin/webhook/send?key=wc-key")),
        Slack(NotifyChannel(type="slack", url=f"{hook.url}/services/T000/B000/XXXX")),
        Webhook(NotifyChannel(type="webhook", url=f"{hook.url}/plain")),
    ]
    sink = NotifySink(channels, context=CONTEXT)
    before = time.time()
    sink.alert(spike_alert())
    got = {r["path"]: r for r in hook.wait(4)}
    sink.close("finished")
    assert len(got) == 4 and all(r["type"] == "application/json" for r in got.values())

    dt = got["/robot/send"]
    assert dt["json"]["msgtype"] == "markdown"
    assert dt["json"]["markdown"]["title"] == "mindwatch WARNING: spike in gpt/run_1"
    text = dt["json"]["markdown"]["text"]
    assert "grad_norm spiked" in text and "step 120" in text and "actions: stop" in text and "node-7" in text
    q = dt["query"]
    assert q["access_token"] == "dt-token"
    assert before * 1000 - 1000 <= int(q["timestamp"]) <= time.time() * 1000 + 1000
    expected = base64.b64encode(
        hmac.new(secret.encode(), f"{q['timestamp']}\n{secret}".encode(), hashlib.sha256).digest()
    ).decode()
    assert q["sign"] == expected  # DingTalk's own check: HMAC-SHA256 of "timestamp\nsecret", base64

    wc = got["/cgi-bin/webhook/send"]["json"]
    assert wc["msgtype"] == "markdown" and "grad_norm spiked" in wc["markdown"]["content"]
    assert got["/cgi-bin/webhook/send"]["query"] == {"key": "wc-key"}

    slack = got["/services/T000/B000/XXXX"]["json"]
    assert set(slack) == {"text"} and "*mindwatch WARNING: spike in gpt/run_1*" in slack["text"]

    plain = got["/plain"]["json"]
    assert {k: plain[k] for k in ("rule", "step", "metric", "value", "threshold", "severity", "actions")} == {
        "rule": "spike",
        "step": 120,
        "metric": "grad_norm",
        "value": 45.2,
        "threshold": 12.0,
        "severity": "warning",
        "actions": ["stop"],
    }
    assert plain["project"] == "gpt" and plain["run"] == "run_1" and isinstance(plain["t"], float)


def test_dingtalk_sign_matches_the_documented_example() -> None:
    # recomputed independently with the recipe from DingTalk's robot documentation
    ts, sign = dingtalk_sign("SECxyz", 1700000000000)
    want = base64.b64encode(hmac.new(b"SECxyz", b"1700000000000\nSECxyz", hashlib.sha256).digest()).decode()
    assert (ts, sign) == ("1700000000000", want)


def test_min_severity_and_retry_after_a_server_error(hook: Hook) -> None:
    hook.answers = [(503, b"busy")]  # the first request fails, the retry gets through
    errors_only = Webhook(
        NotifyChannel(type="webhook", url=f"{hook.url}/errors", min_severity="error", retries=2, events=["alerts"])
    )
    everything = Webhook(NotifyChannel(type="webhook", url=f"{hook.url}/all", retries=2, events=["alerts"], min_severity="info"))
    sink = NotifySink([errors_only, everything], context=CONTEXT)
    sink.alert(spike_alert())  # a warning: only /all
    reqs = hook.wait(2)
    sink.close("finished")
    assert [r["path"] for r in reqs] == ["/all", "/all"]
    assert sink.stats()[everything.label] == {"sent": 1, "failed": 0, "dropped": 0}


def test_a_service_that_refuses_is_not_retried_and_the_warning_leaks_no_token(hook: Hook, caplog) -> None:
    hook.default = (200, b'{"errcode": 310000, "errmsg": "sign not match"}')
    ch = DingTalk(
        NotifyChannel(
            type="dingtalk",
            url=f"{hook.url}/robot/send?access_token=very-secret-token",
            secret="SECsecret",
            retries=3,
            events=["alerts"],
        )
    )
    sink = NotifySink([ch], context=CONTEXT)
    with caplog.at_level(logging.WARNING, "mindwatch"):
        sink.alert(spike_alert())
        sink.close("finished")
    assert len(hook.requests) == 1
    assert "errcode 310000: sign not match" in caplog.text and "dingtalk (127.0.0.1)" in caplog.text
    assert "very-secret-token" not in caplog.text and "SECsecret" not in caplog.text


def test_a_training_notifies_and_keeps_secrets_out_of_logs_and_files(
    hook: Hook, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    monkeypatch.setenv("MW_TEST_DINGTALK_URL", f"{hook.url}/robot/send?access_token=tok-from-env")
    monkeypatch.setenv("MW_TEST_DINGTALK_SECRET", "SECfromenv")
    cfg = {
        "save_dir": str(tmp_path),
        "callback": {"params": {"warn_on_value": {"loss": {"below": 1e9}}}},  # every step: one alert, then cooldown
        "notify": [
            {"type": "dingtalk", "url_env": "MW_TEST_DINGTALK_URL", "secret_env": "MW_TEST_DINGTALK_SECRET"},
            {"type": "slack", "url": f"{hook.url}/services/inline-slack-token", "retries": 0},
        ],
    }
    hook.by_path["/services/inline-slack-token"] = (500, b"down")  # this one fails: a warning is logged
    model, data = dense_training(50)
    mon = MonitorCallback(cfg)
    with caplog.at_level(logging.INFO, "mindwatch"):
        model.train(1, data, callbacks=[mon], dataset_sink_mode=False)
    reqs = hook.wait(2)
    threshold = [r for r in reqs if "mindwatch WARNING: threshold" in json.dumps(r["json"])]  # other rules may fire too
    assert sorted(r["path"] for r in threshold) == ["/robot/send", "/services/inline-slack-token"]
    dt = next(r for r in threshold if r["path"] == "/robot/send")
    assert "is below the limit 1e9" in dt["json"]["markdown"]["text"]
    assert dt["query"]["access_token"] == "tok-from-env" and "sign" in dt["query"]
    assert "gave up sending the threshold alert to slack (127.0.0.1)" in caplog.text

    run = mindwatch.open_run(mon.run_dir)
    files = b"".join(p.read_bytes() for p in run.path.rglob("*") if p.is_file())  # column files are binary
    for secret in ("tok-from-env", "SECfromenv", "inline-slack-token"):
        assert secret not in caplog.text and secret.encode() not in files
    snap = run.meta["config"]["notify"]
    assert snap[0]["url_env"] == "MW_TEST_DINGTALK_URL" and snap[1]["url"] == f"{hook.url}/***"
    assert (
        load_config({"notify": [{"type": "dingtalk", "url": "https://x/y?access_token=a", "secret": "s"}]}).snapshot()["notify"][
            0
        ]["secret"]
        == "***"
    )


def test_a_black_hole_endpoint_neither_blocks_nor_breaks_training(black_hole: str, tmp_path: Path, caplog) -> None:
    cfg = {
        "save_dir": str(tmp_path),
        "callback": {"params": {"warn_on_value": {"loss": {"below": 1e9}}}},
        "alerts": {"cooldown_secs": 0},  # an alert on every step: the sender falls far behind
        # group_secs 0: a message an alert (alerts of one rule together are one message, and would not fall behind)
        "notify": [{"type": "webhook", "url": black_hole, "timeout": 0.3, "retries": 1, "group_secs": 0}],
    }
    model, data = dense_training(300)
    mon = MonitorCallback(cfg)
    start = time.perf_counter()
    with caplog.at_level(logging.WARNING, "mindwatch"):
        model.train(1, data, callbacks=[mon], dataset_sink_mode=False)
    wall = time.perf_counter() - start
    run = mindwatch.open_run(mon.run_dir)
    assert run.state == "finished" and run.last_step == 300
    assert sum(a["rule"] == "threshold" for a in run.alerts) == 300  # every alert was still recorded
    assert "gave up sending the threshold alert to webhook (127.0.0.1) after 2 tries: timed out" in caplog.text
    assert "not keeping up; alerts for it are dropped" in caplog.text
    assert "did not answer in time" in caplog.text
    # waiting out even one timeout per alert would take this long; the slowdown is measured in bench/bench_alerts.py
    assert wall < run.last_step * cfg["notify"][0]["timeout"], f"training took {wall:.1f} s"


def test_channels_from_config_read_the_environment(monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    cfg = load_config(
        {"notify": [{"type": "wecom", "url_env": "MW_NOT_SET"}, {"type": "slack", "url": "https://hooks.slack.com/x"}]}
    )
    with caplog.at_level(logging.WARNING, "mindwatch"):
        channels = build_channels(cfg.notify, environ={})
    assert [c.kind for c in channels] == ["slack"]
    assert "MW_NOT_SET is not set" in caplog.text
    with pytest.raises(Exception, match="url_env"):
        load_config({"notify": [{"type": "slack"}]})
    with pytest.raises(Exception, match="dingtalk"):
        load_config({"notify": [{"type": "slack", "url": "https://x", "secret": "s"}]})
