"""Per-layer statistics of a rank: ``layers.rank<R>/``, binary rows beside the JSONL, one row per recorded layer step.

Example::

    # the writer side: RunWriter.set_layers(names) once, then records carrying LAYER_KEY
    rec = {"step": 120, "t": t, "loss": 2.3, LAYER_KEY: LayerRow(names, stats)}   # stats: float32 (3, layers)

    files = LayerFiles(run_dir / "layers.rank0")
    files.metrics                       # ['grad_norm/blocks.0.attn.qkv', 'update_ratio/...', ...]
    line, value = files.column("grad_norm/blocks.0.attn.qkv")

100 layers x 3 statistics would multiply the size of every JSONL line, so they live here instead:

- ``layers.json``: ``{"format": "mindwatch.layers", "stats": [...], "layers": [...]}``;
- ``lines.i64``: for each row, the JSONL line (counting lines with an integer step, as every reader
  does) of the record of the same step, so a row has that record's step and time;
- ``values.f32``: the rows, float32 little-endian, row-major ``(rows, stats x layers)``: for each
  statistic in ``stats`` order, one value per layer in ``layers`` order (NaN and Inf as they are);
- ``histograms.f32`` and ``histogram_lines.i64`` (when ``layers.histogram_every`` is on): rows of
  ``(2, layers, bins + 1)`` float32, weights then gradients, per layer the counts of ``bins`` equal bins
  over ``[-top, top]`` and last ``top = max|x|``, and the JSONL line of each row.

Any tool reads them with ``numpy.fromfile(dir / "values.f32", "<f4").reshape(-1, len(stats) * len(layers))``.
Files only grow; a row torn by a crash (a short last row) is ignored, and so is a row whose line is not
in the JSONL.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mindwatch import metrics as vocab
from mindwatch.store.layout import read_json, write_json_atomic

log = logging.getLogger("mindwatch")

FORMAT = "mindwatch.layers"
#: The statistics a layer row may hold, in order (docs/run-directory.md): a row without an Adam-family optimizer
#: holds the first three (:func:`row_stats`).
LAYER_STATS: tuple[str, ...] = vocab.layer_stat_names()


def row_stats(moments: bool) -> tuple[str, ...]:
    """The statistics of a row: the measured ones, and with ``moments`` the optimizer's (``adam_m_norm``, ...)."""
    return vocab.layer_stat_names(moments)


#: The record key that carries a step's :class:`LayerRow` to the writer and the rules.
LAYER_KEY = "layer_stats"
#: The record key that carries a step's :class:`LayerHistograms` to the writer and the TensorBoard sink.
HISTOGRAM_KEY = "layer_histograms"
#: Bins of the per-layer histograms (over ``[-max|x|, max|x|]`` of each layer).
HISTOGRAM_BINS = 32


@dataclass(frozen=True)
class LayerRow:
    """One step's per-layer statistics: ``stats[i, j]`` is statistic ``names[i]`` of ``layers[j]``; without ``names``,
    the first ``len(stats)`` of ``LAYER_STATS``. A row holds only what the training measures (MindFormers' ``local_norm``:
    the gradient norms alone)."""

    layers: tuple[str, ...]
    stats: np.ndarray
    names: tuple[str, ...] = ()
    #: The gradient norms are this rank's own, before the all-reduce (MindFormers' ``local_norm`` in a multi-rank run):
    #: recorded and drawn per rank, judged by no per-layer rule (one rank's batch is not the training's).
    local: bool = False
    #: The optimizer's moments are a baseline yet (``v`` grows from 0 for about ``1 / (1 - beta2)`` steps): until then no
    #: rule judges them (they are recorded all the same).
    moments_settled: bool = True

    @property
    def stat_names(self) -> tuple[str, ...]:
        """The statistics the row holds, in row order."""
        return self.names or LAYER_STATS[: len(self.stats)]

    def has(self, stat: str) -> bool:
        """Whether the row holds ``stat`` (the optimizer's moments need an Adam-family optimizer)."""
        return stat in self.stat_names

    def values(self, stat: str) -> np.ndarray:
        """One statistic of every layer, in ``layers`` order."""
        return self.stats[self.stat_names.index(stat)]


