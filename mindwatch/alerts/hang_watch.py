"""Rank 0's hang watch: the stalls the ranks report, their stack dumps, and one ``hang`` alert per stall.

Example::

    hang = HangWatch(layout, world_size=8, settings=cfg.distributed.hang, emit=session.emit_alert)
    hang.saw(3, alert)         # each alert of alerts.jsonl, as rank 0's cross-rank watch reads them
    hang.relayed(3, message)   # the lifeline's thread: rank 3's stall alert and its dump (no shared folder needed)
    hang.take_relayed()        # the worker: those dumps kept in this run's stacks/
    hang.check()               # after each read: diagnose once every rank dumped, or ``hang.wait`` s after the first

When ranks report a ``stall`` (each rank's watchdog, which dumps its stacks into ``stacks/``), it waits until
every rank's dump is there (or ``wait`` seconds) and emits one ``hang`` alert that names the rank the others
wait for (:func:`mindwatch.alerts.hang.diagnose`). Runs on rank 0's worker thread (``relayed`` excepted),
inside :class:`~mindwatch.alerts.crossrank.CrossRankWatch`.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mindwatch.alerts.alert import RESUMED, STALL, Alert, make_alert
from mindwatch.alerts.hang import HangSettings, diagnose
from mindwatch.store.layout import RunLayout, read_json

log = logging.getLogger("mindwatch")

#: The rule's name in ``alerts.jsonl``.
HANG = "hang"


class HangWatch:
    """See the module docstring. ``enabled`` False: the dumps other ranks relay are still kept, no diagnosis."""

    def __init__(
        self,
        layout: RunLayout,
        world_size: int,
        settings: HangSettings,
        emit: Callable[[Alert], None],
        *,
        enabled: bool = True,
        wake: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.layout = layout
        self.world_size = world_size
        self.emit = emit
        self.enabled = enabled
        self.wait = settings.wait
        self.actions = list(settings.actions)
        #: Wakes the worker when a dump arrives over the lifeline.
        self.wake = wake
        self.clock = clock
        self.diagnoses = 0
        self._stalls: dict[int, Alert] = {}
        #: Stall alerts and dumps the other ranks sent over the lifeline (``relayed``), for the worker.
        self._relayed: deque[tuple[int, Alert, str]] = deque()
        self._stall_since: float | None = None
        self._diagnosed = False

    def saw(self, rank: int, alert: Alert) -> None:
        """``rank``'s alert, as ``alerts.jsonl`` holds it: a stall starts the wait for the dumps, ``resumed`` ends it."""
        if not self.enabled:
            return
        if alert.get("rule") == STALL:
            self._stalled(rank, alert)
        elif alert.get("rule") == RESUMED:
            self._stalls.pop(rank, None)
            if not self._stalls:
                self._stall_since, self._diagnosed = None, False

    def check(self) -> None:
        """The ``hang`` alert, once a stall's dumps are all in (or ``wait`` s passed); one per stall."""
        if not self.enabled or self._stall_since is None or self._diagnosed:
            return
        if len(self._stalls) < self.world_size and self.clock() - self._stall_since < self.wait:
            return  # give the other ranks' watchdogs time to write their dumps
        self._diagnosed = True
        self.emit(self.diagnose())

    def relayed(self, rank: int, message: dict[str, Any]) -> None:
        """The lifeline's thread: ``rank``'s stall alert and its stack dump (``StacksRelay``); kept in this run's
        ``stacks/`` on the worker, for the hang diagnosis, with or without a shared folder."""
        if isinstance(message.get("stall"), dict) and isinstance(message.get("stacks_text"), str):
            self._relayed.append((rank, message["stall"], message["stacks_text"]))
            if self.wake is not None:
                self.wake()

    def take_relayed(self) -> None:
        """The worker: the dumps relayed since the last look, written into ``stacks/`` (unless a shared folder has them)."""
        while self._relayed:
            rank, alert, text = self._relayed.popleft()
            name = Path(str(alert.get("stacks") or "")).name
            if not name.startswith(f"stall_rank{rank}_"):
                continue
            path = self.layout.stacks / name
            if not path.exists():  # a shared folder has it already
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    tmp = path.with_name(f".{name}.tmp")
                    tmp.write_text(text, encoding="utf-8")
                    tmp.replace(path)
                except OSError as e:
                    log.warning("mindwatch: cannot keep rank %d's stack dump in %s (%s)", rank, path, e)
                    continue
            if self.enabled:
                self._stalled(rank, {**alert, "rank": rank, "stacks": str(path)})

    def diagnose(self) -> Alert:
        """The ``hang`` alert from the stall dumps collected so far."""
        self.diagnoses += 1
        dumps = {r: self._local(a["stacks"]) for r, a in self._stalls.items() if a.get("stacks")}
        last_steps = {}
        for r in range(self.world_size):
            st = read_json(self.layout.status(r)) or {}
            last_steps[r] = st.get("last_step")
        d = diagnose(dumps, self.world_size, last_steps)
        step = max((s for s in last_steps.values() if isinstance(s, int)), default=None)
        where = {str(r): {"where": p.where, "detail": p.detail, "stacks": p.stacks} for r, p in d.places.items()}
        return make_alert(
            HANG,
            step=step,
            rank=d.culprits[0] if len(d.culprits) == 1 else 0,
            message=f"run stalled after step {step}: {d.message}",
            severity="error",
            actions=self.actions,
            culprits=d.culprits,
            waiting=d.waiting,
            places=where,
            reported_by=0,
        )

    def _stalled(self, rank: int, alert: Alert) -> None:
        self._stalls[rank] = alert
        if self._stall_since is None:
            self._stall_since = self.clock()

    def _local(self, path: str) -> Path:
        """A dump path as another rank wrote it (maybe relative to its own working directory), found here."""
        p = Path(path)
        return p if p.exists() else self.layout.stacks / p.name
