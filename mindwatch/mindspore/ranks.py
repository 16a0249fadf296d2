"""Which rank this process is, under ``msrun``, a manual dynamic-cluster launch, or alone.

Example::

    from mindwatch.mindspore.ranks import discover

    who = discover()
    who.rank, who.world_size      # (1, 2) in the second of two msrun workers, (0, 1) alone
    who.launcher                  # 'msrun' | 'dynamic-cluster' | 'env' | 'single'
    who.launch_key                # '127.0.0.1_8118': the same in every rank of one launch (None alone)

Sources, first that answers wins:

1. MindSpore's communication layer once ``mindspore.communication.init()`` ran (``get_rank()``,
   ``get_group_size()``): right under every launcher, including a multi-node ``msrun`` without
   ``--node_rank`` where ranks are assigned only when the cluster is built;
2. the launcher's environment: ``msrun`` exports ``RANK_ID``, ``RANK_SIZE``, ``MS_WORKER_NUM``,
   ``MS_ROLE``, ``MS_NODE_ID``, ``MS_SCHED_HOST``, ``MS_SCHED_PORT``; a manual dynamic-cluster
   launch sets the ``MS_*`` ones itself; ``RANK``/``WORLD_SIZE`` are read too;
3. otherwise rank 0 of 1.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class RankInfo:
    """Where this process sits in a (possibly distributed) training."""

    rank: int = 0
    world_size: int = 1
    #: ``msrun``, ``dynamic-cluster`` (``MS_ROLE`` set by hand), ``env`` (``RANK_ID``/``RANK`` only) or ``single``.
    launcher: str = "single"
    #: ``MS_WORKER`` for training processes; ``MS_SCHED`` is the scheduler, which does not train.
    role: str = "MS_WORKER"
    #: The scheduler's ``host:port`` when the launcher set one.
    scheduler: str | None = None

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def launch_key(self) -> str | None:
        """A name every rank of one launch derives alike (the scheduler address and world size), or None.

        Two launches cannot run at once with the same key: the scheduler's port is bound while it runs.
        """
        if not self.distributed:
            return None
        base = self.scheduler or f"{self.launcher}"
        return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{base}_w{self.world_size}")

    def as_meta(self) -> dict[str, object]:
        """What ``meta.json`` records about the launch."""
        return {"world_size": self.world_size, "launcher": self.launcher, "scheduler": self.scheduler}


def discover(environ: Mapping[str, str] | None = None, *, use_communication: bool = True) -> RankInfo:
    """This process's :class:`RankInfo` (see the module docstring for the sources, in order)."""
    env = os.environ if environ is None else environ
    launcher = _launcher(env)
    role = env.get("MS_ROLE", "MS_WORKER") or "MS_WORKER"
    host, port = env.get("MS_SCHED_HOST"), env.get("MS_SCHED_PORT")
    scheduler = f"{host}:{port}" if host and port else None
    if use_communication:
        comm = _from_communication()
        if comm is not None:
            return RankInfo(comm[0], comm[1], launcher, role, scheduler)
    rank = _int(env.get("RANK_ID")) if env.get("RANK_ID") is not None else None
    if rank is None:
        rank = _int(env.get("RANK"))
    if rank is None and role == "MS_WORKER":
        rank = _int(env.get("MS_NODE_ID"))
    size = _int(env.get("MS_WORKER_NUM")) or _int(env.get("RANK_SIZE")) or _int(env.get("WORLD_SIZE")) or 1
    rank = rank if rank is not None and 0 <= rank < size else 0
    return RankInfo(rank, size, launcher, role, scheduler)


def _from_communication() -> tuple[int, int] | None:
    try:
        from mindspore.communication.management import GlobalComm, get_group_size, get_rank

        if GlobalComm.INITED:
            return int(get_rank()), int(get_group_size())
    except Exception:  # not initialised, no MindSpore, or an old one
        pass
    return None


def _launcher(env: Mapping[str, str]) -> str:
    if env.get("MS_ROLE"):
        # msrun sets RANK_SIZE and the topology timeout for its workers; a hand-made launch rarely does both
        return "msrun" if env.get("RANK_SIZE") and env.get("MS_TOPO_TIMEOUT") else "dynamic-cluster"
    if env.get("RANK_ID") is not None or env.get("RANK") is not None:
        return "env"
    return "single"


def _int(v: str | None) -> int | None:
    try:
        return int(v) if v is not None and v != "" else None
    except ValueError:
        return None
