"""Binary column files beside a rank's JSONL, so a reader opens a long run without parsing it.

Example::

    # the writer side: RunWriter keeps them up to date, nothing to call yourself
    files = read_column_files(Path("monitor_output/gpt/run_1/metrics.rank0.jsonl"))
    if files is not None:              # None: absent, or they do not match the JSONL (then parse it)
        files.offset, files.lines      # they cover the JSONL's first `offset` bytes (`lines` lines)
        files.steps                    # the step of every line, int64
        line, value = files.column("loss")   # line numbers and float64 values, read on demand

The JSONL stays the source of truth; the column files are an index of it, written by the
worker thread at a heartbeat (``flush_secs``), at most every ``every_secs``. ``columns.rank<R>/`` holds:

- ``index.json``: what the files cover (JSONL bytes and lines, a hash of the JSONL's head)
  and, per column, its file number and how many values and line ranges are valid;
- ``steps.i64``: the step of every line with an integer step (the lines every reader counts);
- ``<n>.f64`` and ``<n>.ranges``: column ``n``'s values, and the lines they are on as
  ``(first line, count)`` int64 pairs (a metric logged on every line is one pair per flush).

Every column a reader can ask for is here, except the coordinates ``step`` and ``rank``.
Values are what a reader decodes from the JSON text ("nan" -> nan, true -> 1.0; text,
lists and objects are not numbers). Files only grow; the index is replaced atomically after
the data it names is fsynced, so a reader trusts only what the index claims. A reader also
checks the index against the JSONL (size, head hash, the step of the last covered line) and
ignores files that do not match: a copied, rewritten or truncated JSONL is parsed instead.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from mindwatch.store.jsonl import decode_value, last_record
from mindwatch.store.layout import read_json, write_json_atomic

log = logging.getLogger("mindwatch")

FORMAT = "mindwatch.columns"
VERSION = 1
#: Keys of a record that get no column file (``step`` is ``steps.i64``; ``rank`` is the file's rank).
NOT_STORED = ("step", "rank")
_HEAD = 4096  # bytes of the JSONL hashed to tell it is the same file
_TAIL = 1 << 16  # bytes read before the covered offset to find the last covered line


def columns_dir(metrics: Path) -> Path:
    """``.../metrics.rank0.jsonl`` -> ``.../columns.rank0``."""
    name = metrics.name.removeprefix("metrics.").removesuffix(".jsonl")
    return metrics.with_name(f"columns.{name}")


def number(v: Any) -> float | None:
    """The float a reader decodes from ``v`` once it is written as JSON, or None when it is no number."""
    if type(v) is float or type(v) is int:
        return float(v)
    if isinstance(v, (str, bool, type(None), dict, list)):
        return decode_value(v)
    try:  # numpy scalars, 0-d tensors: the writer stores their float (see jsonl.encode_line)
        return float(v)
    except (TypeError, ValueError):
        return None


def _head_hash(f: BinaryIO, offset: int) -> str:
    """The hash that tells the JSONL open as ``f`` is the one an index describes (its first bytes up to ``offset``)."""
    f.seek(0)
    return hashlib.sha1(f.read(min(offset, _HEAD))).hexdigest()


@dataclass
class _Pending:
    id: int
    values: int = 0  # valid in the files (named by the index)
    ranges: int = 0
    line: list[int] = field(default_factory=list)
    value: list[float] = field(default_factory=list)


class ColumnFilesWriter:
    """Keeps ``columns.rank<R>/`` in step with the JSONL that :class:`~mindwatch.store.writer.RunWriter` appends.

    Runs on the worker thread. Any failure stops the column files (a warning) and leaves the last
    index, which still describes a valid prefix; the JSONL is unaffected.
    """

    def __init__(self, metrics: Path, *, enabled: bool = True, every_secs: float = 0.0) -> None:
        """``enabled=False``: write none (readers parse the JSONL); files of an earlier writer stay as they are.

        ``every_secs``: append to the files at most this often (each append fsyncs every changed file);
        readers parse the JSONL past what the files cover, so a longer interval costs them a longer tail.
        """
        self.metrics = Path(metrics)
        self.dir = columns_dir(self.metrics)
        self.enabled = enabled
        self.every_secs = every_secs
        self._flushed_at = -math.inf
        self.offset = 0  # JSONL bytes described so far (flushed or pending)
        self.lines = 0
        self._steps_flushed = 0
        self._steps: list[int] = []
        self._columns: dict[str, _Pending] = {}
        self._head: str | None = None
        self._dirty = False
        try:
            size = self.metrics.stat().st_size
        except FileNotFoundError:
            size = 0
        try:
            if size and enabled:
                self._continue(size)
            elif not size and self.dir.is_dir():  # a new JSONL: old column files (of a deleted JSONL) describe nothing
                self._clear()
        except OSError as e:
            self.stop(f"cannot prepare {self.dir} ({e})")

    def _clear(self) -> None:
        for p in self.dir.iterdir():
            p.unlink()

    def _continue(self, size: int) -> None:
        """Appending to an existing JSONL (a relaunch): go on from its index, or stop when it lags."""
        files = read_column_files(self.metrics)
        if files is None or files.offset != size:
            self.enabled = False  # the files (if any) still describe a prefix; readers parse the rest
            log.info("mindwatch: %s does not cover all of %s; not extending it", self.dir, self.metrics.name)
            return
        self.offset, self.lines = files.offset, files.lines
        self._steps_flushed = files.lines
        os.truncate(self.dir / "steps.i64", 8 * files.lines)  # drop what a crash wrote past the index
        for name, meta in files.index["columns"].items():
            col = self._columns[name] = _Pending(int(meta["id"]), int(meta["values"]), int(meta["ranges"]))
            os.truncate(self.dir / f"{col.id}.f64", 8 * col.values)
            os.truncate(self.dir / f"{col.id}.ranges", 16 * col.ranges)
        self._head = files.index["head"] if files.offset >= _HEAD else None

    def add(self, records: list[dict[str, Any]], nbytes: int) -> None:
        """``records`` were just appended to the JSONL as ``nbytes`` bytes, one line each."""
        if not self.enabled:
            return
        for rec in records:
            step = rec.get("step")
            if type(step) is not int:
                continue  # readers count only lines with an integer step
            line = self.lines
            self.lines += 1
            self._steps.append(step)
            for key, raw in rec.items():
                if key in NOT_STORED:
                    continue
                v = number(raw)
                if v is None:
                    continue
                col = self._columns.get(key)
                if col is None:
                    col = self._columns[key] = _Pending(len(self._columns))
                col.line.append(line)
                col.value.append(v)
        self.offset += nbytes
        self._dirty = True

    def flush(self, *, force: bool = False) -> None:
        """Append the pending values, fsync them, then replace the index that names them (``every_secs`` apart, or ``force``)."""
        if not self.enabled or not self._dirty:
            return
        now = time.monotonic()
        if not force and now - self._flushed_at < self.every_secs:
            return
        self._flushed_at = now
        try:
            self.dir.mkdir(exist_ok=True)
            self._append("steps.i64", np.asarray(self._steps, dtype="<i8").tobytes())
            for col in self._columns.values():
                if not col.line:
                    continue
                line = np.asarray(col.line, dtype=np.int64)
                breaks = np.flatnonzero(np.diff(line) != 1) + 1
                firsts = line[np.concatenate(([0], breaks))]
                counts = np.diff(np.concatenate(([0], breaks, [len(line)])))
                self._append(f"{col.id}.ranges", np.column_stack((firsts, counts)).astype("<i8").tobytes())
                self._append(f"{col.id}.f64", np.asarray(col.value, dtype="<f8").tobytes())
                col.values += len(col.value)
                col.ranges += len(firsts)
                col.line, col.value = [], []
            self._steps_flushed += len(self._steps)
            self._steps = []
            if self._head is None:
                with open(self.metrics, "rb") as f:
                    head = _head_hash(f, self.offset)
            else:
                head = self._head
            if self.offset >= _HEAD:
                self._head = head  # the head is complete: it no longer changes
            index = {
                "format": FORMAT,
                "version": VERSION,
                "metrics_file": self.metrics.name,
                "offset": self.offset,
                "lines": self._steps_flushed,
                "head": head,
                "columns": {n: {"id": c.id, "values": c.values, "ranges": c.ranges} for n, c in self._columns.items()},
            }
            write_json_atomic(self.dir / "index.json", index)
            self._dirty = False
        except OSError as e:
            self.stop(f"cannot write {self.dir} ({e})")

    def _append(self, name: str, data: bytes) -> None:
        if not data:
            return
        with open(self.dir / name, "ab") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    def stop(self, why: str) -> None:
        """No more column files for this JSONL (readers parse what the last index does not cover)."""
        if self.enabled:
            self.enabled = False
            log.warning("mindwatch: %s; the dashboard will parse the JSONL instead (slower on long runs)", why)


@dataclass
class ColumnFiles:
    """The column files of one JSONL as its index describes them. See :func:`read_column_files`."""

    dir: Path
    index: dict[str, Any]
    steps: np.ndarray

    @property
    def offset(self) -> int:
        return int(self.index["offset"])

    @property
    def lines(self) -> int:
        return int(self.index["lines"])

    @property
    def names(self) -> list[str]:
        return list(self.index["columns"])

    def column(self, name: str) -> tuple[np.ndarray, np.ndarray] | None:
        """(line numbers, values) of ``name`` in the covered lines; None when the files cannot be read."""
        meta = self.index["columns"].get(name)
        if meta is None:
            return np.empty(0, np.int64), np.empty(0, np.float64)
        try:
            n, r = int(meta["values"]), int(meta["ranges"])
            value = np.fromfile(self.dir / f"{int(meta['id'])}.f64", dtype="<f8", count=n)
            ranges = np.fromfile(self.dir / f"{int(meta['id'])}.ranges", dtype="<i8", count=2 * r).reshape(-1, 2)
        except (OSError, ValueError, KeyError, TypeError):
            return None
        firsts, counts = ranges[:, 0], ranges[:, 1]
        if len(value) != n or len(ranges) != r or int(counts.sum()) != n or (counts < 1).any():
            return None
        # every range's lines: first, first+1, ... (the offset of each value within its range added)
        line = np.repeat(firsts - np.cumsum(counts) + counts, counts) + np.arange(n, dtype=np.int64)
        if n and (line[-1] >= self.lines or (np.diff(line) <= 0).any()):
            return None
        return line.astype(np.int64, copy=False), value.astype(np.float64, copy=False)


def read_column_files(metrics: Path) -> ColumnFiles | None:
    """The column files of ``metrics`` when they exist and match it; None otherwise (parse the JSONL)."""
    metrics = Path(metrics)
    directory = columns_dir(metrics)
    index = read_json(directory / "index.json")
    try:
        if index is None or index.get("format") != FORMAT or index.get("version") != VERSION:
            return None
        if index.get("metrics_file") != metrics.name or not isinstance(index.get("columns"), dict):
            return None
        offset, lines = int(index["offset"]), int(index["lines"])
        with open(metrics, "rb") as f:
            if os.fstat(f.fileno()).st_size < offset or _head_hash(f, offset) != index["head"]:
                return None
            f.seek(max(0, offset - _TAIL))
            tail = f.read(offset - max(0, offset - _TAIL))
        steps = np.fromfile(directory / "steps.i64", dtype="<i8", count=lines)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if len(steps) != lines or (offset and not tail.endswith(b"\n")):
        return None
    if lines and (last_record(tail) or {}).get("step") != int(steps[-1]):
        return None  # the JSONL's last covered line is not the one the files end with
    return ColumnFiles(directory, index, steps.astype(np.int64, copy=False))
