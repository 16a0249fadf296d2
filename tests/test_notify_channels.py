"""Email (a real SMTP server, aiosmtpd), Feishu/Lark signing, and the end-of-run message on every channel:
finished, failed with its error, stopped with its reason, a rank lost."""

from __future__ import annotations

import base64
import email
import email.policy
import hashlib
import hmac
import json
import logging
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path
from typing import get_args

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult
from conftest import dense_training
from mindspore.train import Callback
from test_notify import CONTEXT, Hook, spike_alert

import mindwatch
from mindwatch.config import ConfigError, EmailChannel, NotifyChannel, WebhookType, load_config
from mindwatch.mindspore import MonitorCallback
from mindwatch.sinks.channels import WEBHOOKS, Email, Feishu, Webhook, build_channels, feishu_sign
from mindwatch.sinks.notify import NotifySink
from mindwatch.store.layout import write_json_atomic

#: An email channel's addresses, for the channels these tests build by hand.
MAIL = {"sender": "mw@localhost", "to": ["ops@localhost"]}


class Inbox:
    """What an SMTP server on 127.0.0.1 received: parsed messages, their envelopes, whether TLS was on."""

    def __init__(self) -> None:
        self.messages: list[email.message.EmailMessage] = []
        self.envelopes: list[tuple[str, list[str], bool]] = []
        self.arrived = threading.Condition()

    async def handle_DATA(self, server, session, envelope) -> str:
        msg = email.message_from_bytes(envelope.original_content, policy=email.policy.default)
        with self.arrived:
            self.messages.append(msg)  # type: ignore[arg-type]
            self.envelopes.append((envelope.mail_from, list(envelope.rcpt_tos), session.ssl is not None))
            self.arrived.notify_all()
        return "250 OK"

    def wait(self, n: int, timeout: float = 15.0) -> list[email.message.EmailMessage]:
        with self.arrived:
            self.arrived.wait_for(lambda: len(self.messages) >= n, timeout)
        return self.messages


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def smtp():
    inbox = Inbox()
    logins: list[tuple[str, str]] = []

    def authenticate(server, session, envelope, mechanism, auth_data) -> AuthResult:
        logins.append((auth_data.login.decode(), auth_data.password.decode()))
        return AuthResult(success=auth_data.password == b"s3cret-pw")

    ctl = Controller(
        inbox, hostname="127.0.0.1", port=free_port(), authenticator=authenticate, auth_require_tls=False, auth_required=False
    )
    ctl.start()
    inbox.port, inbox.logins = ctl.port, logins  # type: ignore[attr-defined]
    yield inbox
    ctl.stop()


@pytest.fixture
def hook():
    h = Hook()
    yield h
    h.close()


def parts(msg: email.message.EmailMessage) -> tuple[str, str]:
    plain = msg.get_body(("plain",))
    rich = msg.get_body(("html",))
    assert plain is not None and rich is not None, msg
    return plain.get_content(), rich.get_content()


class LossObserver(Callback):
    """An independent callback: the last loss MindSpore handed over."""

    def __init__(self) -> None:
        self.last = float("nan")

    def on_train_step_end(self, run_context) -> None:
        self.last = float(run_context.original_args().net_outputs.asnumpy())


