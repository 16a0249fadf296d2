"""How the ranks of one launch agree on one run directory, without a collective and without a race.

Example::

    from mindwatch.store.rendezvous import agree_run_id

    run_id = agree_run_id(save_dir / project, rank=rank, key="127.0.0.1_8118_w2",
                          propose=lambda: new_run_id(save_dir / project))

Rank 0 picks the run id (``run_YYYYMMDD_HHMMSS``, suffixed when taken), creates the directory
and publishes the id in ``<project dir>/.rendezvous/<key>.json`` (tmp + rename). The other
ranks wait for that file (polling, up to ``timeout``) and join the directory it names.

``key`` is what every rank of one launch derives alike from the launcher's environment
(``MS_SCHED_HOST``/``MS_SCHED_PORT`` and the world size, see ``RankInfo.launch_key``). Two
launches with the same key cannot overlap (the scheduler port is bound while one runs), so a file
written before this process started belongs to an earlier launch and is ignored: rank 0 writes
its file only after ``mindspore.communication.init()``, which returns once every rank is running.

``MINDWATCH_RUN_ID`` in the environment (exported before ``msrun``) skips all this: every rank
uses that id as it is.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from mindwatch.store.attempts import next_attempt
from mindwatch.store.layout import read_json, write_json_atomic

log = logging.getLogger("mindwatch")

#: The environment variable that fixes the run id for every rank.
RUN_ID_ENV = "MINDWATCH_RUN_ID"
#: Clock tolerance between the process start and rank 0's rendezvous file (ranks on other hosts).
CLOCK_SLACK_SECS = 2.0


def launch_attempt(parent: Path, key: str | None, run_id: str) -> int | None:
    """The attempt number rank 0 published for the launch ``key`` into ``run_id`` (None: not known)."""
    found = read_json(rendezvous_path(parent, key)) if key else None
    attempt = (found or {}).get("attempt")
    return attempt if isinstance(attempt, int) and (found or {}).get("run_id") == run_id else None


class RendezvousTimeout(TimeoutError):
    """Rank 0 did not publish the run id in time."""


def rendezvous_path(parent: Path, key: str) -> Path:
    """Where rank 0 publishes the run id of the launch ``key``."""
    return Path(parent) / ".rendezvous" / f"{key}.json"


def agree_run_id(
    parent: Path,
    *,
    rank: int,
    key: str | None,
    propose: Callable[[], str],
    timeout: float = 300.0,
    poll_secs: float = 0.1,
    not_before: float | None = None,
) -> str:
    """The run id every rank of this launch uses; see the module docstring.

    ``key`` None (a single process) returns ``propose()``. Raises :class:`RendezvousTimeout`
    on a rank > 0 when rank 0's file did not appear within ``timeout`` seconds.
    """
    fixed = os.environ.get(RUN_ID_ENV)
    if fixed:
        return fixed
    if key is None:
        return propose()
    path = rendezvous_path(parent, key)
    if rank == 0:
        run_id = propose()
        (Path(parent) / run_id).mkdir(parents=True, exist_ok=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        attempt = next_attempt(Path(parent) / run_id)  # the ranks that join learn which attempt they are
        published = {"run_id": run_id, "key": key, "attempt": attempt, "written_at": time.time(), "host": socket.gethostname()}
        write_json_atomic(path, published)
        return run_id
    if not_before is None:
        not_before = psutil.Process().create_time() - CLOCK_SLACK_SECS
    deadline = time.monotonic() + timeout
    while True:
        found = read_json(path)
        if found and isinstance(found.get("run_id"), str) and float(found.get("written_at") or 0) >= not_before:
            run_id = found["run_id"]
            if (Path(parent) / run_id).is_dir():
                return run_id
        if time.monotonic() >= deadline:
            raise RendezvousTimeout(
                f"rank {rank} waited {timeout:.0f} s for rank 0 to publish the run id in {path}; is the callback on "
                f"rank 0 too? Set {RUN_ID_ENV} before launching (same value on every rank) to skip this"
            )
        time.sleep(poll_secs)
