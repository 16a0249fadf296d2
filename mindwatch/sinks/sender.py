"""One channel's sender: a bounded queue and a thread (``mindwatch-notify-<type>``) that formats and sends, with retries.

Example::

    sender = Sender(channel, context={"project": "gpt", "run": "run_1"}, capacity=100)
    sender.offer(("alert", alert))              # False when the queue is full: the message is dropped
    sender.close()                              # no more messages
    left = sender.finish(time.monotonic() + 3)  # None: all sent; else the messages left

Each channel has its own sender, so a dead or slow endpoint delays only its own messages and never the
training: a request times out after the channel's ``timeout`` seconds and is retried ``retries`` times
with backoff (0.5, 1, 2 ... s, at most 5), then dropped with a warning that names the channel by its
label and scrubs its secrets. The worker only queues an alert or a :class:`~mindwatch.sinks.messages.RunEnd`;
the message is formatted here, on the sender's thread.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import deque
from typing import Any

from mindwatch.alerts.alert import Alert, severity_at_least
from mindwatch.config import ChannelSettings
from mindwatch.sinks.channels import Channel, Refused
from mindwatch.sinks.messages import Message, alerts_message, end_message

log = logging.getLogger("mindwatch")

#: A sender's work: ``("alert", alert)`` or ``("end", run_end)``, formatted on the sender's thread.
Item = tuple[str, Any]

#: The longest wait between two tries, in seconds.
_MAX_BACKOFF = 5.0


def takes_alert(settings: ChannelSettings, alert: Alert) -> bool:
    """Whether a channel with ``settings`` is sent ``alert``: it asks for alerts, and ``alert`` is at its severity or above."""
    return "alerts" in settings.events and severity_at_least(alert, settings.min_severity)


def longest_send(settings: ChannelSettings) -> float:
    """The most seconds one message can take on a channel with ``settings``: every try's timeout and backoff."""
    return (settings.timeout + _MAX_BACKOFF) * (settings.retries + 1)


def _event_of(alert: Alert) -> tuple[Any, ...]:
    """What makes alerts one event in a message: one rule asking for the same actions (a spike on five layers, a
    slowdown each rank saw); what each action did (``intervention``) is told an action at a time."""
    return alert.get("rule"), tuple(alert.get("actions") or ())


class Sender:
    """One channel's queue and thread; ``sent``, ``failed`` and ``dropped`` count its messages."""

    def __init__(self, channel: Channel, context: dict[str, Any], capacity: int) -> None:
        self.channel = channel
        self.context = context
        self.queue: queue.Queue[Item | None] = queue.Queue(capacity)
        self.sent = 0
        self.failed = 0
        self.dropped = 0
        self.busy = False
        #: Items taken from the queue while alerts of one rule were gathered, sent after them in their order.
        self._held: deque[Item | None] = deque()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"mindwatch-notify-{channel.kind}", daemon=True)
        self.thread.start()

    def offer(self, item: Item) -> bool:
        """Queue ``item`` without waiting; False (and one more ``dropped``) when the queue is full."""
        try:
            self.queue.put_nowait(item)
        except queue.Full:
            self.dropped += 1
            return False
        return True

    def close(self) -> None:
        """No more messages: the thread ends once it has sent those queued."""
        with contextlib.suppress(queue.Full):
            self.queue.put_nowait(None)

    def finish(self, deadline: float) -> int | None:
        """Wait until ``deadline`` (:func:`time.monotonic`) for the thread to end; when it has not, cut its backoff
        short and return how many messages are left undelivered (None when it ended)."""
        self.thread.join(max(0.0, deadline - time.monotonic()))
        if not self.thread.is_alive():
            return None
        self.stopping.set()
        return self.queue.qsize() + sum(item is not None for item in self._held) + int(self.busy)

    def _run(self) -> None:
        while True:
            item = self._held.popleft() if self._held else self.queue.get()
            if item is None:
                return
            self.busy = True
            try:
                kind, what = item
                if kind == "alert":
                    self._send(alerts_message(self._gather(what), self.context))
                else:
                    self._send(end_message(what, self.context))
            finally:
                self.busy = False

    def _gather(self, first: Alert) -> list[Alert]:
        """``first`` and the alerts of its event (:func:`_event_of`) that come within the channel's ``group_secs`` of it
        (or were taken already); what else comes meanwhile is held, in its order. The run's end stops the wait."""
        if self.channel.settings.group_secs <= 0:
            return [first]
        kind = _event_of(first)
        group = [first]
        same = [i for i in self._held if i is not None and i[0] == "alert" and _event_of(i[1]) == kind]
        group += [what for _, what in same]
        self._held = deque(i for i in self._held if not any(i is s for s in same))
        deadline = time.monotonic() + self.channel.settings.group_secs
        while None not in self._held and not self.stopping.is_set():
            try:
                item = self.queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if item is not None and item[0] == "alert" and _event_of(item[1]) == kind:
                group.append(item[1])
            else:
                self._held.append(item)
        return group

    def _send(self, msg: Message) -> None:
        ch, settings = self.channel, self.channel.settings
        error = ""
        for attempt in range(settings.retries + 1):
            if attempt and self.stopping.wait(min(0.5 * 2 ** (attempt - 1), _MAX_BACKOFF)):
                break  # closing: no more waiting
            try:
                ch.deliver(msg)
            except Refused as e:
                error = str(e)
                break  # the service refuses this message: retrying will not help
            except (OSError, ValueError) as e:  # timeouts, refused connections, SMTP errors are OSErrors
                error = str(getattr(e, "reason", None) or e) or type(e).__name__
                continue
            self.sent += 1
            return
        self.failed += 1
        log.warning(
            "mindwatch: gave up sending %s to %s after %d tries: %s; training continues",
            msg.what,
            ch.label,
            attempt + 1,
            self._scrub(error),
        )

    def _scrub(self, text: str) -> str:
        for secret in self.channel.secrets():
            if secret:
                text = text.replace(secret, "***")
        return text
