"""Urgent notifications handed to a process of their own, which outlives the worker that raised them.

Example::

    from mindwatch.sinks.handoff import hand_off
    hand_off(config.notify, context, alert)    # returns in milliseconds; the sender process delivers

A ``rank_lost`` alert is raised while its launcher ends the job: ``msrun --join=True`` SIGKILLs
every surviving worker's process group 0.1-1 s after one worker exits, too soon for an email (a
webhook may make it). So the alert goes first, before it is written anywhere, to
``python -m mindwatch.sinks.handoff``: a process in a session of its own (the launcher's kill of
the worker's group does not reach it) that reads the channels and the alert from its stdin, builds
the channels from the ``notify:`` settings and the environment it inherits (URLs, secrets and SMTP
logins never travel on a command line or through a file), sends the alert to every channel with
the usual timeout and retries, and exits.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from mindwatch.alerts.alert import Alert

log = logging.getLogger("mindwatch")


def hand_off(channels: Sequence[Any], context: dict[str, Any], alert: Alert) -> bool:
    """Start the sender process for ``alert`` on the ``notify:`` channels (config sections); False if it cannot start."""
    payload = {
        "notify": [c.model_dump(mode="json") if hasattr(c, "model_dump") else dict(c) for c in channels],
        "context": context,
        "alert": alert,
    }
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mindwatch.sinks.handoff"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # not in the worker's process group: the launcher's kill of it spares this one
            close_fds=True,
        )
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(payload, default=str).encode("utf-8"))  # a few KB: the pipe takes it at once
        proc.stdin.close()
    except OSError as e:
        log.warning("mindwatch: cannot start the notification sender (%s); sending from this process", e)
        return False
    return True


def deliver(payload: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Send ``payload["alert"]`` to every channel that takes alerts of its severity; wait until each is done."""
    from mindwatch.config import load_config
    from mindwatch.sinks.channels import build_channels
    from mindwatch.sinks.sender import Sender, longest_send, takes_alert

    alert: Alert = payload["alert"]
    channels = [ch for ch in build_channels(load_config({"notify": payload["notify"]}).notify) if takes_alert(ch.settings, alert)]
    senders = [Sender(ch, payload.get("context") or {}, 2) for ch in channels]
    for s in senders:
        s.offer(("alert", alert))
        s.close()
    deadline = time.monotonic() + max(longest_send(ch.settings) for ch in channels) if channels else 0.0
    for s in senders:
        s.finish(deadline)
    return {s.channel.label: {"sent": s.sent, "failed": s.failed} for s in senders}


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    try:
        payload = json.loads(sys.stdin.buffer.read())
    except ValueError as e:
        log.error("mindwatch: the notification sender got no alert on its stdin (%s)", e)
        return 2
    stats = deliver(payload)
    return 0 if all(s["failed"] == 0 for s in stats.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
