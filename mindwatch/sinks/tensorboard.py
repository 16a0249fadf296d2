"""TensorBoard event files from mindwatch records: live (a sink) or from an existing run (export).

Example::

    # live: switched on by ``backend: tensorboard`` or ``tensorboard: true`` in monitor_config
    #   -> <run_dir>/tensorboard/rank<R>/events.out.tfevents.*
    # afterwards, for a run recorded without it:
    from mindwatch.sinks.tensorboard import export_tensorboard
    export_tensorboard("monitor_output/gpt/run_20261129_074500")   # -> .../tensorboard
    # then: tensorboard --logdir monitor_output/gpt/run_20261129_074500/tensorboard

Every metric keeps its run-directory name as the TensorBoard tag (``loss``, ``lr``,
``grad_norm``, ``attention_entropy/<layer>``...), at the record's step and wall time. An evaluation's results
(``eval/loss``, ``eval/accuracy``, ``eval/perplexity``: TensorBoard's ``eval`` section) are one point per evaluation at
the step it ran after, with ``eval_time`` and ``eval_samples`` (and its record's ``epoch``, as the run directory holds it).
TensorBoard stores scalars as float32, so a value reads back as ``numpy.float32(value)``.
Alerts become text entries under the tag ``alerts``. Per-layer statistics (docs/layers.md) are scalars
``grad_norm/<layer>``, ...; the layers' histograms are histogram events ``weights/<layer>`` and ``grads/<layer>``.

The writer is our own: one event per record holding all its scalars, the protobuf encoded by
hand (a few fields) and framed as a TFRecord with masked CRC-32C. It needs no package and costs
a fraction of tensorboardX's ``add_scalar`` per value (``python -m bench sinks`` prints both).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from mindwatch.store.columns import RankColumns
from mindwatch.store.jsonl import metric_values
from mindwatch.store.layerfiles import HISTOGRAM_KEY, LAYER_KEY, LayerHistograms, LayerRow, is_layer_metric
from mindwatch.store.layout import RunLayout
from mindwatch.store.reader import JsonlTail
from mindwatch.store.sink import BaseSink

log = logging.getLogger("mindwatch")

#: The tag alerts are written under (text plugin).
ALERT_TAG = "alerts"


# -- CRC-32C (Castagnoli), as TFRecord framing needs it --------------------------------------
def _crc_table() -> tuple[int, ...]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return tuple(table)


_TABLE = _crc_table()


def _crc32c_python(data: bytes) -> int:
    crc, table = 0xFFFFFFFF, _TABLE
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


_crc32c: Callable[[bytes], int] = _crc32c_python
try:  # a native implementation when one is installed (the `crc32c` package); same result
    from crc32c import crc32c as _native_crc32c

    _crc32c = _native_crc32c
except ImportError:
    pass


def _masked_crc(data: bytes) -> int:
    x = _crc32c(data)
    return (((x >> 15) | (x << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _frame(data: bytes) -> bytes:
    """One TFRecord: length, its masked CRC, the data, its masked CRC."""
    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", _masked_crc(header)) + data + struct.pack("<I", _masked_crc(data))


# -- the few protobuf fields of tensorflow.Event we write -------------------------------------
_SMALL = [bytes((i,)) for i in range(0x80)]


def _varint(n: int) -> bytes:
    if 0 <= n < 0x80:
        return _SMALL[n]
    n &= (1 << 64) - 1  # int64 two's complement, as protobuf encodes negative numbers
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (strings, bytes, sub-messages)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _event(wall_time: float, step: int, body: bytes) -> bytes:
    # Event: wall_time (1, double), step (2, int64), then file_version (3) or summary (5)
    return b"\x09" + struct.pack("<d", wall_time) + b"\x10" + _varint(step) + body


_FLOAT32_MAX = 3.4028234663852886e38


_HEADS: dict[str, bytes] = {}


def _scalar_value(tag: str, value: float) -> bytes:
    # Summary.Value: tag (1), simple_value (2, float32: beyond its range a value is stored as +-inf)
    if abs(value) > _FLOAT32_MAX:
        value = math.copysign(math.inf, value)
    head = _HEADS.get(tag)
    if head is None:  # the encoded tag and lengths, once per metric name
        tag_field = _field(1, tag.encode("utf-8"))
        head = b"\x0a" + _varint(len(tag_field) + 5) + tag_field + b"\x15"
        if len(_HEADS) < 10_000:
            _HEADS[tag] = head
    return head + struct.pack("<f", value)


#: SummaryMetadata{plugin_data: {plugin_name: "text"}}, so TensorBoard's Text tab shows the entry.
_TEXT_METADATA = _field(9, _field(1, _field(1, b"text")))


def _text_value(tag: str, text: str) -> bytes:
    # Summary.Value: tag (1), metadata (9), tensor (8) = TensorProto{dtype: DT_STRING (7), shape: scalar, string_val}
    tensor = b"\x08\x07" + _field(2, b"") + _field(8, text.encode("utf-8"))
    return _field(1, _field(1, tag.encode("utf-8")) + _TEXT_METADATA + _field(8, tensor))


def _double(number: int, value: float) -> bytes:
    return _varint(number << 3 | 1) + struct.pack("<d", value)


def _histogram_value(tag: str, edges: np.ndarray, counts: np.ndarray) -> bytes:
    # Summary.Value: tag (1), histo (5) = HistogramProto{min 1, max 2, num 3, sum 4, sum_squares 5,
    # bucket_limit 6 (packed doubles: each bucket's right edge), bucket 7 (packed doubles: its count)}
    centers = (edges[:-1] + edges[1:]) / 2  # the sums are of the bucket centres: the values themselves are gone
    filled = np.flatnonzero(counts)
    lo, hi = (float(edges[filled[0]]), float(edges[filled[-1] + 1])) if len(filled) else (0.0, 0.0)
    histo = (
        _double(1, lo)
        + _double(2, hi)
        + _double(3, float(counts.sum()))
        + _double(4, float((centers * counts).sum()))
        + _double(5, float((centers**2 * counts).sum()))
        + _field(6, np.asarray(edges[1:], "<f8").tobytes())
        + _field(7, np.asarray(counts, "<f8").tobytes())
    )
    return _field(1, _field(1, tag.encode("utf-8")) + _field(5, histo))


def _layer_values(record: dict[str, Any]) -> list[bytes]:
    """Scalars of the per-layer statistics and histograms of the layers' weights and gradients, when the record has them."""
    out = []
    row = record.get(LAYER_KEY)
    if isinstance(row, LayerRow):
        for stat in row.stat_names:
            out += [_scalar_value(f"{stat}/{layer}", float(v)) for layer, v in zip(row.layers, row.values(stat), strict=True)]
    hist = record.get(HISTOGRAM_KEY)
    if isinstance(hist, LayerHistograms):
        for kind, name in ((0, "weights"), (1, "grads")):
            for j, layer in enumerate(hist.layers):
                edges, counts = hist.histogram(kind, j)
                if np.isfinite(edges[-1]) and edges[-1] > 0:
                    out.append(_histogram_value(f"{name}/{layer}", edges, counts))
    return out


