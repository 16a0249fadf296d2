"""Append-only writer of one rank's files in a run directory.

Example::

    writer = RunWriter(run_dir, rank=0)
    writer.write([{"step": 1, "t": time.time(), "loss": 2.3}])
    writer.flush()                 # fsync + heartbeat; the Monitor calls it every flush_secs
    writer.close("finished")

Everything here runs on the monitor's worker thread. A failing disk is a warning
(rate-limited) and a count of lost records, never an exception.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from mindwatch.store.attempts import this_attempt
from mindwatch.store.best_eval import EvalBests, Mode
from mindwatch.store.best_loss import BestLoss
from mindwatch.store.columnfiles import ColumnFilesWriter
from mindwatch.store.columns import RankColumns
from mindwatch.store.jsonl import encode_line, encode_number
from mindwatch.store.layerfiles import HISTOGRAM_KEY, LAYER_KEY, LayerFilesWriter, layers_dir
from mindwatch.store.layout import RunLayout, read_json, write_json_atomic
from mindwatch.store.sink import BaseSink
from mindwatch.store.states import FINAL_STATES

log = logging.getLogger("mindwatch")

_LAYER_KEYS = (LAYER_KEY, HISTOGRAM_KEY)


class RunWriter(BaseSink):
    """Writes ``metrics.rank<R>.jsonl`` (and its column files), ``status.rank<R>.json``, appends to ``alerts.jsonl``."""

    def __init__(
        self,
        run_dir: Path,
        rank: int = 0,
        *,
        flush_secs: float = 2.0,
        column_files: bool = True,
        columns_every_secs: float = 0.0,
        attempt: int | None = None,
        eval_primary: str | None = None,
        eval_mode: Mode | None = None,
    ) -> None:
        """``columns_every_secs``: how often heartbeats also append to the column files (0: at every one).
        ``attempt``: the attempt of the run this process writes for (``meta.json``'s ``attempts``); once a later
        attempt takes the run over (a relaunch while this process lingers), it writes nothing more.
        ``eval_primary``, ``eval_mode``: the config's ``evaluation.primary`` and ``evaluation.mode``, which the status'
        ``best_eval`` follows (``store/best_eval.py``)."""
        self.layout = RunLayout(Path(run_dir))
        self.rank = rank
        self.attempt = attempt
        #: A later attempt of the run took it over: nothing more is written (see :meth:`check_superseded`).
        self.superseded_by: int | None = None
        #: Alerts written ahead of the worker's turn (:meth:`append_alert_now`): their turn writes no second line.
        self._written_early: list[dict[str, Any]] = []
        self.flush_secs = flush_secs
        self.state = "running"
        self.error: str | None = None
        self.reason: str | None = None
        self.last_step: int | None = None
        self.last_step_time: float | None = None
        #: The best loss of the line kept so far (``store/best_loss.py``): the runs page's "best loss" without a scan.
        self.best = BestLoss()
        #: The last loss written: the listing's final loss when the last record is an evaluation's (no loss).
        self.final_loss: Any = None
        #: Each evaluation metric's best so far (``store/best_eval.py``): the runs page's "best eval" without a scan.
        self.evals = EvalBests(eval_primary, eval_mode)
        self.records_written = 0
        self.records_lost = 0
        self.dropped = 0  # records the Monitor's full queue turned away (records_dropped)
        self._fh: Any = None
        self._unsynced = False  # records written to the OS since the last fsync
        self._last_warning = 0.0
        self.started_at = time.time()
        self.host = socket.gethostname()
        #: Rank 0 of a multi-rank run: ranks it saw die, ``{"1": {"pid", "host", "last_step", "how", "t"}}``.
        self.lost_ranks: dict[str, dict[str, Any]] = {}
        self.layout.root.mkdir(parents=True, exist_ok=True)
        self._end_torn_line()
        if self.layout.metrics(rank).exists():  # a resumed run: its earlier attempts' line, which this one may go back on
            written = RankColumns(self.layout.metrics(rank))
            written.refresh()
            self.best = BestLoss(_written_losses(written))
            self.evals = EvalBests.of_columns(written, eval_primary, eval_mode)
        self.columns = ColumnFilesWriter(self.layout.metrics(rank), enabled=column_files, every_secs=columns_every_secs)
        self.layers: LayerFilesWriter | None = None
        self._valid_lines: int | None = None  # lines with an integer step in the JSONL, once layer rows need it
        self.flush()

    def set_layers(self, names: list[str], bins: int = 0, stats: tuple[str, ...] | None = None) -> None:
        """Records may carry per-layer statistics of these layers (``LAYER_KEY``; ``stats``: what a row holds) and, with
        ``bins``, their histograms (``HISTOGRAM_KEY``): rows in ``layers.rank<R>/``."""
        self.layers = LayerFilesWriter(layers_dir(self.layout.metrics(self.rank)), names, bins, stats)

    # -- sink interface -------------------------------------------------
    def write(self, records: list[dict[str, Any]]) -> None:
        """Append records and hand them to the OS (readers see them at once)."""
        if not records or self.superseded_by is not None:
            return
        rows = [i for i, r in enumerate(records) if LAYER_KEY in r or HISTOGRAM_KEY in r] if self.layers is not None else []
        if rows:  # the statistics go to the layer files, not into the line; before the lines, so a reader has both
            self._add_layer_rows(records, rows)
            carry = set(rows)
            records = [{k: v for k, v in r.items() if k not in _LAYER_KEYS} if i in carry else r for i, r in enumerate(records)]
        elif self._valid_lines is not None:
            self._valid_lines += sum(type(r.get("step")) is int for r in records)
        data = b"".join(encode_line(r) for r in records)
        try:
            if self._fh is None:
                self._fh = open(self.layout.metrics(self.rank), "ab")  # noqa: SIM115 (kept open across writes)
            self._fh.write(data)
            self._fh.flush()
            self._unsynced = True
            self.records_written += len(records)
            self.columns.add(records, len(data))
        except OSError as e:
            self.records_lost += len(records)
            self._close_file()
            self.columns.stop("the metrics file could not be written")
            if self.layers is not None:
                self.layers.stop("the metrics file could not be written")
            self._warn(
                f"mindwatch: cannot write metrics to {self.layout.metrics(self.rank)} ({e}); "
                f"{self.records_lost} records lost so far, training continues"
            )
        for r in records:
            if "loss" in r and type(step := r.get("step")) is int:
                self.best.add(step, r["loss"])
                self.final_loss = r["loss"]
            self.evals.add(r)
        last = records[-1]
        self.last_step = last.get("step", self.last_step)
        self.last_step_time = last.get("t", self.last_step_time)

    def flush(self) -> None:
        """fsync what was written since the last flush, and rewrite the heartbeat (fsynced once the state is final)."""
        final = self.state in FINAL_STATES
        if self.check_superseded():
            return
        try:
            if self._fh is not None and self._unsynced:
                os.fsync(self._fh.fileno())
                self._unsynced = False
                if self.layers is not None:
                    self.layers.flush()
            if self._fh is not None:
                self.columns.flush(force=final)
            write_json_atomic(self.layout.status(self.rank), self.status(), durable=final)
        except OSError as e:
            self._close_file()
            self._warn(f"mindwatch: cannot write run files in {self.layout.root} ({e}); training continues")

    def write_status_now(self) -> None:
        """Rewrite the status file alone, now (no fsync of the metrics, no column files): what must be on disk before
        this process may be killed (a lost rank's ``lost_ranks``)."""
        if self.check_superseded():
            return
        try:
            write_json_atomic(self.layout.status(self.rank), self.status(), durable=False)
        except OSError as e:
            self._warn(f"mindwatch: cannot write the status in {self.layout.root} ({e}); training continues")

    def close(self, state: str = "finished", error: str | None = None, reason: str | None = None) -> None:
        self.state, self.error, self.reason = state, error, reason
        self.flush()
        self._close_file()
        if self.layers is not None:
            self.layers.close()

    def records_dropped(self, count: int) -> None:
        """The Monitor's count of records its full queue turned away (``records_dropped`` in the status file)."""
        self.dropped = count

    # -- alerts and status ----------------------------------------------
    def append_alert_now(self, alert: dict[str, Any]) -> None:
        """Append ``alert`` now, ahead of the sinks' turn on the worker (which then writes no second line): a rank seen
        to die, whose launcher may end this process a moment later."""
        self.append_alert(alert)
        self._written_early.append(alert)

    def append_alert(self, alert: dict[str, Any]) -> None:
        """Append one alert to ``alerts.jsonl`` (shared by all ranks; one small write each, O_APPEND)."""
        for i, early in enumerate(self._written_early):
            if early is alert:  # written already, by append_alert_now
                del self._written_early[i]
                return
        if self.superseded_by is not None:
            return
        try:
            with open(self.layout.alerts, "ab") as f:
                f.write(encode_line(alert))
        except OSError as e:
            self._warn(f"mindwatch: cannot write alert to {self.layout.alerts} ({e})")

    def check_superseded(self) -> bool:
        """Whether a later attempt of the run took it over: ``meta.json`` names a newer attempt, or another process
        of a newer attempt wrote this rank's status. Read at each heartbeat (two small files); once true, stays so."""
        if self.superseded_by is not None or self.attempt is None:
            return self.superseded_by is not None
        mine = read_json(self.layout.status(self.rank)) or {}
        newer = [mine.get("attempt")] if mine.get("pid") != os.getpid() else []
        if self.rank == 0 or not newer:  # rank 0 owns meta.json; other ranks see it where the folder is shared
            newer.append(this_attempt(read_json(self.layout.meta) or {}))
        latest = max((a for a in newer if isinstance(a, int)), default=0)
        if latest > self.attempt:
            self.superseded_by = latest
            self._close_file()
            log.warning(
                "mindwatch: attempt %d of %s took the run over (a relaunch); this process (attempt %d, rank %d) "
                "writes nothing more into it",
                latest,
                self.layout.root,
                self.attempt,
                self.rank,
            )
        return self.superseded_by is not None

    def status(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "attempt": self.attempt,
            "pid": os.getpid(),
            "host": self.host,
            "state": self.state,
            "last_step": self.last_step,
            "last_step_time": self.last_step_time,
            "best_loss": self.best.value,
            "final_loss": encode_number(v) if isinstance(v := self.final_loss, float) else v,
            "best_eval": best_eval.to_dict() if (best_eval := self.evals.best()) is not None else None,
            "updated_at": time.time(),
            "started_at": self.started_at,
            "heartbeat_secs": self.flush_secs,
            "records_written": self.records_written,
            "records_dropped": self.dropped,
            "records_lost": self.records_lost,
            "error": self.error,
            "reason": self.reason,
            **({"lost_ranks": self.lost_ranks} if self.lost_ranks else {}),
        }

    # -- internals ------------------------------------------------------
    def _add_layer_rows(self, records: list[dict[str, Any]], rows: list[int]) -> None:
        """Layer rows for ``records`` (about to be appended): ``rows`` are the indices of those that carry some."""
        assert self.layers is not None
        if self._valid_lines is None:  # the lines already in the JSONL (earlier attempts), counted as readers count them
            from mindwatch.store.columns import RankColumns

            cols = RankColumns(self.layout.metrics(self.rank))
            cols.refresh()
            self._valid_lines = cols.lines
        line_of = {}
        for i, rec in enumerate(records):
            if type(rec.get("step")) is int:
                line_of[i] = self._valid_lines
                self._valid_lines += 1
        for i in rows:
            if i not in line_of:
                continue
            if (stats := records[i].get(LAYER_KEY)) is not None:
                self.layers.add(line_of[i], stats)
            if (hist := records[i].get(HISTOGRAM_KEY)) is not None:
                self.layers.add_histograms(line_of[i], hist)
        self.layers.hand_over()

    def _end_torn_line(self) -> None:
        """A resumed run whose last writer was killed mid-line: end that line, so it does not swallow our first one."""
        path = self.layout.metrics(self.rank)
        try:
            with open(path, "rb") as f:
                f.seek(-1, os.SEEK_END)
                torn = f.read(1) != b"\n"
            if torn:
                with open(path, "ab") as f:
                    f.write(b"\n")
        except OSError:  # no file yet (or empty): nothing to end
            pass

    def _close_file(self) -> None:
        if self._fh is not None:
            with contextlib.suppress(OSError):
                self._fh.close()
            self._fh = None

    def _warn(self, msg: str) -> None:
        now = time.monotonic()
        if now - self._last_warning > 60:
            self._last_warning = now
            log.warning(msg)


def _written_losses(cols: RankColumns) -> Iterable[tuple[int, float]]:
    """Every ``(step, loss)`` earlier attempts wrote to the columns ``cols`` read, in the order written."""
    line, value = cols.raw_column("loss")
    return zip(cols.steps[line].tolist(), value.tolist(), strict=True)
