"""Which rank this process is, under ``msrun``, a manual dynamic-cluster launch, or alone."""

from __future__ import annotations

import os


def discover_rank() -> tuple[int, int]:
    """``(rank, world_size)``: from MindSpore's communication layer when it is initialised,
    else from the launcher's environment (``RANK_ID``/``MS_NODE_ID``, ``MS_WORKER_NUM``/``RANK_SIZE``), else ``(0, 1)``."""
    try:
        from mindspore.communication.management import GlobalComm, get_group_size, get_rank

        if GlobalComm.INITED:
            return int(get_rank()), int(get_group_size())
    except Exception:  # not initialised, or an old MindSpore
        pass
    env = os.environ
    rank = env.get("RANK_ID") or env.get("RANK") or (env.get("MS_NODE_ID") if env.get("MS_ROLE") == "MS_WORKER" else None)
    size = env.get("MS_WORKER_NUM") or env.get("RANK_SIZE") or env.get("WORLD_SIZE")
    try:
        return (int(rank) if rank is not None else 0), (int(size) if size is not None else 1)
    except ValueError:
        return 0, 1
