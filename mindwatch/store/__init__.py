"""The run directory: writer (append, periodic fsync) and reader (tail, columnar)."""

from mindwatch.store.layout import RunLayout, is_run_dir, new_run_id
from mindwatch.store.reader import JsonlTail, Run, Series, open_run, rank_state
from mindwatch.store.writer import FINAL_STATES, RunWriter

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
]