def scalars_event(record: dict[str, Any]) -> bytes | None:
    """One framed event holding every numeric metric of ``record`` (and its per-layer statistics and histograms);
    None when it has none (or no step)."""
    step = record.get("step")
    if not isinstance(step, int):
        return None
    values = [_scalar_value(key, v) for key, v in metric_values(record)]
    if LAYER_KEY in record or HISTOGRAM_KEY in record:
        values += _layer_values(record)
    if not values:
        return None
    t = record.get("t")
    wall = float(t) if isinstance(t, (int, float)) else time.time()
    return _frame(_event(wall, step, _field(5, b"".join(values))))


def alert_event(alert: dict[str, Any]) -> bytes:
    """One framed text event for an alert (the alerts.jsonl contract), under the tag ``alerts``."""
    step = alert.get("step")
    t = alert.get("t")
    return _frame(
        _event(
            float(t) if isinstance(t, (int, float)) else time.time(),
            step if isinstance(step, int) else 0,
            _field(5, _text_value(ALERT_TAG, alert_markdown(alert))),
        )
    )


def alert_markdown(alert: dict[str, Any]) -> str:
    """The alert as one line of Markdown (TensorBoard's text tab renders Markdown)."""
    head = f"**{alert.get('severity', 'warning')}** `{alert.get('rule', 'alert')}`"
    detail = f"{alert.get('metric')} = {alert.get('value')} (threshold {alert.get('threshold')})" if alert.get("metric") else ""
    actions = alert.get("actions")
    acts = f"; actions: {', '.join(map(str, actions))}" if actions else ""
    message = alert.get("message") or ""
    return " ".join(p for p in (head, message, f"[{detail}]" if detail else "") if p) + acts


# -- the event file ------------------------------------------------------------------------------
class EventFile:
    """An append-only ``events.out.tfevents.*`` file in ``log_dir``.

    Example::

        f = EventFile(Path("tb/rank0"))
        f.append(scalars_event({"step": 1, "t": time.time(), "loss": 2.3}))
        f.close()
    """

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        now = time.time()
        name = f"events.out.tfevents.{int(now):010d}.{socket.gethostname()}.{os.getpid()}.mindwatch"
        self.path = self.log_dir / name
        self._fh: Any = open(self.path, "ab")  # noqa: SIM115 (kept open across writes)
        self.append(_frame(_event(now, 0, _field(3, b"brain.Event:2"))))

    def append(self, framed: bytes | None) -> None:
        if framed:
            self._fh.write(framed)

    def flush(self, durable: bool = False) -> None:
        self._fh.flush()
        if durable:
            os.fsync(self._fh.fileno())

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.flush(durable=True)
        self._fh.close()


