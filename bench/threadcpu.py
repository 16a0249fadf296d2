"""CPU time of every thread of this process, read from ``/proc``, with Python's thread names.

Example::

    before = snapshot()
    ...                                       # the work to account for
    cpu = by_group(before, snapshot(), training=threading.main_thread().native_id)
    cpu["mindwatch"]                          # seconds of CPU the threads named mindwatch* spent

``/proc/self/task/<tid>/schedstat`` gives nanoseconds (``stat``'s utime+stime, in clock ticks,
where it is missing). Python threads are matched to OS threads by ``Thread.native_id``; the
others (MindSpore's runtime and kernel threads, dataset workers) keep their OS name.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

_TASKS = Path("/proc/self/task")
_TICK = 1.0 / os.sysconf("SC_CLK_TCK")

#: tid -> (name, CPU seconds)
Snapshot = dict[int, tuple[str, float]]


def _cpu(task: Path) -> float:
    try:
        return int((task / "schedstat").read_text().split()[0]) / 1e9
    except (OSError, IndexError, ValueError):
        fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) * _TICK  # utime, stime


def snapshot() -> Snapshot:
    """Every live thread's name and CPU seconds so far."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: Snapshot = {}
    for task in _TASKS.iterdir():
        tid = int(task.name)
        try:
            name = names.get(tid) or (task / "comm").read_text().strip()
            out[tid] = (name, _cpu(task))
        except OSError:  # the thread ended meanwhile
            continue
    return out


def by_thread(before: Snapshot, after: Snapshot) -> dict[int, tuple[str, float]]:
    """CPU seconds each thread alive at ``after`` spent since ``before`` (all of it for a thread started since)."""
    return {tid: (name, cpu - before.get(tid, (name, 0.0))[1]) for tid, (name, cpu) in after.items()}


def by_group(before: Snapshot, after: Snapshot, *, training: int) -> dict[str, float]:
    """CPU seconds of the ``training`` thread (an OS tid), of mindwatch's threads and of all the others."""
    groups = {"training": 0.0, "mindwatch": 0.0, "other": 0.0}
    for tid, (name, cpu) in by_thread(before, after).items():
        group = "training" if tid == training else "mindwatch" if name.startswith("mindwatch") else "other"
        groups[group] += cpu
    return groups
