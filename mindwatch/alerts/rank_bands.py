"""Rank 0's ``bands/``: each step every rank recorded, summarised across ranks per metric (min, mean, max, who).

Example::

    bands = RankBands(layout, world_size=8, decide_after=10.0)
    bands.from_files(complete)      # [(step, {rank: record})]: steps joined from every rank's metrics file
    bands.from_signal(complete)     # the step and data time the train step's collective brought
    bands.from_signal([], final=True)   # at the end: what waited for the decision below is written now

Runs on rank 0's worker thread, inside :class:`~mindwatch.alerts.crossrank.CrossRankWatch`, which joins the
steps; this module only decides what goes into the band files (:mod:`mindwatch.store.bandfiles`).

The bands come from the rank files when the other ranks' files are in this run directory (every recorded
step, the last one too). When they are not (no shared file system), the step and data time come from the
signal's timings instead, and ``local_grad_norm`` from the norms the signal carries. Which of the two is learnt
once: the other ranks' files appear, or the signal has
brought timings for ``decide_after`` seconds (the stale limit) with no file in sight, or the run ends; the
signal's rows wait until then.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from mindwatch import metrics as vocab
from mindwatch.store.bandfiles import BandFileWriter, band_rows
from mindwatch.store.layout import RunLayout

#: Steps across ranks: ``(step, {rank: that rank's record of it})``.
Steps = list[tuple[int, dict[int, dict[str, Any]]]]

#: Where the other ranks' files are: not known yet, in this run directory, or on their own hosts.
UNKNOWN, HERE, ELSEWHERE = "unknown", "here", "elsewhere"


class RankBands:
    """See the module docstring."""

    def __init__(
        self,
        layout: RunLayout,
        world_size: int,
        *,
        decide_after: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.layout = layout
        self.world_size = world_size
        self.decide_after = decide_after
        self.clock = clock
        self.files = BandFileWriter(layout)
        #: Where the other ranks' files are (:data:`UNKNOWN` until learnt; see the module docstring).
        self.others = UNKNOWN
        self._signal_since: float | None = None
        self._waiting: deque[tuple[int, dict[int, dict[str, Any]]]] = deque(maxlen=10_000)

    @property
    def others_elsewhere(self) -> bool:
        """The other ranks' files are on their own hosts: nothing of theirs will appear here."""
        return self.others == ELSEWHERE

    def from_files(self, complete: Steps) -> None:
        """Steps joined from the rank files: every banded metric (the timings too, unless the signal's are used)."""
        skip = vocab.STRAGGLER_METRICS if self.others_elsewhere else ()
        self._write(complete, [m for m in vocab.banded() if m not in skip])

    def from_signal(self, complete: Steps, *, final: bool = False) -> None:
        """The signal's timings, written when the other ranks' files are not here (``final``: the run ends)."""
        if self._signal_since is None and complete:
            self._signal_since = self.clock()
        if self.others == UNKNOWN:
            self.others = self._where_others_are(final)
        if self.others == UNKNOWN:
            self._waiting.extend(complete)
            return
        rows = [*self._waiting, *complete] if self.others == ELSEWHERE else []
        self._waiting.clear()
        if rows:
            self._write(rows, [*vocab.STRAGGLER_METRICS, vocab.LOCAL_GRAD_NORM])

    def _where_others_are(self, final: bool) -> str:
        if any(self.layout.metrics(r).exists() for r in range(1, self.world_size)):
            return HERE
        since = self._signal_since
        if final or (since is not None and self.clock() - since >= self.decide_after):
            return ELSEWHERE
        return UNKNOWN

    def _write(self, complete: Steps, metrics: list[str]) -> None:
        """Each metric's values at ``complete``'s steps, one column a rank, summarised into ``bands/``."""
        complete.sort(key=lambda item: item[0])
        ranks = np.arange(self.world_size)
        for metric in metrics:
            having = [(step, by_rank) for step, by_rank in complete if any(metric in rec for rec in by_rank.values())]
            if not having:
                continue
            values = np.full((len(having), self.world_size), np.nan)
            for i, (_, by_rank) in enumerate(having):
                for r, rec in by_rank.items():
                    v = rec.get(metric)
                    if isinstance(v, (int, float)):
                        values[i, r] = v
            self.files.append(metric, band_rows([step for step, _ in having], ranks, values))
