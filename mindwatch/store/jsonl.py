"""The JSONL line format of the run directory, shared by the writer and every reader, and a tail reader of such files.

Non-finite floats are stored as the JSON strings ``"nan"``, ``"inf"`` and ``"-inf"``
(plain JSON has no NaN); :func:`decode_value` turns them back into floats.
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: Keys of a metrics record that are coordinates, not metrics.
COORDINATES = ("step", "t", "rank")

_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def encode_line(record: dict[str, Any]) -> bytes:
    """One record as one JSON line (bytes, newline included)."""
    try:
        text = json.dumps(record, allow_nan=False, separators=(",", ":"))
    except (ValueError, TypeError):  # a NaN/Inf, or a value json cannot encode (numpy scalar, Tensor): rare, so walk only then
        text = json.dumps(_plain(record), allow_nan=False, separators=(",", ":"))
    return text.encode("utf-8") + b"\n"


def _plain(v: Any) -> Any:
    """``v`` with non-finite floats as strings and anything else json cannot encode as its float (or its text)."""
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, (str, int, type(None))):  # bool is an int
        return v
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    return encode_number(f)


def encode_number(f: float) -> float | str:
    """``f`` as the run store writes it: a finite float as it is, NaN/Inf as ``"nan"``, ``"inf"``, ``"-inf"``."""
    if math.isfinite(f):
        return f
    return nonfinite_text(f)


def nonfinite_text(f: float) -> str:
    """The one spelling of a non-finite value wherever mindwatch writes text: ``nan``, ``inf``, ``-inf`` (the run
    store's JSONL strings, the CSV of ``mindwatch export`` and of the dashboard's charts)."""
    return "nan" if math.isnan(f) else ("inf" if f > 0 else "-inf")


def decode_value(v: Any) -> float | None:
    """A stored metric value as a float (``"nan"`` -> nan), or None when it is not a number."""
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        return _NON_FINITE.get(v)
    return None


def decode_line(line: bytes | str) -> dict[str, Any] | None:
    """One stored line as a dict, or None for a torn or foreign line."""
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def last_record(data: bytes) -> dict[str, Any] | None:
    """The last line in ``data`` that is a record with an integer step (what every reader counts), decoded."""
    for line in reversed(data.splitlines()):
        rec = decode_line(line)
        if rec is not None and type(rec.get("step")) is int:
            return rec
    return None


def read_last_record(path: Path, end: int | None = None, max_bytes: int = 1 << 16) -> dict[str, Any] | None:
    """The :func:`last_record` of a JSONL file, reading only its last ``max_bytes`` before ``end`` (default: its size)."""
    try:
        with open(path, "rb") as f:
            stop = f.seek(0, os.SEEK_END) if end is None else end
            f.seek(max(0, stop - max_bytes))
            data = f.read(stop - max(0, stop - max_bytes))
    except OSError:
        return None
    return last_record(data)


def record_at(path: Path, step: int, max_bytes: int = 1 << 20) -> dict[str, Any] | None:
    """The record of ``step`` among the last ``max_bytes`` of a rank's metrics file (None: not there, or not yet)."""
    try:
        with open(path, "rb") as f:
            end = f.seek(0, os.SEEK_END)
            f.seek(max(0, end - max_bytes))
            data = f.read()
    except OSError:
        return None
    for line in reversed(data.splitlines()):
        rec = decode_line(line)
        if rec is not None and rec.get("step") == step:
            return rec
    return None


def metric_values(record: dict[str, Any]) -> Iterator[tuple[str, float]]:
    """``(name, value)`` of every metric in a record: coordinates skipped, values decoded, non-numbers dropped."""
    for key, raw in record.items():
        if key not in COORDINATES:
            v = decode_value(raw)
            if v is not None:
                yield key, v


class JsonlTail:
    """Incremental reader of an append-only JSONL file: each call returns only new complete lines."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.offset = 0
        self.bad_lines = 0

    def read_new(self, max_bytes: int | None = None) -> list[dict[str, Any]]:
        out = []
        for line in self.read_new_bytes(max_bytes).splitlines():
            if not line.strip():
                continue
            rec = decode_line(line)
            if rec is None:
                self.bad_lines += 1
            else:
                out.append(rec)
        return out

    def read_new_bytes(self, max_bytes: int | None = None) -> bytes:
        """The new complete lines as raw bytes (for readers that parse in bulk); advances the offset."""
        try:
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                if not stat.S_ISREG(st.st_mode):
                    return b""  # only regular files: a device or pipe would never end
                if st.st_size < self.offset:  # truncated or replaced: start over
                    self.offset = 0
                f.seek(self.offset)
                n = st.st_size - self.offset  # what exists now; later growth is the next call's
                data = f.read(min(n, max_bytes) if max_bytes else n)
        except FileNotFoundError:
            return b""
        end = data.rfind(b"\n")
        if end < 0:
            return b""  # nothing complete yet: a torn line stays for the next call
        self.offset += end + 1
        return data[: end + 1]