@dataclass(frozen=True)
class LayerHistograms:
    """One step's histograms: ``data[k, j]`` is, for ``k`` 0 (weights) or 1 (gradients) and layer ``j``, the counts of
    ``bins`` equal bins over ``[-top, top]`` followed by ``top = max|x|`` (so ``bins + 1`` values)."""

    layers: tuple[str, ...]
    data: np.ndarray

    @property
    def bins(self) -> int:
        return int(self.data.shape[-1]) - 1

    def histogram(self, kind: int, j: int) -> tuple[np.ndarray, np.ndarray]:
        """``(edges, counts)`` of ``kind`` (0 weights, 1 gradients) of layer ``j``, numpy.histogram's shape."""
        top = float(self.data[kind, j, -1])
        return np.linspace(-top, top, self.bins + 1), self.data[kind, j, :-1]


def is_layer_metric(name: str) -> bool:
    """Whether ``name`` is a per-layer statistic (``grad_norm/<layer>``, ...), not a metric of its own."""
    return vocab.is_layer_metric(name)


def layers_dir(metrics: Path) -> Path:
    """``.../metrics.rank0.jsonl`` -> ``.../layers.rank0``."""
    name = metrics.name.removeprefix("metrics.").removesuffix(".jsonl")
    return metrics.with_name(f"layers.{name}")


def layer_metrics(layers: list[str], stats: tuple[str, ...] | list[str] = LAYER_STATS) -> list[str]:
    """The metric names of the columns of a row, in row order: ``grad_norm/<layer>``, ...."""
    return [f"{stat}/{layer}" for stat in stats for layer in layers]


