"""Columns of long runs kept on disk between dashboard runs, so a restarted ``mindwatch serve`` opens them at once.

Example::

    cache = ColumnCache()                      # $MINDWATCH_CACHE_DIR or ~/.cache/mindwatch/columns
    cols = RankColumns(path, cache=cache)      # continues from the cached state when it is still valid
    cols.from_cache                            # True when it did

Only files of at least ``min_lines`` lines are cached. A cache entry is used only when the file is
the same file (device and inode) and its first and last cached bytes are unchanged; anything else
(a rewritten, truncated or replaced file, a damaged entry) is ignored and the file read again.
The cache lives outside LOGDIR (the dashboard never writes into run directories); delete it at
any time. Entries beyond ``max_bytes`` in total are removed, oldest first.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any, Protocol

import numpy as np

log = logging.getLogger("mindwatch.store")


class CachedColumns(Protocol):
    """What the cache keeps of :class:`mindwatch.store.columns.RankColumns` (which uses this cache, so is not imported)."""

    @property
    def path(self) -> Path: ...

    def snapshot(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]: ...

    def restore(self, state: dict[str, Any], arrays: dict[str, np.ndarray]) -> None: ...


_VERSION = 1
_PROBE = 4096  # bytes hashed at the start of the file and before the cached offset


def default_cache_dir() -> Path:
    if env := os.environ.get("MINDWATCH_CACHE_DIR"):
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mindwatch" / "columns"


class ColumnCache:
    """A directory of ``.npz`` snapshots of :class:`~mindwatch.store.columns.RankColumns`, one per metrics file."""

    def __init__(self, directory: Path | None = None, min_lines: int = 200_000, max_bytes: int = 4 << 30) -> None:
        self.directory = Path(directory) if directory else default_cache_dir()
        self.min_lines = min_lines
        self.max_bytes = max_bytes
        self._warned = False
        self._lock = threading.Lock()
        self._writing: set[Path] = set()
        self._threads: list[threading.Thread] = []

    def worth_saving(self, saved_work: int, work: int) -> bool:
        """Save when there are enough lines and the parsed work grew by half since the last save."""
        return work >= self.min_lines and work - saved_work >= max(self.min_lines // 2, saved_work // 2)

    def _entry(self, path: Path) -> Path:
        key = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:24]
        return self.directory / f"{key}.npz"

    @staticmethod
    def _identity(path: Path, offset: int) -> dict[str, Any] | None:
        try:
            st = path.stat()
            with open(path, "rb") as f:
                head = f.read(_PROBE)
                f.seek(max(0, offset - _PROBE))
                tail = f.read(min(offset, _PROBE))
        except OSError:
            return None
        return {
            "dev": st.st_dev,
            "ino": st.st_ino,
            "size": st.st_size,
            "head": hashlib.sha1(head).hexdigest(),
            "tail": hashlib.sha1(tail).hexdigest(),
        }

    def load(self, cols: CachedColumns) -> bool:
        """Restore ``cols`` from its cache entry when the entry matches the file; False otherwise."""
        entry = self._entry(cols.path)
        if not entry.exists():
            return False
        try:
            with np.load(entry, allow_pickle=False) as data:
                state = json.loads(bytes(data["state"]).decode())
                if state.get("version") != _VERSION or state.get("path") != str(cols.path.resolve()):
                    return False
                now = self._identity(cols.path, state["offset"])
                then = state["identity"]
                if now is None or now["size"] < state["offset"] or any(now[k] != then[k] for k in ("dev", "ino", "head", "tail")):
                    return False
                cols.restore(state, {k: data[k] for k in data.files if k != "state"})
        except Exception as e:  # a damaged entry is a cache miss, never an error
            log.info("mindwatch serve: ignoring column cache %s (%s)", entry, e)
            return False
        with contextlib.suppress(OSError):
            os.utime(entry)  # recently used: kept longest
        return True

    def save(self, cols: CachedColumns, wait: bool = False) -> None:
        """Write ``cols``' state in a background thread (the query that triggered it does not wait)."""
        state, arrays = cols.snapshot()  # views of the arrays read so far: appends never change them
        identity = self._identity(cols.path, state["offset"])
        if identity is None:
            return
        state.update(version=_VERSION, path=str(cols.path.resolve()), identity=identity)
        entry = self._entry(cols.path)
        with self._lock:
            if entry in self._writing:
                return  # the next save will have everything
            self._writing.add(entry)
        writer = threading.Thread(target=self._write, args=(entry, state, arrays), name="mindwatch-column-cache", daemon=True)
        self._threads = [t for t in self._threads if t.is_alive()] + [writer]
        writer.start()
        if wait:
            writer.join()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the writes in progress (tests, shutdown)."""
        for t in list(self._threads):
            t.join(timeout)

    def _write(self, entry: Path, state: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        """A failure (read-only home, full disk) is logged once and ignored."""
        tmp = entry.with_name(f".{entry.stem}.{os.getpid()}.{threading.get_ident()}.tmp.npz")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            np.savez(tmp, state=np.frombuffer(json.dumps(state).encode(), np.uint8), **arrays)
            os.replace(tmp, entry)
            self._trim()
        except Exception as e:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            if not self._warned:
                self._warned = True
                log.warning("mindwatch serve: cannot write the column cache in %s (%s); long runs open slower", self.directory, e)
        finally:
            with self._lock:
                self._writing.discard(entry)

    def _trim(self) -> None:
        entries = sorted(self.directory.glob("*.npz"), key=lambda p: p.stat().st_mtime, reverse=True)
        total = 0
        for p in entries:
            total += p.stat().st_size
            if total > self.max_bytes:
                p.unlink(missing_ok=True)
