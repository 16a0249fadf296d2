"""What the rules ask the training loop to do: a small thread-safe mailbox of requested actions.

Example::

    control = Control()
    control.request(alert)              # any thread: an alert whose "actions" lists e.g. ["stop"]
    if control.pending:                 # the training thread, at a step boundary: one attribute read
        for action, alert in control.take():
            ...                         # carry it out (stop, checkpoint, lr_backoff, dump_stacks)

Rules never reach into the training loop (like Hugging Face's ``TrainerControl``): they put
requests here and the framework adapter (``mindwatch.mindspore.MonitorCallback``) acts on
them at the next step boundary.
"""

from __future__ import annotations

import threading
from typing import Any

#: Actions the MindSpore adapter knows how to carry out.
ACTIONS = ("stop", "checkpoint", "lr_backoff", "dump_stacks")

Alert = dict[str, Any]


class Control:
    """Requested actions waiting for the next step boundary. Each (action, rule, step) is taken once."""

    def __init__(self) -> None:
        #: True while requests wait; the hot path reads only this.
        self.pending = False
        self._lock = threading.Lock()
        self._requests: list[tuple[str, Alert]] = []
        self._seen: set[tuple[str, Any, Any]] = set()

    def request(self, alert: Alert) -> None:
        """Queue every action in ``alert["actions"]``; an action already requested for the same rule and step is ignored."""
        with self._lock:
            for action in alert.get("actions") or ():
                if action not in ACTIONS:
                    continue
                key = (action, alert.get("rule"), alert.get("step"))
                if key in self._seen:
                    continue
                self._seen.add(key)
                self._requests.append((action, alert))
            self.pending = bool(self._requests)

    def take(self) -> list[tuple[str, Alert]]:
        """All waiting requests, oldest first, as ``(action, alert)``; clears ``pending``."""
        with self._lock:
            out, self._requests = self._requests, []
            self.pending = False
        return out
