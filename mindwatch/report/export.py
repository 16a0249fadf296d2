"""``mindwatch export``: a run's metrics as one table (csv, jsonl or parquet).

Example::

    from mindwatch.report.export import export_run, metrics_table
    export_run("monitor_output/gpt/run_20261129_074500", "csv", "gpt.csv")
    table = metrics_table("monitor_output/gpt/run_20261129_074500")   # {column: numpy array}
    export_run("node0/gpt/run_1", "csv", "gpt.csv", also=["node1/gpt/run_1"])  # a run's folders on two nodes, as one

One row per recorded step and rank, columns ``step, rank, t, epoch`` then every metric
(sorted). A metric a record does not hold is empty (csv), ``null`` (jsonl) or null (parquet);
non-finite values are ``nan``/``inf``/``-inf`` (csv), the run store's strings ``"nan"``,
``"inf"``, ``"-inf"`` (jsonl) and IEEE floats (parquet). Rows are ordered by step, then rank.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from mindwatch.store.csvfile import csv_lines, number_cells
from mindwatch.store.reader import open_run

FORMATS = ("csv", "jsonl", "parquet")
#: Columns that are whole numbers (nullable in parquet); every other metric column is float64.
_INTEGER_COLUMNS = ("step", "rank", "epoch")


#: More folders of one run: its ranks in each node's save_dir, without a shared file system (``--also``).
Folders = Sequence[str | os.PathLike[str]]


def metrics_table(run_dir: str | os.PathLike[str], also: Folders = ()) -> dict[str, np.ndarray]:
    """Every record of every rank as columns: ``step``, ``rank``, ``t`` (float, NaN when absent), then metrics.

    Metric columns are float64 with NaN where a record lacks the metric; ``present[name]`` masks
    tell a missing value from a recorded NaN (see :func:`table_with_masks`).
    """
    return table_with_masks(run_dir, also)[0]


def table_with_masks(run_dir: str | os.PathLike[str], also: Folders = ()) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """``(columns, present)``: the table and, per metric column, a bool mask of recorded values."""
    run = open_run(run_dir, *also)
    steps, ranks, times = [], [], []
    values: dict[str, list[tuple[int, np.ndarray, np.ndarray]]] = {}  # name -> (first row, lines, values) per rank
    n = 0
    for rank, cols in sorted(run.columns.items()):
        columns = {name: cols.column(name) for name in cols.keys}
        lines = np.arange(cols.lines)
        if cols.rewound:  # a resumed attempt wrote some steps again: only lines holding a newest value are rows
            lines = np.unique(np.concatenate([line for line, _ in columns.values()] or [np.empty(0, np.int64)]))
        steps.append(cols.steps[lines])
        ranks.append(np.full(len(lines), rank, np.int64))
        times.append(cols.time_of_lines(lines))
        for name, (line, value) in columns.items():
            values.setdefault(name, []).append((n, np.searchsorted(lines, line), value))
        n += len(lines)
    step = np.concatenate(steps) if steps else np.empty(0, np.int64)
    rank_col = np.concatenate(ranks) if ranks else np.empty(0, np.int64)
    order = np.lexsort((rank_col, step))
    cols_out: dict[str, np.ndarray] = {"step": step[order], "rank": rank_col[order]}
    cols_out["t"] = (np.concatenate(times) if times else np.empty(0))[order]
    present: dict[str, np.ndarray] = {}
    for name in sorted(values, key=lambda k: (k != "epoch", k)):
        col = np.full(n, np.nan)
        mask = np.zeros(n, bool)
        for first, line, value in values[name]:
            col[first + line] = value
            mask[first + line] = True
        cols_out[name], present[name] = col[order], mask[order]
    return cols_out, present


def export_run(
    run_dir: str | os.PathLike[str], fmt: str, out: str | os.PathLike[str] | None = None, *, also: Folders = ()
) -> Path:
    """Write the table to ``out`` (default ``<run_dir>/metrics.<fmt>``) and return its path; ``also``: the run's
    folders on other nodes, their ranks' rows in the same table."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    cols, present = table_with_masks(run_dir, also)
    path = Path(out) if out is not None else Path(run_dir) / f"metrics.{fmt}"
    path.parent.mkdir(parents=True, exist_ok=True)
    {"csv": _write_csv, "jsonl": _write_jsonl, "parquet": _write_parquet}[fmt](path, cols, present)
    return path


def _cells(name: str, col: np.ndarray, mask: np.ndarray | None, *, json_cells: bool = False) -> list[str]:
    """One column as cells (:func:`~mindwatch.store.csvfile.number_cells`): empty (CSV) or ``null`` (JSONL) where
    absent, NaN/Inf in the run store's spelling (quoted in JSONL), whole numbers for the integer columns."""
    missing = "null" if json_cells else ""
    return number_cells(col, mask, whole=name in _INTEGER_COLUMNS, missing=missing, quoted=json_cells)


def _write_csv(path: Path, cols: dict[str, np.ndarray], present: dict[str, np.ndarray]) -> None:
    names = list(cols)
    cells = [_cells(k, cols[k], present.get(k)) for k in names]
    with open(path, "w", newline="", encoding="utf-8") as f:
        f.writelines(csv_lines(names, cells))


def _write_jsonl(path: Path, cols: dict[str, np.ndarray], present: dict[str, np.ndarray]) -> None:
    names = list(cols)
    keys = [json.dumps(k) + ":" for k in names]
    cells = [
        [key + tok for tok in _cells(k, cols[k], present.get(k), json_cells=True)] for key, k in zip(keys, names, strict=True)
    ]
    with open(path, "w", encoding="utf-8") as f:
        f.writelines("{" + ",".join(row) + "}\n" for row in zip(*cells, strict=True))


def _write_parquet(path: Path, cols: dict[str, np.ndarray], present: dict[str, np.ndarray]) -> None:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise SystemExit("mindwatch export --format parquet needs pyarrow: pip install 'pyarrow<20'") from None
    arrays = {}
    for name, col in cols.items():
        mask = ~present[name] if name in present else None
        if name in _INTEGER_COLUMNS:
            whole = np.where(np.isfinite(col), col, 0).astype(np.int64)
            arrays[name] = pa.array(whole, type=pa.int64(), mask=mask)
        else:
            arrays[name] = pa.array(col, type=pa.float64(), mask=mask, from_pandas=False)
    pq.write_table(pa.table(arrays), path)
