"""Columnar, incremental view of one rank's ``metrics.rank<R>.jsonl`` for chart queries on long runs.

Example::

    cols = RankColumns(Path("monitor_output/gpt/run_1/metrics.rank0.jsonl"))
    cols.refresh()                      # read what was appended since (complete lines only)
    line, value = cols.column("loss")   # line numbers and values, numpy arrays
    cols.steps[line]                    # the step of each value

Every reader of metrics goes through here (:func:`mindwatch.open_run`, the dashboard, reports).
When the writer's column files match the file (:mod:`mindwatch.store.columnfiles`), what they
cover is taken from them and only the rest of the JSONL is parsed. Parsing reads the file in
segments of complete lines (:class:`JsonlTail`): the step of every line is pulled out with one
regular expression per segment, and a metric's column only when someone asks for it (one
regular expression per segment, values converted by numpy), instead of ``json.loads`` into
Python lists, which for a 1,000,000-step run with 10 metrics costs many seconds and gigabytes.
A segment whose lines do not all look like the writer's output (a torn line in the middle,
foreign lines) is decoded with ``json.loads`` instead and kept re-encoded: the answer is what
``json.loads`` of every line gives, only the speed differs.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mindwatch.store.columnfiles import NOT_STORED, ColumnFiles, read_column_files
from mindwatch.store.jsonl import COORDINATES, JsonlTail, decode_line, decode_value, encode_line, read_last_record
from mindwatch.store.layerfiles import LayerFiles, LayerHistograms, layers_dir

if TYPE_CHECKING:
    from mindwatch.store.cache import ColumnCache

_STEP = re.compile(rb'"step"\s*:\s*(-?\d+)\s*[,}]')
_DIGITS = b"0123456789.+-"
#: A segment with more distinct line shapes than this is scanned line by line for its keys.
_MAX_SHAPES = 256


class _Growable:
    """An append-only numpy array with amortised O(1) appends."""

    def __init__(self, dtype: type) -> None:
        self._data: np.ndarray = np.empty(1024, dtype=dtype)
        self.size = 0

    def extend(self, values: np.ndarray) -> None:
        need = self.size + len(values)
        if need > len(self._data):
            grown = np.empty(max(need, 2 * len(self._data)), dtype=self._data.dtype)
            grown[: self.size] = self._data[: self.size]
            self._data = grown
        self._data[self.size : need] = values
        self.size = need

    @property
    def view(self) -> np.ndarray:
        return self._data[: self.size]


@dataclass
class _Segment:
    start: int  # byte offset in the file
    end: int
    first_line: int
    lines: int
    clean: bytes | None = None  # re-encoded valid lines when the raw bytes needed json decoding


@dataclass
class _Column:
    line: _Growable = field(default_factory=lambda: _Growable(np.int64))
    value: _Growable = field(default_factory=lambda: _Growable(np.float64))
    segments_done: int = 0


class RankColumns:
    """Steps of every line, and metric columns extracted on demand. See the module docstring."""

    def __init__(self, path: Path, segment_bytes: int = 16 << 20, cache: ColumnCache | None = None) -> None:
        self.path = Path(path)
        self.segment_bytes = segment_bytes
        self.cache = cache
        self._reset()
        self.from_files = self._open_files()
        self.from_cache = not self.from_files and cache is not None and cache.load(self)
        self._saved_work = self._work()

    def _reset(self) -> None:
        self._tail = JsonlTail(self.path)
        self._segments: list[_Segment] = []
        self._steps = _Growable(np.int64)
        self._high = np.iinfo(np.int64).min  # the highest step read so far
        self._rewritten = _Growable(np.int64)  # lines whose step is below an earlier line's: a later attempt's rewind
        self._latest: dict[str, tuple[int, np.ndarray, np.ndarray]] = {}  # column() answers, by raw length
        self._columns: dict[str, _Column] = {}
        self._keys: set[str] = set()
        self._segments_scanned = 0  # segments whose keys are in _keys
        self.bad_lines = 0
        self.generation = getattr(self, "generation", -1) + 1  # bumps when the file was replaced
        self._files: ColumnFiles | None = None  # when set, segment 0 is what they cover, every column included
        self._free_work = 0  # lines and values taken from the column files (nothing a cache would save)
        self._ino: int | None = None  # the file's inode, to notice a replaced file
        self._layers = LayerFiles(layers_dir(self.path))  # per-layer statistics beside the JSONL, when written

    def _open_files(self) -> bool:
        """Start from the writer's column files (see :mod:`mindwatch.store.columnfiles`) when they match the file."""
        files = read_column_files(self.path)
        if files is None or not files.lines:
            return False
        self._files = files
        self._tail.offset = files.offset
        self._segments.append(_Segment(0, files.offset, 0, files.lines))
        self._add_steps(files.steps)
        self._keys = {name for name in files.names if name not in COORDINATES}
        self._segments_scanned = 1
        self._free_work = files.lines
        return True

    # -- reading ----------------------------------------------------------
    @property
    def lines(self) -> int:
        """Valid lines read so far (the line numbers of columns count these)."""
        return self._steps.size

    @property
    def steps(self) -> np.ndarray:
        return self._steps.view

    def refresh(self) -> int:
        """Read the complete lines appended since the last call; returns how many valid lines were added."""
        try:
            st = self.path.stat()
        except OSError:
            return 0
        if st.st_size < self._tail.offset or st.st_ino != (self._ino or st.st_ino):  # truncated or replaced: start over
            self._reset()
            self._open_files()
        self._ino = st.st_ino
        before = self.lines
        size, limit = st.st_size, self.segment_bytes
        while self._tail.offset < size:
            start = self._tail.offset
            data = self._tail.read_new_bytes(limit)
            if not data:
                if size - start <= limit:
                    break  # only a torn last line is left: read it once it is complete
                limit *= 2  # a line longer than a segment
                continue
            self._add_segment(start, data)
        for name, col in self._columns.items():
            self._extend(name, col)
        self._layers.refresh()
        self._maybe_save()
        return self.lines - before

    def _add_segment(self, start: int, data: bytes) -> None:
        raw_len = len(data)
        steps = _STEP.findall(data)
        n_lines = data.count(b"\n")
        clean = None
        # Anything but one flat object per line (nested values, blank or foreign lines) goes through json.
        if len(steps) != n_lines or data.count(b"{") != n_lines or not data.startswith(b"{"):
            data = clean = self._reencode(data)
            steps = _STEP.findall(data)
            n_lines = len(steps)
        seg = _Segment(start, start + raw_len, self.lines, n_lines, clean)
        self._add_steps(np.array(steps, dtype=np.int64))
        self._segments.append(seg)

    def _reencode(self, data: bytes) -> bytes:
        """Valid records, one flat object per line in the writer's format (as the reader: steps must be integers)."""
        out = []
        for line in data.splitlines():
            if not line.strip():
                continue
            rec = decode_line(line)
            if rec is None:
                self.bad_lines += 1
            elif isinstance(rec.get("step"), int) and not isinstance(rec.get("step"), bool):
                out.append(encode_line({k: v for k, v in rec.items() if not isinstance(v, (dict, list))}))
        return b"".join(out)

    def _add_steps(self, steps: np.ndarray) -> None:
        first = self._steps.size
        self._steps.extend(steps)
        if not len(steps):
            return
        high = np.maximum.accumulate(np.concatenate(([self._high], steps)))
        below = np.flatnonzero(steps < high[:-1])
        if len(below):
            self._rewritten.extend(first + below)
        self._high = int(high[-1])

    @property
    def rewound(self) -> bool:
        """Some step was written again after later steps (a resumed attempt started before the last one stopped)."""
        return self._rewritten.size > 0

    def rewritten_since(self, line: int) -> bool:
        """Whether a line from ``line`` on went back below the highest step before it."""
        return self._rewritten.size > 0 and int(self._rewritten.view[-1]) >= line

    def layer_histograms(self) -> tuple[np.ndarray, LayerHistograms | None]:
        """``(steps, histograms)`` of the layer files: one step per row, ``histograms.data`` of shape
        ``(rows, 2, layers, bins + 1)`` (see :class:`~mindwatch.store.layerfiles.LayerHistograms`); None when absent."""
        files = self._layers
        keep = files.hist_lines < self.lines
        if not files.bins or not keep.any():
            return np.empty(0, np.int64), None
        return self.steps[files.hist_lines[keep]], LayerHistograms(tuple(files.layers), files.hist[keep])

    @property
    def layer_metrics(self) -> list[str]:
        """The per-layer metrics of the layer files, in the model's order (``grad_norm/<first layer>``, ...)."""
        return list(self._layers.metrics)

    @property
    def keys(self) -> set[str]:
        """Names of the numeric values in the file (metrics), found lazily: a chart query does not need them."""
        if self._segments_scanned < len(self._segments):
            with open(self.path, "rb") as f:
                for seg in self._segments[self._segments_scanned :]:
                    self._discover_keys(self._segment_bytes(f, seg))
                    self._segments_scanned += 1
        return self._keys | set(self._layers.metrics)

    def _discover_keys(self, data: bytes) -> None:
        # Lines of one shape (same keys, numbers removed) share keys: decode one line per shape.
        flat = data.translate(None, _DIGITS).split(b"\n")
        shapes = dict.fromkeys(flat)
        if len(shapes) > _MAX_SHAPES:
            samples = data.split(b"\n")
        else:
            starts = np.concatenate(([0], np.flatnonzero(np.frombuffer(data, np.uint8) == 10) + 1))
            samples = [data[starts[k] : starts[k + 1]] for k in (flat.index(shape) for shape in shapes) if k + 1 < len(starts)]
        for line in samples:
            rec = decode_line(line) if line.strip() else None
            if rec:
                self._keys.update(k for k, v in rec.items() if k not in COORDINATES and decode_value(v) is not None)

    @staticmethod
    def _segment_bytes(f: Any, seg: _Segment) -> bytes:
        if seg.clean is not None:
            return seg.clean
        f.seek(seg.start)
        return bytes(f.read(seg.end - seg.start))

    def last_record(self, max_bytes: int = 1 << 16) -> dict[str, Any] | None:
        """The last record read so far that has an integer step, decoded in full (None beyond ``max_bytes``)."""
        return read_last_record(self.path, end=self._tail.offset, max_bytes=max_bytes)

    # -- columns ----------------------------------------------------------
    def column(self, metric: str) -> tuple[np.ndarray, np.ndarray]:
        """(line numbers, values) of ``metric``, each step once, ordered by step. Empty when absent.

        A step written more than once (a resumed attempt that rewound) has its last-written value;
        the older ones stay in the file and in :meth:`raw_column`. Without rewinds this is the file order.
        """
        line, value = self.raw_column(metric)
        written = len(line)
        cached = self._latest.get(metric)
        if cached is not None and cached[0] == written:
            return cached[1], cached[2]
        if self.rewound:
            steps = self._steps.view[line]
            if len(steps) > 1 and not (steps[1:] > steps[:-1]).all():
                _, last_in_reverse = np.unique(steps[::-1], return_index=True)
                keep = len(steps) - 1 - last_in_reverse  # the last line of each step, in step order
                line, value = line[keep], value[keep]
        self._latest[metric] = (written, line, value)
        return line, value

    def raw_column(self, metric: str) -> tuple[np.ndarray, np.ndarray]:
        """(line numbers, values) of ``metric`` in file order, every value written. Empty when absent."""
        layer = self._layers.column(metric, lines_known=self.lines)
        if layer is not None:
            return layer
        col = self._columns.get(metric)
        if col is None:
            col = self._columns[metric] = _Column()
            stored = self._files.column(metric) if self._files is not None and metric not in NOT_STORED else None
            if stored is not None:  # the column files hold all of it for the first segment
                col.line.extend(stored[0])
                col.value.extend(stored[1])
                col.segments_done = 1
                self._free_work += len(stored[0])
            self._extend(metric, col)
            self._maybe_save()
        return col.line.view, col.value.view

    # -- persistence (see mindwatch.store.cache) -------------------------------
    def _work(self) -> int:
        """Lines parsed so far, over the steps and every column: what a cache saves us from redoing."""
        return self.lines + sum(col.line.size for col in self._columns.values()) - self._free_work

    def _maybe_save(self) -> None:
        if self.cache is not None and self.cache.worth_saving(self._saved_work, self._work()):
            self.cache.save(self)
            self._saved_work = self._work()

    def snapshot(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """Everything read so far, as JSON-able state and numpy arrays (for :class:`ColumnCache`)."""
        arrays: dict[str, np.ndarray] = {"steps": self.steps}
        segments = []
        for i, seg in enumerate(self._segments):
            if seg.clean is not None:
                arrays[f"clean{i}"] = np.frombuffer(seg.clean, np.uint8)
            segments.append([seg.start, seg.end, seg.first_line, seg.lines, seg.clean is not None])
        columns = {}
        for i, (name, col) in enumerate(self._columns.items()):
            line = col.line.view
            dense = len(line) == self.lines and (not len(line) or (line[0] == 0 and line[-1] == len(line) - 1))
            if not dense:  # a metric on every line needs no line numbers (they only increase)
                arrays[f"line{i}"] = line
            arrays[f"value{i}"] = col.value.view
            columns[name] = [i, col.segments_done, bool(dense)]
        state = {
            "offset": self._tail.offset,
            "segments": segments,
            "columns": columns,
            "keys": sorted(self._keys),
            "segments_scanned": self._segments_scanned,
            "bad_lines": self.bad_lines,
        }
        return state, arrays

    def restore(self, state: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        """Continue from a :meth:`snapshot` of the same file, on a fresh instance (the caller checked the file)."""
        self._tail.offset = int(state["offset"])
        for i, (start, end, first, lines, dirty) in enumerate(state["segments"]):
            self._segments.append(_Segment(start, end, first, lines, arrays[f"clean{i}"].tobytes() if dirty else None))
        self._add_steps(arrays["steps"])
        for name, (i, done, dense) in state["columns"].items():
            col = self._columns[name] = _Column(segments_done=done)
            value = arrays[f"value{i}"]
            col.line.extend(np.arange(len(value), dtype=np.int64) if dense else arrays[f"line{i}"])
            col.value.extend(value)
        self._keys = set(state["keys"])
        self._segments_scanned = int(state["segments_scanned"])
        self.bad_lines = int(state["bad_lines"])

    def _extend(self, metric: str, col: _Column) -> None:
        if col.segments_done == len(self._segments):
            return
        pattern = re.compile(rb'"' + re.escape(json.dumps(metric)[1:-1].encode()) + rb'"\s*:\s*([^,}\s]+)')
        with open(self.path, "rb") as f:
            for seg in self._segments[col.segments_done :]:
                if not self._extract(pattern, self._segment_bytes(f, seg), seg, col):
                    break  # the file changed under us: the next refresh starts over
                col.segments_done += 1

    @staticmethod
    def _extract(pattern: re.Pattern[bytes], data: bytes, seg: _Segment, col: _Column) -> bool:
        """Append the segment's values of the column; False when the file no longer holds the segment."""
        if len(data) != seg.end - seg.start and seg.clean is None:
            return False
        raw = pattern.findall(data)
        if not raw:
            return True
        if len(raw) == seg.lines:
            line = np.arange(seg.first_line, seg.first_line + seg.lines, dtype=np.int64)
        else:  # a sparse metric: find the line of each match
            newlines = np.flatnonzero(np.frombuffer(data, np.uint8) == 10)
            pos = np.fromiter((m.start() for m in pattern.finditer(data)), np.int64, len(raw))
            line = seg.first_line + np.searchsorted(newlines, pos)
        try:
            value = np.array(raw, dtype=np.float64)
        except ValueError:  # "nan" strings, booleans, text: decode one by one as every reader does
            decoded = [_decode(r) for r in raw]
            keep = np.array([d is not None for d in decoded], dtype=bool)
            line = line[keep]
            value = np.array([d for d in decoded if d is not None], dtype=np.float64)
        col.line.extend(line)
        col.value.extend(value)
        return True

    def time_of_lines(self, line: np.ndarray) -> np.ndarray:
        """Wall-clock time ``t`` of the given lines (nan where a line has none)."""
        t_line, t_value = self.raw_column("t")
        if len(t_line) == self.lines:
            return t_value[line]
        out = np.full(len(line), np.nan)
        pos = np.searchsorted(t_line, line)
        ok = pos < len(t_line)
        ok[ok] = t_line[pos[ok]] == line[ok]
        out[ok] = t_value[pos[ok]]
        return out


def _decode(raw: bytes) -> float | None:
    try:
        return decode_value(json.loads(raw))
    except ValueError:
        return None
