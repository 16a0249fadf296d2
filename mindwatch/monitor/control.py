"""What the rules ask the training loop to do: a small thread-safe mailbox of requested actions.

Example::

    control = Control()
    control.request(alert)              # any thread: an alert whose "actions" lists e.g. ["stop"]
    if control.pending:                 # the training thread, at a step boundary: one attribute read
        for action, alert in control.take(step):
            ...                         # carry it out (stop, checkpoint, lr_backoff, dump_stacks)

Rules never reach into the training loop (like Hugging Face's ``TrainerControl``): they put
requests here and the framework adapter (``mindwatch.mindspore.MonitorCallback``) acts on
them at the next step boundary.

In a multi-rank run the Control is ``coordinated``: a request waits in :meth:`outgoing` until the
worker's :class:`~mindwatch.monitor.coordination.ActionCoordinator` has agreed a step with every
rank, then comes back through :meth:`schedule` with that step (``at_step``), so every rank acts
at the same step boundary.
"""

from __future__ import annotations

import threading
from typing import Any, get_args

from mindwatch.schema import Action

#: Actions the MindSpore adapter knows how to carry out: a rule's (``schema.Action``), then ``resize_batch``, a person's
#: ``mindwatch batch RUN SIZE``. The order is the signal's bit order (``rank_signal.ACTION_BITS``).
ACTIONS = (*get_args(Action), "resize_batch")

Alert = dict[str, Any]


class Control:
    """Requested actions waiting for a step boundary. Each (action, rule, step) is requested once."""

    def __init__(self, *, coordinated: bool = False) -> None:
        #: True while actions wait to be taken; the hot path reads only this.
        self.pending = False
        #: Requests go to :meth:`outgoing` (for the other ranks to agree on) instead of straight to the loop.
        self.coordinated = coordinated
        self._lock = threading.Lock()
        self._due: list[tuple[int | None, str, Alert]] = []
        self._outbox: list[tuple[str, Alert]] = []
        self._seen: set[tuple[str, Any, Any, Any]] = set()

    def request(self, alert: Alert, *, every_rank_alike: bool = False) -> None:
        """Queue every action in ``alert["actions"]``; an action already requested for the same rule, step (and person's
        ``request``) is ignored.

        ``every_rank_alike``: every rank requests the same at the same step (it comes from a value all ranks share,
        such as a NaN ``grad_norm`` after the all-reduce), so the action is due at once, with no agreement to wait for.
        """
        with self._lock:
            for action in alert.get("actions") or ():
                if action not in ACTIONS:
                    continue
                key = (action, alert.get("rule"), alert.get("step"), alert.get("request"))
                if key in self._seen:
                    continue
                self._seen.add(key)
                if self.coordinated and not every_rank_alike:
                    self._outbox.append((action, alert))
                else:
                    self._due.append((None, action, alert))
            self.pending = bool(self._due)

    def forget_after(self, step: int) -> None:
        """Steps after ``step`` will run again (a rewind went back to ``step``): their alerts may ask once more."""
        with self._lock:
            self._seen = {key for key in self._seen if not (isinstance(key[2], int) and key[2] > step)}

    @property
    def outgoing_waiting(self) -> bool:
        """Requests wait in the outbox (read without the lock: the worker looks every loop)."""
        return bool(self._outbox)

    def outgoing(self) -> list[tuple[str, Alert]]:
        """Requests of a coordinated Control not yet sent to the other ranks (the worker thread takes them)."""
        with self._lock:
            out, self._outbox = self._outbox, []
        return out

    def schedule(self, action: str, alert: Alert, at_step: int | None = None) -> None:
        """File ``action`` for the step boundary after step ``at_step`` (None: the next one)."""
        with self._lock:
            self._due.append((at_step, action, alert))
            self.pending = True

    def waiting(self, alert: Alert) -> bool:
        """Whether an action filed with this very ``alert`` (by :meth:`schedule`) is still to be taken."""
        with self._lock:
            return any(al is alert for _, _, al in self._due)

    def take(self, step: int | None = None) -> list[tuple[str, Alert]]:
        """The actions due at ``step`` (all when None), oldest first, as ``(action, alert)``; later ones keep waiting.

        An action scheduled for a step already passed is due at once (its rank was late).
        """
        with self._lock:
            due = [(a, al) for s, a, al in self._due if s is None or step is None or step >= s]
            self._due = [item for item in self._due if not (item[0] is None or step is None or step >= item[0])]
            self.pending = bool(self._due)
        return due
