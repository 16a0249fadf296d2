"""What a person receives, on real local servers (HTTP and SMTP): one anomaly is one message, an action is told
in the end-of-run message (on its own only where a channel asks for ``info``), and no message says "None"."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiosmtpd.controller import Controller
from test_interventions import train
from test_notify import CONTEXT, Hook
from test_notify_channels import Inbox, free_port, parts

from mindwatch.alerts.alert import make_alert
from mindwatch.config import EmailChannel, NotifyChannel, load_config
from mindwatch.sinks.channels import DingTalk, Email, Feishu, Slack, Webhook, WeCom, build_channels
from mindwatch.sinks.notify import NotifySink


@pytest.fixture
def hook() -> Iterator[Hook]:
    h = Hook()
    h.default = (200, b'{"errcode": 0, "code": 0, "msg": "success"}')  # DingTalk, WeCom and Feishu say "taken" alike
    yield h
    h.close()


@pytest.fixture
def smtp() -> Iterator[Inbox]:
    inbox = Inbox()
    ctl = Controller(inbox, hostname="127.0.0.1", port=free_port())
    ctl.start()
    inbox.port = ctl.port  # type: ignore[attr-defined]
    yield inbox
    ctl.stop()


def posts(hook: Hook, path: str) -> list[dict]:
    return [r["json"] for r in hook.requests if r["path"] == path]


def intervention(action: str, message: str, step: int = 12) -> dict:
    return make_alert(
        "intervention", step=step, rank=0, message=message, severity="info", actions=[action], cause="spike", cause_step=step
    )


@pytest.mark.slow
@pytest.mark.parametrize("actions", [["stop"], ["stop", "checkpoint"]])
def test_a_nan_that_stops_the_run_is_two_messages_per_channel_the_alert_and_the_end(
    actions: list[str], hook: Hook, smtp: Inbox, tmp_path: Path
) -> None:
    mail = {"type": "email", "host": "127.0.0.1", "port": smtp.port, "sender": "mw@localhost", "to": ["ops@localhost"]}  # type: ignore[attr-defined]
    cfg = {
        "save_dir": str(tmp_path),
        "project": "nan",
        "alerts": {"nonfinite": {"actions": actions}},
        "notify": [
            {"type": "webhook", "url": f"{hook.url}/plain"},
            {"type": "feishu", "url": f"{hook.url}/feishu"},
            mail,
            {"type": "webhook", "url": f"{hook.url}/everything", "min_severity": "info"},
        ],
    }
    run, obs, _ = train(300.0, 40, cfg)  # SGD at lr 300: the weights blow up within a few steps
    nan_step = max(obs.loss)
    assert not (math.isfinite(obs.loss[nan_step]) and math.isfinite(obs.grad_norm[nan_step])), "the run never went NaN"
    assert run.state == "stopped"
    told = [a for a in run.alerts if a["rule"] != "intervention"]
    assert [a["rule"] for a in told] == ["nonfinite"], "another rule fired: this run is not one anomaly"
    acted = {a["actions"][0]: a for a in run.alerts if a["rule"] == "intervention"}
    assert set(acted) == set(actions)
    mails = smtp.wait(2)
    hook.wait(2 + 2 + 2 + len(actions))
    time.sleep(0.5)  # the sinks closed before train() returned: nothing else is on its way

    plain = posts(hook, "/plain")
    assert [(b["event"], b.get("rule")) for b in plain] == [("alert", "nonfinite"), ("end", None)]
    alert, end = plain
    assert alert["step"] == nan_step and alert["actions"] == actions
    assert end["state"] == "stopped" and end["reason"].startswith("stopped by mindwatch: ") and end["alerts"] == 1
    told_actions = [f"action: {what}" for what in end["interventions"]]  # the stop is the state and its reason
    if "checkpoint" in actions:
        (saved,) = end["interventions"]  # the checkpoint is told in a line of the end-of-run message
        assert saved.startswith(f"saved {Path(acted['checkpoint']['checkpoint']).name}")
    else:
        assert told_actions == []

    titles = [b["content"]["post"]["zh_cn"]["title"] for b in posts(hook, "/feishu")]
    assert titles == [f"mindwatch ERROR: nonfinite in nan/{run.id}", f"mindwatch: nan/{run.id} stopped"]

    assert [m["subject"] for m in mails] == titles
    text, rich = parts(mails[1])
    lines = text.splitlines()
    assert f"reason: {end['reason']}" in lines and "1 alert" in lines
    assert [line for line in lines if line.startswith("action: ")] == told_actions
    assert ("action: saved" in rich) == ("checkpoint" in actions)
    for mail in mails:
        assert "None" not in mail.as_string()
    for r in hook.requests:
        assert "None" not in json.dumps(r["json"]) and "null" not in json.dumps(r["json"]), r

    everything = posts(hook, "/everything")  # min_severity: info asks for what each action did too
    assert [(b["event"], b.get("rule")) for b in everything[:1]] == [("alert", "nonfinite")]
    assert sorted(b["actions"][0] for b in everything if b.get("rule") == "intervention") == sorted(actions)
    assert everything[-1]["event"] == "end" and len(everything) == 2 + len(actions)
    assert len(smtp.messages) == 2 and len(plain) == 2


def test_an_alert_without_threshold_and_an_ending_without_facts_never_say_none(hook: Hook, smtp: Inbox) -> None:
    channels = [
        Webhook(NotifyChannel(type="webhook", url=f"{hook.url}/plain")),
        Slack(NotifyChannel(type="slack", url=f"{hook.url}/slack")),
        DingTalk(NotifyChannel(type="dingtalk", url=f"{hook.url}/dingtalk", secret="s")),
        Feishu(NotifyChannel(type="feishu", url=f"{hook.url}/feishu")),
        WeCom(NotifyChannel(type="wecom", url=f"{hook.url}/wecom")),
        Email(EmailChannel(type="email", host="127.0.0.1", port=smtp.port, sender="mw@localhost", to=["ops@localhost"])),  # type: ignore[attr-defined]
    ]
    sink = NotifySink(channels, context={"project": "gpt", "run": "run_1", "rank": 0})  # no host, no dashboard
    nan = make_alert("nonfinite", step=7, rank=0, metric="loss", value=float("nan"), message="loss is nan", severity="error")
    unmeasured = make_alert("custom", step=None, rank=0, metric="loss", message="a rule of my own")
    unmeasured["rank"] = None  # an alert of the whole run (a rule of one's own may raise it so)
    sink.alert(nan)
    sink.alert(unmeasured)
    sink.close("finished")  # no step recorded, no loss
    mails = smtp.wait(3)
    hook.wait(5 * 3)

    assert len(mails) == 3 and len(hook.requests) == 15
    for r in hook.requests:
        body = json.dumps(r["json"])
        assert "None" not in body and "null" not in body, (r["path"], body)
    for mail in mails:
        assert "None" not in mail.as_string()
    text, _ = parts(mails[0])
    assert text.splitlines()[::2] == ["loss is nan", "step 7, rank 0", "loss = nan"]  # no threshold, no host
    text, _ = parts(mails[1])
    assert text.splitlines()[::2] == ["a rule of my own", "before step 1"]  # no value, no threshold: no reading line
    end_text, _ = parts(mails[2])
    assert mails[2]["subject"] == "mindwatch: gpt/run_1 finished"
    assert end_text.splitlines()[0].startswith("no step recorded, ") and " on " not in end_text
    plain = posts(hook, "/plain")
    assert "threshold" not in plain[0] and plain[0]["metric"] == "loss"
    assert "step" not in plain[2] and "final_loss" not in plain[2] and plain[2]["state"] == "finished"


def test_a_channel_gets_warnings_and_the_end_by_default_and_what_actions_did_when_it_asks_for_info(hook: Hook) -> None:
    cfg = load_config(
        {
            "notify": [
                {"type": "webhook", "url": f"{hook.url}/default"},
                {"type": "webhook", "url": f"{hook.url}/info", "min_severity": "info"},
            ]
        }
    )
    default, info = build_channels(cfg.notify)
    assert (default.settings.min_severity, info.settings.min_severity) == ("warning", "info")
    # the one owner of a channel's defaults is the config: a channel built by hand agrees with it
    by_hand = (
        Webhook(NotifyChannel(type="webhook", url="http://x")),
        Email(EmailChannel(type="email", host="localhost", sender="mw@localhost", to=["ops@localhost"])),
    )
    for ch in by_hand:
        assert (ch.settings.min_severity, list(ch.settings.events), ch.settings.timeout, ch.settings.retries) == (
            cfg.notify[0].min_severity,
            cfg.notify[0].events,
            cfg.notify[0].timeout,
            cfg.notify[0].retries,
        )

    sink = NotifySink([default, info], context=CONTEXT)
    spike = make_alert("spike", step=12, rank=0, metric="grad_norm", value=45.2, threshold=12.0, message="grad_norm spiked")
    spike["actions"] = ["lr_backoff", "stop"]
    sink.alert(spike)
    sink.alert(intervention("lr_backoff", "learning rate 0.01 -> 0.005 from step 13 (requested by the spike alert)"))
    sink.alert(intervention("stop", "training stops after step 12 (requested by the spike alert)"))
    sink.close("stopped", reason="stopped by mindwatch: grad_norm spiked")
    hook.wait(2 + 4)
    time.sleep(0.3)

    got = posts(hook, "/default")
    assert [(b["event"], b.get("rule")) for b in got] == [("alert", "spike"), ("end", None)]
    end = got[1]
    assert end["alerts"] == 1 and end["reason"] == "stopped by mindwatch: grad_norm spiked"
    assert end["interventions"] == ["learning rate 0.01 -> 0.005 from step 13 (requested by the spike alert)"]
    got = posts(hook, "/info")
    assert [b.get("rule") for b in got] == ["spike", "intervention", "intervention", None]
    assert got[1]["severity"] == "info" and got[1]["actions"] == ["lr_backoff"]


def test_a_failed_action_is_a_warning_every_channel_gets(hook: Hook) -> None:
    sink = NotifySink([Webhook(NotifyChannel(type="webhook", url=f"{hook.url}/default"))], context=CONTEXT)
    failed = intervention("checkpoint", "checkpoint failed: RuntimeError('disk full') (requested by the spike alert)")
    failed.update(severity="warning", error="RuntimeError('disk full')")
    sink.alert(failed)
    sink.close("finished")
    got = [r["json"] for r in hook.wait(2)]
    assert [(b["event"], b.get("rule")) for b in got] == [("alert", "intervention"), ("end", None)]
    assert got[1]["interventions"] == [failed["message"]] and got[1]["alerts"] == 1


def test_one_event_on_several_layers_or_ranks_is_one_message(hook: Hook, smtp: Inbox) -> None:
    """A spike on five layers at one step, a slowdown that rank 0 and then rank 1 saw (its alert forwarded half a second
    later): one message each, on a webhook and by mail; a different alert in between waits its turn, not its own
    window's."""
    mail = EmailChannel(type="email", host="127.0.0.1", port=smtp.port, sender="mw@localhost", to=["ops@localhost"])  # type: ignore[attr-defined]
    sink = NotifySink([Webhook(NotifyChannel(type="webhook", url=f"{hook.url}/plain")), Email(mail)], context=CONTEXT)
    layers = [f"blocks.{i}.mlp" for i in range(5)]
    for layer in layers:
        sink.alert(make_alert("layer_spike", step=210, rank=0, metric=f"grad_norm/{layer}", value=40.0, layer=layer,
                              message=f"layer {layer}: its gradient norm spiked"))  # fmt: skip
    time.sleep(0.2)
    slow = {"metric": "samples_per_second", "message": "samples_per_second fell", "actions": ["dump_stacks"]}
    sink.alert(make_alert("throughput_drop", step=300, rank=0, **slow))
    time.sleep(0.5)
    sink.alert(make_alert("throughput_drop", step=301, rank=1, **slow))
    sink.alert(make_alert("nonfinite", step=302, rank=1, metric="loss", value=math.nan, message="loss is nan", severity="error"))
    sink.close("failed", error="RuntimeError: loss is nan")
    mails = smtp.wait(4)
    hook.wait(4)

    plain = posts(hook, "/plain")
    assert [(b["event"], b.get("rule"), b.get("count")) for b in plain] == [
        ("alerts", "layer_spike", 5),
        ("alerts", "throughput_drop", 2),
        ("alert", "nonfinite", None),
        ("end", None, None),
    ]
    assert [a["layer"] for a in plain[0]["alerts"]] == layers
    assert [a["rank"] for a in plain[1]["alerts"]] == [0, 1]
    assert [m["subject"] for m in mails[:2]] == [
        "mindwatch WARNING: layer_spike x 5 in gpt/run_1",
        "mindwatch WARNING: throughput_drop x 2 in gpt/run_1",
    ]
    spike_text, _ = parts(mails[0])
    assert "5 layer_spike alerts at step 210, 5 layers, rank 0" in spike_text
    assert all(f"layer {layer}: its gradient norm spiked (step 210)" in spike_text for layer in layers)
    slow_text, _ = parts(mails[1])
    assert "2 throughput_drop alerts at steps 300-301, 2 ranks" in slow_text
    assert "samples_per_second fell (step 301, rank 1)" in slow_text and "actions: dump_stacks" in slow_text
    assert len(mails) == 4 and mails[2]["subject"].startswith("mindwatch ERROR: nonfinite")
