"""Live tails of every rank's metrics file, joined by step (rank 0's worker thread, for the cross-rank rules).

Example::

    tails = RankTails(run_dir, world_size=8)
    aligner = StepAligner(world_size=8)
    for rank, records in tails.read_new().items():
        for step, by_rank in aligner.add(rank, records): ...

:class:`RankTails` reads the new lines of every rank's ``metrics.rank<R>.jsonl`` and
:class:`StepAligner` joins them by step, yielding a step once every rank has recorded it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mindwatch.store.jsonl import JsonlTail
from mindwatch.store.layout import RunLayout


class RankTails:
    """New lines of every rank's metrics file, for a live reader (rank 0's worker thread).

    Example::

        tails = RankTails(run_dir, world_size=8)
        for rank, records in tails.read_new().items(): ...
    """

    def __init__(self, run_dir: Path, world_size: int) -> None:
        layout = RunLayout(Path(run_dir))
        self.tails = {r: JsonlTail(layout.metrics(r)) for r in range(world_size)}

    def read_new(self, max_bytes: int | None = 4 << 20) -> dict[int, list[dict[str, Any]]]:
        out = {}
        for rank, tail in self.tails.items():
            records = tail.read_new(max_bytes)
            if records:
                out[rank] = records
        return out


class StepAligner:
    """Joins the records of ``world_size`` ranks by step; a step comes out once every rank has it.

    Example::

        aligner = StepAligner(world_size=2)
        aligner.add(0, [{"step": 1, "data_time": 0.01}])      # -> []
        aligner.add(1, [{"step": 1, "data_time": 0.30}])      # -> [(1, {0: {...}, 1: {...}})]

    Steps that some rank never records (it died, or records on another ``step_interval``) are
    dropped once more than ``max_pending`` steps wait.
    """

    def __init__(self, world_size: int, max_pending: int = 1000) -> None:
        self.world_size = world_size
        self.max_pending = max_pending
        self.pending: dict[int, dict[int, dict[str, Any]]] = {}
        self.dropped = 0

    def add(self, rank: int, records: list[dict[str, Any]]) -> list[tuple[int, dict[int, dict[str, Any]]]]:
        done = []
        for rec in records:
            step = rec.get("step")
            if not isinstance(step, int):
                continue
            at = self.pending.setdefault(step, {})
            at[rank] = rec
            if len(at) == self.world_size:
                done.append((step, self.pending.pop(step)))
        while len(self.pending) > self.max_pending:
            self.pending.pop(min(self.pending))
            self.dropped += 1
        done.sort(key=lambda item: item[0])
        return done