class TensorBoardSink(BaseSink):
    """The live sink: records and alerts of one rank into ``<run_dir>/tensorboard/rank<R>/``.

    Example::

        sink = TensorBoardSink(RunLayout(run_dir).tensorboard(rank))
        Monitor([writer, sink]).start()

    Runs on the Monitor's worker thread; each batch is one write, handed to the OS at once
    (TensorBoard sees it on its next reload), and fsynced every ``flush_secs``.
    """

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = Path(log_dir)
        self._file: EventFile | None = None

    def _open(self) -> EventFile:
        if self._file is None:
            self._file = EventFile(self.log_dir)
        return self._file

    def write(self, records: list[dict[str, Any]]) -> None:
        f = self._open()
        for rec in records:
            f.append(scalars_event(rec))
        f.flush()

    def alert(self, alert: dict[str, Any]) -> None:
        f = self._open()
        f.append(alert_event(alert))
        f.flush()

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush(durable=True)

    def close(self, state: str, error: str | None = None, reason: str | None = None) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


# -- export of an existing run -------------------------------------------------------------------
def export_tensorboard(
    run_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str] | None = None, *, overwrite: bool = False
) -> Path:
    """Write TensorBoard event files for a recorded run; returns the log dir to give ``tensorboard --logdir``.

    Example::

        logdir = export_tensorboard("monitor_output/gpt/run_20261129_074500")
        # -> monitor_output/gpt/run_20261129_074500/tensorboard/rank0/events.out.tfevents.*

    ``out_dir`` defaults to the run's own ``tensorboard/`` folder. A rank folder that already
    holds event files (the live sink wrote them, or an earlier export) is an error unless
    ``overwrite=True``, which replaces them.
    """
    layout = RunLayout(Path(run_dir))
    if not layout.root.is_dir():
        raise FileNotFoundError(f"no run directory at {layout.root}")
    ranks = layout.ranks()
    if not ranks:
        raise FileNotFoundError(f"{layout.root} holds no metrics.rank<R>.jsonl: is it a mindwatch run directory?")
    out = Path(out_dir) if out_dir is not None else layout.root / "tensorboard"
    targets = {rank: out / f"rank{rank}" for rank in ranks}
    existing = [p for d in targets.values() if d.is_dir() for p in d.iterdir() if "tfevents" in p.name]
    if existing and not overwrite:
        raise FileExistsError(
            f"{existing[0].parent} already holds TensorBoard event files; pass overwrite=True "
            "(`--overwrite`) to replace them, or choose another output folder"
        )
    for p in existing:
        p.unlink()
    alerts = JsonlTail(layout.alerts).read_new()
    for rank, target in targets.items():
        f = EventFile(target)
        try:
            for rec in _records(layout.metrics(rank)):
                f.append(scalars_event(rec))
            for rec in _layer_records(layout.metrics(rank)):
                f.append(scalars_event(rec))
            for a in alerts:
                if a.get("rank", 0) == rank:
                    f.append(alert_event(a))
        finally:
            f.close()
    return out


def _layer_records(metrics: Path) -> Iterator[dict[str, Any]]:
    """The rank's per-layer statistics and histograms (``layers.rank<R>/``) as records of their steps."""
    cols = RankColumns(metrics)
    cols.refresh()
    by_step: dict[int, dict[str, Any]] = {}
    names = cols.layer_metrics
    if names:
        stat_names = tuple(dict.fromkeys(m.partition("/")[0] for m in names))  # the files' stats, in row order
        layers = tuple(m.partition("/")[2] for m in names if m.startswith(f"{stat_names[0]}/"))
        columns = [cols.column(m) for m in names]
        lines = columns[0][0]
        stats = np.stack([v for _, v in columns]).reshape(len(stat_names), len(layers), -1)
        for k, ln in enumerate(lines.tolist()):
            rec = by_step.setdefault(int(cols.steps[ln]), {"t": float(cols.time_of_lines(lines[k : k + 1])[0])})
            rec[LAYER_KEY] = LayerRow(layers, stats[:, :, k], stat_names)
    steps, hist = cols.layer_histograms()
    if hist is not None:
        for k, step in enumerate(steps.tolist()):
            by_step.setdefault(int(step), {})[HISTOGRAM_KEY] = LayerHistograms(hist.layers, hist.data[k])
    for step in sorted(by_step):
        yield {"step": step, **by_step[step]}


def _records(metrics: Path) -> Iterator[dict[str, Any]]:
    """The rank's records as written; after a rewind (a resumed attempt wrote steps again), each step once, newest values."""
    cols = RankColumns(metrics)
    cols.refresh()
    if not cols.rewound:
        yield from JsonlTail(metrics).read_new()
        return
    columns = {name: cols.column(name) for name in sorted(cols.keys) if not is_layer_metric(name)}  # layers: below
    rows: dict[int, dict[str, Any]] = {}
    for name, (line, value) in columns.items():
        for ln, v in zip(line.tolist(), value.tolist(), strict=True):
            rows.setdefault(ln, {})[name] = v
    lines = np.array(sorted(rows, key=lambda ln: (int(cols.steps[ln]), ln)), dtype=np.int64)
    times = cols.time_of_lines(lines)
    for ln, t in zip(lines.tolist(), times.tolist(), strict=True):
        yield {"step": int(cols.steps[ln]), **({"t": t} if t == t else {}), **rows[ln]}
