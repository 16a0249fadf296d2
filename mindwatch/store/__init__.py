"""The run directory: writer (append, periodic fsync, column files) and reader (tail, columnar).

Data flow: :mod:`writer` (JSONL lines, :mod:`jsonl`; binary :mod:`columnfiles` beside them)
-> :mod:`columns` (one rank's metrics as numpy columns, from the column files and the JSONL)
-> :mod:`reader` (``open_run``: a run's ranks, meta, status, alerts) and :mod:`catalog`,
:mod:`crossrank` on top.
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
