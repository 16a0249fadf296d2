"""System probes: the host's memory, read with psutil and the cgroup files (no MindSpore).

Example::

    from mindwatch.system import host_memory_sampler, host_memory_total_gb

    sample = host_memory_sampler()     # the Monitor's worker calls it at each heartbeat
    sample()                           # {"host_rss_gb": 1.23}
    host_memory_total_gb()             # what this process may use: the machine's or its cgroup's limit

Device memory needs the framework's allocator and lives in :mod:`mindwatch.mindspore.probes`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import psutil


def host_memory_sampler() -> Callable[[], dict[str, float]]:
    """Resident memory of this process, in GB (10^9 bytes)."""
    proc = psutil.Process()

    def sample() -> dict[str, float]:
        return {"host_rss_gb": proc.memory_info().rss / 1e9}

    return sample


def host_memory_total_gb() -> float:
    """Memory this process may use, in GB: the machine's, or the cgroup limit when lower (containers)."""
    total = psutil.virtual_memory().total
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total / 1e9