class LayerFilesWriter:
    """Appends layer rows for one rank (the worker thread). A failure is a warning, then no more rows."""

    def __init__(self, directory: Path, layers: list[str], bins: int = 0, stats: tuple[str, ...] | None = None) -> None:
        """``stats``: what each row holds (:func:`row_stats`; default: the measured statistics, no moments)."""
        self.dir = Path(directory)
        self.layers = list(layers)
        self.bins = bins
        self.stats = list(stats if stats is not None else row_stats(False))
        self.width = len(self.stats) * len(self.layers)
        self.hist_width = 2 * len(self.layers) * (bins + 1)
        self.enabled = bool(self.layers)
        self._values: Any = None
        self._lines: Any = None
        self._hist: Any = None
        self._hist_lines: Any = None
        if not self.enabled:
            return
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            head = read_json(self.dir / "layers.json")
            wanted = {"format": FORMAT, "stats": self.stats, "layers": self.layers, "bins": self.bins}
            if head is None:
                write_json_atomic(self.dir / "layers.json", wanted)
            elif head != wanted:  # a resumed run whose model changed: these files describe the old layers
                self.stop("the run's layer files describe other layers (the model changed); not extending them")
                return
            self._trim()
            self._values = open(self.dir / "values.f32", "ab")  # noqa: SIM115 (kept open across writes)
            self._lines = open(self.dir / "lines.i64", "ab")  # noqa: SIM115
            if self.bins:
                self._hist = open(self.dir / "histograms.f32", "ab")  # noqa: SIM115
                self._hist_lines = open(self.dir / "histogram_lines.i64", "ab")  # noqa: SIM115
        except OSError as e:
            self.stop(f"cannot write {self.dir} ({e})")

    def _trim(self) -> None:
        """Drop what a crash left past the last whole row, so rows and lines stay in step."""
        for values, lines, width in (
            ("values.f32", "lines.i64", self.width),
            ("histograms.f32", "histogram_lines.i64", self.hist_width),
        ):
            rows = min(_size(self.dir / values) // (4 * width), _size(self.dir / lines) // 8) if width else 0
            for name, nbytes in ((values, 4 * width * rows), (lines, 8 * rows)):
                if (self.dir / name).exists():
                    os.truncate(self.dir / name, nbytes)

    def add(self, line: int, row: LayerRow) -> None:
        """One row: the statistics of the step recorded on JSONL line ``line``."""
        self._append(self._values, self._lines, self.width, row.stats, line, "layer row")

    def add_histograms(self, line: int, hist: LayerHistograms) -> None:
        """One step's histograms, of the step recorded on JSONL line ``line``."""
        if self._hist is not None:
            self._append(self._hist, self._hist_lines, self.hist_width, hist.data, line, "histogram row")

    def _append(self, values_file: Any, lines_file: Any, width: int, data: np.ndarray, line: int, what: str) -> None:
        if not self.enabled:
            return
        values = np.asarray(data, dtype="<f4").reshape(-1)
        if values.size != width:
            self.stop(f"a {what} has {values.size} values, not {width}")
            return
        try:
            values_file.write(values.tobytes())
            lines_file.write(np.asarray([line], "<i8").tobytes())
        except OSError as e:
            self.stop(f"cannot write {self.dir} ({e})")

    def _files(self) -> list[Any]:
        return [f for f in (self._values, self._lines, self._hist, self._hist_lines) if f is not None]

    def hand_over(self) -> None:
        """Hand the rows written so far to the OS (readers see them; no fsync)."""
        if not self.enabled:
            return
        try:
            for f in self._files():
                f.flush()
        except OSError as e:
            self.stop(f"cannot write {self.dir} ({e})")

    def flush(self) -> None:
        """Hand the rows to the OS and fsync them (every heartbeat)."""
        if not self.enabled:
            return
        try:
            for f in self._files():
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            self.stop(f"cannot write {self.dir} ({e})")

    def close(self) -> None:
        self.flush()
        for f in self._files():
            f.close()
        self._values = self._lines = self._hist = self._hist_lines = None
        self.enabled = False

    def stop(self, why: str) -> None:
        if self.enabled:
            log.warning("mindwatch: per-layer statistics stop: %s; training continues", why)
        self.enabled = False


class LayerFiles:
    """One rank's layer rows for reading, re-read as they grow (:meth:`refresh`)."""

    def __init__(self, directory: Path) -> None:
        self.dir = Path(directory)
        self.layers: list[str] = []
        self.stats: list[str] = []
        self.metrics: list[str] = []
        self._index: dict[str, int] = {}
        self.bins = 0
        self.lines = np.empty(0, np.int64)
        self.values = np.empty((0, 0), np.float32)
        self.hist_lines = np.empty(0, np.int64)
        self.hist = np.empty((0, 2, 0, 1), np.float32)
        self.refresh()

    def refresh(self) -> int:
        """Read rows appended since; returns how many."""
        if not self.layers:
            head = read_json(self.dir / "layers.json")
            if not head or head.get("format") != FORMAT:
                return 0
            self.layers, self.stats = [str(x) for x in head["layers"]], [str(x) for x in head["stats"]]
            self.bins = int(head.get("bins") or 0)
            self.metrics = layer_metrics(self.layers, self.stats)
            self._index = {m: i for i, m in enumerate(self.metrics)}
            self.values = np.empty((0, len(self.metrics)), np.float32)
            self.hist = np.empty((0, 2, len(self.layers), self.bins + 1), np.float32)
        if self.bins:
            self._refresh_histograms()
        have = len(self.lines)
        new = _read_rows(self.dir, "values.f32", "lines.i64", len(self.metrics), have)
        if new is None:
            return 0
        self.lines = np.concatenate([self.lines, new[0]])
        self.values = np.concatenate([self.values, new[1].reshape(-1, len(self.metrics))])
        return len(self.lines) - have

    def _refresh_histograms(self) -> None:
        new = _read_rows(
            self.dir, "histograms.f32", "histogram_lines.i64", 2 * len(self.layers) * (self.bins + 1), len(self.hist_lines)
        )
        if new is not None:
            self.hist_lines = np.concatenate([self.hist_lines, new[0]])
            self.hist = np.concatenate([self.hist, new[1].reshape(-1, 2, len(self.layers), self.bins + 1)])

    def column(self, metric: str, lines_known: int | None = None) -> tuple[np.ndarray, np.ndarray] | None:
        """(JSONL line numbers, float64 values) of one layer metric, rows in file order; None when not a layer metric.

        ``lines_known``: rows whose line the reader has not read (yet) are left out.
        """
        j = self._index.get(metric)
        if j is None:
            return None
        lines, values = self.lines, self.values[:, j].astype(np.float64)
        if lines_known is not None:
            keep = lines < lines_known
            lines, values = lines[keep], values[keep]
        return lines, values


def _read_rows(directory: Path, values: str, lines: str, width: int, have: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The whole rows past the first ``have`` of a (values, lines) pair of files, or None when there are none."""
    rows = min(_size(directory / values) // (4 * width), _size(directory / lines) // 8) if width else 0
    if rows <= have:
        return None
    try:
        line = np.fromfile(directory / lines, "<i8", count=rows - have, offset=8 * have)
        data = np.fromfile(directory / values, "<f4", count=(rows - have) * width, offset=4 * width * have)
    except OSError:
        return None
    return line, data


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
