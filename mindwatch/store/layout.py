"""Where things live in a run directory (the run-directory contract in docs/architecture.md).

Example::

    from mindwatch.store.layout import RunLayout
    layout = RunLayout(Path("monitor_output/gpt/run_20261129_074500"))
    layout.metrics(0)   # .../metrics.rank0.jsonl

    # one run whose ranks are spread over several folders (a multi-node job without a shared file system)
    layout = RunLayout(Path("node0/gpt/run_1"), also=(Path("node1/gpt/run_1"),))
    layout.metrics(1)   # node1/gpt/run_1/metrics.rank1.jsonl
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_RANK_FILE = re.compile(r"^(metrics|status)\.rank(\d+)\.(jsonl|json)$")


@dataclass(frozen=True)
class RunLayout:
    """Paths of one run directory; with ``also``, the other folders that hold more ranks of the same run (each node's
    ``save_dir`` without a shared file system). A rank's files are read from the folder that has them; the writer
    writes into ``root`` only."""

    root: Path
    also: tuple[Path, ...] = ()

    @property
    def roots(self) -> tuple[Path, ...]:
        return (self.root, *self.also)

    @property
    def meta(self) -> Path:
        """Rank 0's meta.json: in ``root``, or in the folder of ``also`` that has it."""
        return self._where("meta.json")

    @property
    def notes(self) -> Path:
        """A person's display name and note for the run (:mod:`mindwatch.store.notes`)."""
        return self._where("notes.json")

    @property
    def alerts(self) -> Path:
        return self.root / "alerts.jsonl"

    @property
    def alert_files(self) -> tuple[Path, ...]:
        """Every folder's alerts.jsonl (each node's ranks append to their own)."""
        return tuple(r / "alerts.jsonl" for r in self.roots)

    def _where(self, name: str) -> Path:
        for r in self.also:
            if not (self.root / name).exists() and (r / name).exists():
                return r / name
        return self.root / name

    @property
    def stacks(self) -> Path:
        return self.root / "stacks"

    @property
    def profiles(self) -> Path:
        """The ``profile`` action's profiles: ``step_<S>/rank<R>/`` each (:mod:`mindwatch.store.profiles`)."""
        return self.root / "profiles"

    @property
    def control(self) -> Path:
        """Coordinated actions of a multi-rank run: ``request.rank<R>.<n>.json`` files, rank 0's ``decisions.jsonl``."""
        return self.root / "control"

    @property
    def decisions(self) -> Path:
        return self.control / "decisions.jsonl"

    def request(self, rank: int, n: int) -> Path:
        return self.control / f"request.rank{rank}.{n}.json"

    def metrics(self, rank: int) -> Path:
        return self._where(f"metrics.rank{rank}.jsonl") if self.also else self.root / f"metrics.rank{rank}.jsonl"

    def status(self, rank: int) -> Path:
        return self._where(f"status.rank{rank}.json") if self.also else self.root / f"status.rank{rank}.json"

    def evaluation_tables(self, rank: int) -> Path:
        """An evaluation's results that are not scalars (a confusion matrix), one line per evaluation."""
        name = f"evaluations.rank{rank}.jsonl"
        return self._where(name) if self.also else self.root / name

    def tensorboard(self, rank: int) -> Path:
        return self.root / "tensorboard" / f"rank{rank}"

    def ranks(self) -> list[int]:
        """Ranks that wrote a metrics or status file, sorted."""
        found = set()
        for root in self.roots:
            if root.is_dir():
                for p in root.iterdir():
                    m = _RANK_FILE.match(p.name)
                    if m:
                        found.add(int(m.group(2)))
        return sorted(found)


def is_run_dir(path: Path) -> bool:
    """A directory holding a ``meta.json`` or any rank file."""
    layout = RunLayout(path)
    return path.is_dir() and (layout.meta.exists() or bool(layout.ranks()))


def new_run_id(parent: Path, run_name: str | None = None) -> str:
    """``run_name`` or ``run_YYYYMMDD_HHMMSS``, with ``_2``, ``_3``... when taken."""
    base = run_name or time.strftime("run_%Y%m%d_%H%M%S")
    if "/" in base or base in {".", ".."} or "\\" in base:
        raise ValueError(f"run_name {base!r} must be a plain directory name (no '/', '..')")
    candidate, n = base, 1
    while (parent / candidate).exists():
        n += 1
        candidate = f"{base}_{n}"
    return candidate


def fallback_run_id(run_name: str | None, rank: int) -> str:
    """The run id of a rank > 0 that could not learn rank 0's: a run of its own, stamped, so a rerun never appends
    to an old one (``gpt_20261202_061500_rank1``)."""
    return f"{run_name or 'run'}_{time.strftime('%Y%m%d_%H%M%S')}_rank{rank}"


def write_json_atomic(path: Path, obj: dict[str, Any], *, durable: bool = True) -> None:
    """Write ``obj`` as JSON to ``path`` via a temp file and rename, so a reader never sees half of it.

    ``durable=False`` skips the fsync: for a file rewritten every few seconds (the heartbeat), whose
    next version makes up for one lost to a machine crash.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, default=str)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object file, or None when it is missing, half-written or not an object."""
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


class JsonFile:
    """A JSON object file read again only when it changed (its inode, size or mtime): cheap to ask every poll.

    Example::

        status = JsonFile(layout.status(0))
        status.read()      # parsed once; later calls stat the file and return the same dict until it is rewritten
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.value: dict[str, Any] | None = None
        self._signature: tuple[int, int, int] | None = None

    def read(self) -> dict[str, Any] | None:
        """The file's object (see :func:`read_json`); the one read before while the file is unchanged."""
        try:
            st = os.stat(self.path)
        except OSError:
            self._signature, self.value = None, None
            return None
        signature = (st.st_ino, st.st_size, st.st_mtime_ns)
        if signature != self._signature:
            self.value = read_json(self.path)
            self._signature = signature if self.value is not None else None  # half-written: try again next time
        return self.value
