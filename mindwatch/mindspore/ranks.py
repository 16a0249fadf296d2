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

An environment that cannot be true (``RANK_ID=5`` with ``MS_WORKER_NUM=2``, a negative rank, ``RANK_ID=abc``) raises
:class:`RankError` at start, naming what it read: two processes must never both act as rank 0.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

log = logging.getLogger("mindwatch")


#: Where a rank is read from, first set wins.
RANK_VARIABLES = ("RANK_ID", "RANK", "MS_NODE_ID")
#: Where the world size is read from, first set wins.
SIZE_VARIABLES = ("MS_WORKER_NUM", "RANK_SIZE", "WORLD_SIZE")


class NotATrainingRank(RuntimeError):
    """This process is the launcher's scheduler (``MS_ROLE=MS_SCHED``), not a rank of the training: it records nothing."""


class RankError(ValueError):
    """The launcher's environment says something about this process's rank that cannot be true; the message says what."""


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
    """This process's :class:`RankInfo` (see the module docstring for the sources, in order).

    Raises :class:`RankError` when the environment names a rank outside its world, or a rank or world size that is
    not a number: two processes must never both act as rank 0.
    """
    env = os.environ if environ is None else environ
    launcher = _launcher(env)
    role = env.get("MS_ROLE", "MS_WORKER") or "MS_WORKER"
    host, port = env.get("MS_SCHED_HOST"), env.get("MS_SCHED_PORT")
    scheduler = f"{host}:{port}" if host and port else None
    if use_communication:
        comm = _from_communication()
        if comm is not None:
            return RankInfo(comm[0], comm[1], launcher, role, scheduler)
    # the scheduler's MS_NODE_ID names no worker; a worker's is a rank only when it is a number (a name is allowed)
    rank_keys = RANK_VARIABLES if role == "MS_WORKER" else ("RANK_ID", "RANK")
    rank_key, rank = _first_number(env, rank_keys, strict=("RANK_ID", "RANK"))
    size_key, size = _first_number(env, SIZE_VARIABLES, strict=SIZE_VARIABLES)
    if size is not None and size < 1:
        raise RankError(f"{size_key}={size} is not a number of processes {_read(env)}: set it to how many the launch starts")
    if rank is not None and size is None and rank != 0:
        raise RankError(
            f"{rank_key}={rank} names a rank, but none of {', '.join(SIZE_VARIABLES)} says how many processes train "
            f"{_read(env)}: set one of them to the number of processes the launch starts, or unset {rank_key} for a "
            "training of one process"
        )
    world = size or 1
    if rank is not None and not 0 <= rank < world:
        raise RankError(
            f"{rank_key}={rank} is not a rank of {size_key}={size} {_read(env)}: set {rank_key} to a number from 0 "
            f"to {world - 1}, or {size_key} to the number of processes the launch starts"
        )
    return RankInfo(rank or 0, world, launcher, role, scheduler)


def _first_number(env: Mapping[str, str], keys: tuple[str, ...], *, strict: tuple[str, ...]) -> tuple[str | None, int | None]:
    """The first of ``keys`` set (not empty) and its value; a ``strict`` one that is not an integer raises."""
    for key in keys:
        value = env.get(key, "").strip()
        if not value:
            continue
        try:
            return key, int(value)
        except ValueError:
            if key in strict:
                told = f"{key}={env[key]!r} is not a number {_read(env)}: set {key} to an integer, or unset it"
                raise RankError(told) from None
    return None, None


def _read(env: Mapping[str, str]) -> str:
    """What discovery read, for an error: every variable, with its value or 'unset'."""
    seen = [f"{k}={env[k]}" if env.get(k) else f"{k} unset" for k in RANK_VARIABLES + SIZE_VARIABLES]
    return f"(read {', '.join(seen)})"


_told_communication_failed = False


def _from_communication() -> tuple[int, int] | None:
    """Rank and world size from MindSpore's communication layer; None when it is absent or not initialised."""
    global _told_communication_failed
    try:
        from mindspore.communication.management import GlobalComm, get_group_size, get_rank
    except ImportError:  # no MindSpore, or an old one without this layer: the environment answers
        return None
    if not GlobalComm.INITED:
        return None
    try:
        return int(get_rank()), int(get_group_size())
    except Exception as e:  # initialised yet unanswering: say so once, so a wrong rank has a cause in the log
        if not _told_communication_failed:
            _told_communication_failed = True
            log.warning(
                "mindwatch: MindSpore's communication is initialised but get_rank()/get_group_size() failed (%r); "
                "this process's rank comes from the launcher's environment instead",
                e,
            )
        return None


def _launcher(env: Mapping[str, str]) -> str:
    if env.get("MS_ROLE"):
        # msrun sets RANK_SIZE and the topology timeout for its workers; a hand-made launch rarely does both
        return "msrun" if env.get("RANK_SIZE") and env.get("MS_TOPO_TIMEOUT") else "dynamic-cluster"
    if env.get("RANK_ID") is not None or env.get("RANK") is not None:
        return "env"
    return "single"
