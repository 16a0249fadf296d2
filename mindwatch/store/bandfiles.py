"""Band files: rank 0's per-step summary of a metric across all ranks, so a reader of a 1,000-rank run
reads one small file instead of every rank's columns.

Example::

    writer = BandFileWriter(RunLayout(run_dir))
    writer.append("data_time", rows)             # rows: a BAND_DTYPE array, one row per step every rank recorded
    rows = read_band_file(RunLayout(run_dir), "data_time")   # None when the run has none
    rows["step"], rows["min"], rows["mean"], rows["max"], rows["argmax"], rows["count"]

``bands/<metric>.band`` holds fixed-size little-endian rows (:data:`BAND_DTYPE`), appended by rank 0's
worker thread (the cross-rank watch), which joins every rank's records by step anyway, or, for the step and
data time of a run whose ranks keep their files on their own hosts, takes them from the train step's collective
signal. A reader takes the whole rows only (a torn last row is read again later). Rows cover the steps that
every rank recorded, in the order they completed; the newest steps follow within ``poll_secs``.
"""

from __future__ import annotations

import logging
import os
import re

import numpy as np

from mindwatch.store.layout import RunLayout

log = logging.getLogger("mindwatch")

#: One row per step: the step, min / mean / max over the ranks' finite values, which rank had the min /
#: max, and how many ranks had a finite value.
BAND_DTYPE = np.dtype(
    [("step", "<i8"), ("min", "<f8"), ("mean", "<f8"), ("max", "<f8"), ("argmin", "<i4"), ("argmax", "<i4"), ("count", "<i4")]
)

_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def band_path(layout: RunLayout, metric: str) -> os.PathLike[str]:
    return layout.root / "bands" / f"{_SAFE.sub('_', metric)}.band"


class BandFileWriter:
    """Appends band rows per metric (one writer: rank 0's worker thread). A failing disk is a warning."""

    def __init__(self, layout: RunLayout) -> None:
        self.layout = layout
        self.rows_written = 0
        self._warned = False

    def append(self, metric: str, rows: np.ndarray) -> None:
        if not len(rows):
            return
        path = band_path(self.layout, metric)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "ab") as f:
                f.write(np.ascontiguousarray(rows, BAND_DTYPE).tobytes())
            self.rows_written += len(rows)
        except OSError as e:
            if not self._warned:
                self._warned = True
                log.warning("mindwatch: cannot write the band file %s (%s); the dashboard computes bands itself", path, e)


def read_band_file(layout: RunLayout, metric: str) -> np.ndarray | None:
    """The complete rows of ``metric``'s band file, sorted by step; None when there is none."""
    try:
        with open(band_path(layout, metric), "rb") as f:
            data = f.read()
    except OSError:
        return None
    whole = len(data) // BAND_DTYPE.itemsize * BAND_DTYPE.itemsize
    rows = np.frombuffer(data[:whole], BAND_DTYPE)
    if len(rows) > 1 and not (np.diff(rows["step"]) > 0).all():
        rows = rows[np.argsort(rows["step"], kind="stable")]
    return rows


def band_rows(steps: list[int], ranks: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Rows for ``values`` (steps x ranks, NaN where a rank had no value) with rank numbers ``ranks``."""
    n = len(steps)
    rows = np.zeros(n, BAND_DTYPE)
    rows["step"] = steps
    finite = np.isfinite(values)
    count = finite.sum(axis=1)
    rows["count"] = count
    with np.errstate(invalid="ignore", divide="ignore"):
        lo = np.where(finite, values, np.inf)
        hi = np.where(finite, values, -np.inf)
        rows["min"] = np.where(count > 0, lo.min(axis=1), np.nan)
        rows["max"] = np.where(count > 0, hi.max(axis=1), np.nan)
        rows["mean"] = np.where(count > 0, np.where(finite, values, 0.0).sum(axis=1) / count, np.nan)
    rows["argmin"] = np.where(count > 0, ranks[lo.argmin(axis=1)], -1)
    rows["argmax"] = np.where(count > 0, ranks[hi.argmax(axis=1)], -1)
    return rows
