"""The runs the dashboard can show: a catalog of run directories under LOGDIR, each read incrementally.

Example::

    catalog = Catalog(Path("monitor_output"))
    catalog.summaries()                 # one dict per run, for the runs page
    run = catalog.open("gpt/run_1")     # a RunView; raises NotFound for anything outside LOGDIR
    run.refresh()
    run.columns[0]                      # RankColumns of rank 0

Run ids are paths relative to LOGDIR ("<project>/<run>"). A run is only ever looked up in the
catalog built by :func:`mindwatch.store.catalog.find_runs` (which does not follow symlinked
directories), so no request can name a directory outside LOGDIR; files inside a run directory
are opened only when their real path is inside LOGDIR too.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from mindwatch.analysis.bands import Band, band_of_columns, band_of_rows
from mindwatch.analysis.state_text import state_sentence
from mindwatch.analysis.summary import listed
from mindwatch.store.bandfiles import band_path, read_band_file
from mindwatch.store.cache import ColumnCache
from mindwatch.store.catalog import RunHead, find_runs
from mindwatch.store.layout import read_json
from mindwatch.store.reader import Run
from mindwatch.store.states import FINAL_STATES


class NotFound(Exception):
    """The request names no run (or a path outside LOGDIR)."""


class BadRequest(ValueError):
    """A query value the API cannot use; the message says what to send instead."""


def check_run_id(run_id: str) -> str:
    """``run_id`` if it is a plain relative path; BadRequest for ``..``, absolute paths, backslashes, NUL."""
    if not run_id or len(run_id) > 1000:
        raise BadRequest("run id must be a path relative to LOGDIR, like 'project/run_20261129_074500'")
    if "\x00" in run_id or "\\" in run_id or run_id.startswith("/") or ":" in run_id.split("/")[0]:
        raise BadRequest(f"run id {run_id!r} must be relative to LOGDIR (no absolute paths, drive letters or backslashes)")
    parts = PurePosixPath(run_id).parts
    if any(p in ("..", ".") for p in run_id.split("/")) or not parts:
        raise BadRequest(f"run id {run_id!r} must not contain '.' or '..' segments")
    return "/".join(parts)


class RunView(Run):
    """One run directory under LOGDIR, read incrementally by the dashboard's threads (take ``lock``).

    A :class:`~mindwatch.store.reader.Run` whose files are read only when their real path is
    inside LOGDIR, named by its catalog id (``project/run``), and read at the first refresh.
    """

    def __init__(
        self,
        run_id: str,
        path: Path,
        root: Path | tuple[Path, ...],
        cache: ColumnCache | None = None,
        also: tuple[Path, ...] = (),
    ) -> None:
        self._run_id = run_id
        #: The log directories served: no file outside them is read.
        self.roots = root if isinstance(root, tuple) else (root,)
        self.lock = threading.Lock()  # refresh and queries run in worker threads
        super().__init__(path, also=also, cache=cache, read=False)

    @property
    def id(self) -> str:
        return self._run_id

    def readable(self, path: Path) -> bool:
        try:
            real = path.resolve()
            return any(real.is_relative_to(root) for root in self.roots)
        except OSError:
            return False

    def refresh(self) -> dict[int, int]:
        """Re-read meta and status files, read appended lines and alerts; returns new lines per rank."""
        with self.lock:
            seen = len(self.alerts)
            new = super().refresh()
            for seq in range(seen, len(self.alerts)):
                self.alerts[seq].setdefault("seq", seq)
            return new

    def band(self, metric: str, refresh: bool = True) -> Band:
        """``metric`` across ranks (:mod:`mindwatch.analysis.bands`): from the band rank 0 wrote while the run went
        (``bands/``, one small file) when it has one, else from every rank's columns."""
        found = self._band_file(metric)
        if found is not None:
            return found
        if refresh:
            self.refresh()
        with self.lock:
            return band_of_columns(metric, self.columns)

    def _band_file(self, metric: str) -> Band | None:
        if not self.readable(Path(band_path(self.layout, metric))):
            return None
        rows = read_band_file(self.layout, metric)
        if rows is None or not len(rows):
            return None
        world = (self.meta or read_json(self.layout.meta) or {}).get("world_size")
        ranks = list(range(int(world))) if isinstance(world, int) else list(range(int(rows["count"].max())))
        return band_of_rows(metric, rows, ranks)

    def status_summary(self, now: float | None = None) -> dict[str, Any]:
        """What the run page's banner needs: overall state, per-rank states, last step/time, error.

        Made from what the view holds (its last refresh): the same rules as the runs page, no file read.
        """
        now = now or time.time()
        summary = listed(self, now)
        beats = [s["updated_at"] for s in self.statuses.values() if isinstance(s.get("updated_at"), (int, float))]
        heartbeat_at, reason = (max(beats) if beats else None), summary.reason
        return {
            "state": summary.state,
            "ranks": {
                str(r): {"state": st, "last_step": self.statuses[r].get("last_step")}
                for r, st in sorted(self.states(now).items())
            },
            "last_step": summary.last_step,
            "last_time": summary.last_time,
            "heartbeat_at": heartbeat_at,
            "error": summary.error,
            "reason": reason,
            "now": now,
            "banner": state_sentence(
                summary.state,
                last_step=summary.last_step,
                now=now,
                error=summary.error,
                reason=reason,
                last_time=summary.last_time,
                heartbeat_at=heartbeat_at,
            ),
        }