def test_a_training_emails_its_alert_and_its_end_to_a_real_smtp_server(
    smtp: Inbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    monkeypatch.setenv("MW_TEST_SMTP_USER", "mindwatch")
    monkeypatch.setenv("MW_TEST_SMTP_PASSWORD", "s3cret-pw")
    cfg = {
        "save_dir": str(tmp_path),
        "project": "mail",
        "dashboard_url": "http://dash.example:8080/",
        "callback": {"params": {"warn_on_value": {"loss": {"below": 1e9}}}},  # one threshold alert, then cooldown
        "notify": [
            {
                "type": "email",
                "host": "127.0.0.1",
                "port": smtp.port,  # type: ignore[attr-defined]
                "sender": "mindwatch@localhost",
                "to": ["ops@localhost", "Team Lead <lead@localhost>"],
                "username_env": "MW_TEST_SMTP_USER",
                "password_env": "MW_TEST_SMTP_PASSWORD",
            }
        ],
    }
    model, data = dense_training(40)
    mon, seen = MonitorCallback(cfg), LossObserver()
    with caplog.at_level(logging.INFO, "mindwatch"):
        model.train(1, data, callbacks=[mon, seen], dataset_sink_mode=False)
    run = mindwatch.open_run(mon.run_dir)
    mails = smtp.wait(len(run.alerts) + 1)
    assert smtp.logins == [("mindwatch", "s3cret-pw")] * len(mails)  # type: ignore[attr-defined]  # one login a message
    assert all(env == ("mindwatch@localhost", ["ops@localhost", "lead@localhost"], False) for env in smtp.envelopes)
    subjects = [m["subject"] for m in mails]
    assert f"mindwatch WARNING: threshold in mail/{run.id}" in subjects
    assert subjects[-1] == f"mindwatch: mail/{run.id} finished"
    assert mails[0]["to"] == "ops@localhost, Team Lead <lead@localhost>"

    alert = mails[subjects.index(f"mindwatch WARNING: threshold in mail/{run.id}")]
    plain, rich = parts(alert)
    assert "is below the limit 1e9" in plain and "step 1, rank 0" in plain
    link = f"http://dash.example:8080/#/run/mail%2F{run.id}"
    assert f"dashboard: {link}" in plain and f'<a href="{link}">' in rich

    plain, rich = parts(mails[-1])
    assert "step 40/40 (100 %)" in plain
    assert f"final loss {seen.last:.4f}" in plain
    assert f"{len(run.alerts)} alert" in plain and str(mon.run_dir) in plain
    assert "<h3>" in rich and "step 40/40 (100 %)" in rich

    files = b"".join(p.read_bytes() for p in run.path.rglob("*") if p.is_file())
    assert b"s3cret-pw" not in files and "s3cret-pw" not in caplog.text
    assert run.meta["config"]["notify"][0]["password_env"] == "MW_TEST_SMTP_PASSWORD"


def test_starttls_auto_upgrades_when_the_server_offers_it_and_true_insists(tmp_path: Path, caplog) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    client_tls = ssl.create_default_context(cafile=str(cert))
    inbox = Inbox()
    ctl = Controller(inbox, hostname="127.0.0.1", port=free_port(), tls_context=server_tls)
    plain_inbox = Inbox()
    plain = Controller(plain_inbox, hostname="127.0.0.1", port=free_port())
    ctl.start()
    plain.start()
    try:
        auto = Email(EmailChannel(type="email", host="127.0.0.1", port=ctl.port, **MAIL), tls_context=client_tls)
        insists = Email(EmailChannel(type="email", host="127.0.0.1", port=plain.port, **MAIL, starttls=True, retries=3))
        sink = NotifySink([auto, insists], context=CONTEXT)
        with caplog.at_level(logging.WARNING, "mindwatch"):
            sink.alert(spike_alert())
            sink.close("finished")
        assert len(inbox.wait(2)) == 2 and all(tls for *_, tls in inbox.envelopes)  # alert + end, both over TLS
        assert plain_inbox.messages == []
        assert "gave up sending the spike alert to email (127.0.0.1) after 1 tries: the server does not offer STARTTLS" in (
            caplog.text
        )
    finally:
        ctl.stop()
        plain.stop()


def test_every_webhook_type_of_the_config_has_its_channel_and_a_url_from_the_environment_is_checked_alike(caplog) -> None:
    types = list(get_args(WebhookType))
    assert set(WEBHOOKS) == set(types)
    cfg = load_config({"notify": [{"type": t, "url_env": "MW_TEST_URL"} for t in types]})
    channels = build_channels(cfg.notify, environ={"MW_TEST_URL": "https://hooks.example.com/x"})
    assert [c.kind for c in channels] == types and all(type(c) is WEBHOOKS[c.kind] for c in channels)
    assert [c.label for c in channels] == [f"{t} (hooks.example.com)" for t in types]
    with caplog.at_level(logging.WARNING, "mindwatch"):
        assert build_channels(cfg.notify[:1], environ={"MW_TEST_URL": "ftp://hooks.example.com/x"}) == []
    assert f"notify channel {types[0]} is off: url must start with http:// or https://" in caplog.text
    with pytest.raises(ConfigError, match="url must start with http:// or https://"):
        load_config({"notify": [{"type": "slack", "url": "ftp://hooks.example.com/x"}]})


def test_email_addresses_are_rfc_5322_addresses() -> None:
    base = {"type": "email", "host": "smtp.example.com", "sender": "mindwatch@localhost"}
    ok = load_config({"notify": [{**base, "to": ["ops@localhost", '"On Call" <oncall@example.com>', "a.b+c@[127.0.0.1]"]}]})
    assert ok.notify[0].to[0] == "ops@localhost"
    for bad in ("ops", "ops@", "a@b@c", "ops@localhost\nBcc: x@y"):
        with pytest.raises(ConfigError, match="is not an email address"):
            load_config({"notify": [{**base, "to": [bad]}]})
    with pytest.raises(ConfigError, match="username_env"):
        load_config({"notify": [{**base, "to": ["ops@localhost"], "password_env": "P"}]})


def test_feishu_signs_the_body_as_its_docs_say(hook: Hook) -> None:
    hook.default = (200, b'{"code": 0, "msg": "success", "data": {}}')
    secret = "feishu-secret-0123"
    before = time.time()
    sink = NotifySink(
        [Feishu(NotifyChannel(type="feishu", url=f"{hook.url}/open-apis/bot/v2/hook/abc-token", secret=secret))], context=CONTEXT
    )
    sink.alert(spike_alert())
    reqs = hook.wait(1)
    sink.close("finished")
    body = reqs[0]["json"]
    ts = body["timestamp"]
    assert before - 2 <= int(ts) <= time.time() + 2  # seconds, not milliseconds
    # the recipe from Feishu's bot documentation: HMAC-SHA256 keyed by "timestamp\nsecret" over an empty message, base64
    want = base64.b64encode(hmac.new(f"{ts}\n{secret}".encode(), b"", hashlib.sha256).digest()).decode()
    assert body["sign"] == want
    assert body["msg_type"] == "post"
    post = body["content"]["post"]["zh_cn"]
    assert post["title"] == "mindwatch WARNING: spike in gpt/run_1"
    texts = [seg["text"] for line in post["content"] for seg in line]
    assert "grad_norm spiked" in texts and "actions: stop" in texts
    assert feishu_sign("s", 1700000000) == (
        "1700000000",
        base64.b64encode(hmac.new(b"1700000000\ns", b"", hashlib.sha256).digest()).decode(),
    )


def test_feishu_refusing_a_signature_is_not_retried(hook: Hook, caplog) -> None:
    hook.default = (200, b'{"code": 19021, "msg": "sign match fail or timestamp is not within one hour from current time"}')
    sink = NotifySink(
        [Feishu(NotifyChannel(type="feishu", url=f"{hook.url}/hook/tok-123", secret="sec-456", retries=3, events=["alerts"]))],
        context=CONTEXT,
    )
    with caplog.at_level(logging.WARNING, "mindwatch"):
        sink.alert(spike_alert())
        sink.close("finished")
    assert len(hook.requests) == 1 and "code 19021: sign match fail" in caplog.text
    assert "tok-123" not in caplog.text and "sec-456" not in caplog.text


class FailAt(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_step_end(self, run_context) -> None:
        if run_context.original_args().cur_step_num == self.step:
            raise RuntimeError("device memory exhausted at step 12")


def test_a_run_that_fails_sends_its_error_to_every_channel(hook: Hook, tmp_path: Path) -> None:
    hook.default = (200, b'{"code": 0, "msg": "success"}')
    cfg = {
        "save_dir": str(tmp_path),
        "notify": [
            {"type": "feishu", "url": f"{hook.url}/feishu", "secret": "s"},
            {"type": "webhook", "url": f"{hook.url}/plain", "min_severity": "error"},  # the end comes regardless
            {"type": "slack", "url": f"{hook.url}/slack", "events": ["alerts"]},  # alerts only: no end message
        ],
    }
    model, data = dense_training(30)
    mon = MonitorCallback(cfg)
    with pytest.raises(RuntimeError, match="device memory exhausted"):
        model.train(1, data, callbacks=[mon, FailAt(12)], dataset_sink_mode=False)
    hook.wait(2)
    time.sleep(0.3)  # nothing else is on its way: the sinks closed before train() raised
    ends = {r["path"]: r["json"] for r in hook.requests if "/slack" not in r["path"]}
    assert set(ends) == {"/feishu", "/plain"} and not [r for r in hook.requests if r["path"] == "/slack"]
    plain = ends["/plain"]
    assert plain["event"] == "end" and plain["state"] == "failed" and plain["step"] == 12 and plain["total_steps"] == 30
    assert "RuntimeError: device memory exhausted at step 12" in plain["error"]
    post = ends["/feishu"]["content"]["post"]["zh_cn"]
    assert post["title"] == f"mindwatch: default/{mon.run_dir.name} failed"
    texts = [seg["text"] for line in post["content"] for seg in line]
    assert "error: RuntimeError: device memory exhausted at step 12" in texts
    assert any(t.startswith("step 12/30 (40 %)") for t in texts), texts


def test_stopped_and_rank_lost_endings(hook: Hook, tmp_path: Path) -> None:
    run_dir = tmp_path / "p" / "r"
    run_dir.mkdir(parents=True)
    # rank 1's heartbeat stopped a minute ago at step 40, without a final state (killed); rank 2 failed
    write_json_atomic(run_dir / "status.rank1.json", {"state": "running", "last_step": 40, "updated_at": time.time() - 60})
    write_json_atomic(run_dir / "status.rank2.json", {"state": "failed", "last_step": 41, "error": "HCCL timeout"})
    sink = NotifySink(
        [Webhook(NotifyChannel(type="webhook", url=f"{hook.url}/plain"))], context=CONTEXT, run_dir=run_dir, world_size=3
    )
    sink.total_steps = 100
    sink.write([{"step": 42, "t": time.time(), "loss": 1.25}])
    sink.close("stopped", reason="stop requested by the spike rule")
    end = hook.wait(1)[0]["json"]
    assert end["state"] == "stopped" and end["reason"] == "stop requested by the spike rule"
    assert end["lost_ranks"] == {"1": "no heartbeat after step 40 (killed or lost)", "2": "failed after step 41: HCCL timeout"}
    assert end["step"] == 42 and end["final_loss"] == 1.25

    slack_hook = Hook()
    try:
        from mindwatch.sinks.channels import Slack

        sink = NotifySink(
            [Slack(NotifyChannel(type="slack", url=f"{slack_hook.url}/s"))], context=CONTEXT, run_dir=run_dir, world_size=2
        )
        sink.close("failed", error="RuntimeError: collective timed out")
        text = slack_hook.wait(1)[0]["json"]["text"]
    finally:
        slack_hook.close()
    assert text.startswith("*mindwatch: gpt/run_1 failed, rank 1 lost*")
    assert "rank 1: no heartbeat after step 40 (killed or lost)" in text and "error: RuntimeError: collective timed out" in text


def test_plain_webhook_alerts_say_which_event_they_are(hook: Hook) -> None:
    sink = NotifySink([Webhook(NotifyChannel(type="webhook", url=f"{hook.url}/plain", events=["alerts"]))], context=CONTEXT)
    sink.alert(spike_alert())
    got = hook.wait(1)[0]["json"]
    sink.close("finished")
    time.sleep(0.2)
    assert got["event"] == "alert" and got["rule"] == "spike" and len(hook.requests) == 1
    assert json.loads(json.dumps(got))["run"] == "run_1"
