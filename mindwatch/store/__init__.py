"""The run directory: where things live (:mod:`layout`), the line format (:mod:`jsonl`), the writer
(append, periodic fsync, :mod:`columnfiles` beside the JSONL), and the readers: :mod:`columns` (one
rank's metrics as numpy columns; :mod:`cache` keeps them across restarts), :mod:`reader`
(``open_run``), :mod:`states`, :mod:`catalog` (the runs under a folder), :mod:`tails` (live tails
of every rank) and :mod:`rendezvous` (the run id every rank agrees on).

It imports nothing of mindwatch outside itself (docs/architecture.md).
"""

from mindwatch.store.layout import RunLayout, is_run_dir, new_run_id
from mindwatch.store.reader import JsonlTail, Run, Series, open_run
from mindwatch.store.states import FINAL_STATES, rank_state, run_state
from mindwatch.store.writer import RunWriter

__all__ = [
    "FINAL_STATES",
    "JsonlTail",
    "Run",
    "RunLayout",
    "RunWriter",
    "Series",
    "is_run_dir",
    "new_run_id",
    "open_run",
    "rank_state",
    "run_state",
]