def _files_signature(path: Path) -> tuple[Any, ...]:
    """Name, size and mtime of each file directly in a run directory: any write changes it."""
    try:
        with os.scandir(path) as entries:
            return tuple(sorted((e.name, st.st_size, st.st_mtime_ns) for e in entries if e.is_file() and (st := e.stat())))
    except OSError:
        return ()


def _resolved(logdirs: list[Path]) -> tuple[list[Path], tuple[Path, ...]]:
    """The folders that do not exist (yet), and the real path of each."""
    return [d for d in logdirs if not d.is_dir()], tuple(d.resolve() for d in logdirs)


class Catalog:
    """Run directories under ``logdir`` (re-scanned at most every ``rescan_secs``) and their open views.

    ``logdir`` may be several folders (each node's ``save_dir`` of a multi-node job without a shared file
    system): a run found under several of them at the same ``project/run`` is one run, its ranks read
    from the folder that holds them.

    ``missing_ok``: a folder that does not exist yet (a dashboard started before the training made its
    ``save_dir``) holds no run until it appears; :attr:`missing` names those still missing.
    """

    def __init__(
        self,
        logdir: Path | Sequence[Path],
        rescan_secs: float = 1.0,
        max_open: int = 64,
        cache: ColumnCache | None = None,
        *,
        missing_ok: bool = False,
    ) -> None:
        self.logdirs = [Path(logdir)] if isinstance(logdir, (str, Path)) else [Path(d) for d in logdir]
        self.logdir = self.logdirs[0]
        self.cache = cache
        for d in self.logdirs:
            if not d.is_dir() and (not missing_ok or d.exists()):
                raise FileNotFoundError(f"no log directory at {d}; pass the save_dir of your monitor_config")
        #: The folders not made yet (``missing_ok``), and every folder's real path.
        self.missing, self.roots = _resolved(self.logdirs)
        self._also: dict[str, tuple[Path, ...]] = {}
        self.rescan_secs = rescan_secs
        self.max_open = max_open
        self._paths: dict[str, Path] = {}
        self._scanned = 0.0
        self._views: OrderedDict[str, RunView] = OrderedDict()
        self._listings: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {}  # ended runs: (files signature, listing)
        self._heads: dict[str, RunHead] = {}  # each listed run's files, read again only when they change
        self._lock = threading.Lock()

    def run_ids(self, force: bool = False) -> dict[str, Path]:
        with self._lock:
            if force or time.monotonic() - self._scanned > self.rescan_secs:
                if self.missing:  # resolved again once one appears: a link on its path may have come with it
                    self.missing, self.roots = _resolved(self.logdirs)
                found: dict[str, list[Path]] = {}
                for logdir, root in zip(self.logdirs, self.roots, strict=True):
                    if logdir in self.missing:
                        continue
                    for p in find_runs(logdir):
                        rel = p.relative_to(logdir).as_posix() if p != logdir else p.resolve().name
                        if p.resolve().is_relative_to(root):
                            found.setdefault(rel, []).append(p)
                paths, also = {}, {}
                for rel, where in found.items():  # rank 0's folder (meta.json) first
                    where.sort(key=lambda p: not (p / "meta.json").exists())
                    paths[rel], also[rel] = where[0], tuple(where[1:])
                self._paths, self._also = paths, also
                self._scanned = time.monotonic()
            return dict(self._paths)

    @property
    def root(self) -> Path:
        return self.roots[0]

    def summaries(self, now: float | None = None) -> list[dict[str, Any]]:
        """One dict per run for the runs page (cheap: meta, status files, last records and alert count only).

        A run in a final state is listed again only when one of its files changed (a resume, a
        late alert): 5,000 ended runs cost a directory read each, not four files parsed. A live run's
        files are read again only when they change (:class:`~mindwatch.store.catalog.RunHead`).
        """
        out = []
        run_ids = self.run_ids()
        for gone in set(self._heads) - set(run_ids):
            del self._heads[gone]
        for run_id, path in run_ids.items():
            signature = tuple(_files_signature(p) for p in (path, *self._also.get(run_id, ())))
            cached = self._listings.get(run_id)
            if cached is not None and cached[0] == signature:
                out.append(cached[1])
                continue
            head = self._heads.get(run_id)
            if head is None or head.path != path:
                head = self._heads[run_id] = RunHead(path, self._also.get(run_id, ()))
            s = listed(head.refresh(), now).to_dict()
            s["id"] = run_id
            s.pop("path", None)  # the server's file system layout is not the client's business
            if s["state"] in FINAL_STATES:  # a live run's state moves with the clock (stalled, stale): no cache
                self._listings[run_id] = (signature, s)
            else:
                self._listings.pop(run_id, None)
            out.append(s)
        return out

    def open(self, run_id: str) -> RunView:
        run_id = check_run_id(run_id)
        path = self.run_ids().get(run_id) or self.run_ids(force=True).get(run_id)
        if path is None:
            raise NotFound(f"no run {run_id!r} under the log directory")
        with self._lock:
            view = self._views.get(run_id)
            if view is None:
                view = self._views[run_id] = RunView(run_id, path, self.roots, self.cache, self._also.get(run_id, ()))
                while len(self._views) > self.max_open:
                    self._views.popitem(last=False)
            self._views.move_to_end(run_id)
        return view
