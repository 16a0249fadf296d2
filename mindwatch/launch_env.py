"""What the launcher tells a training process in its environment: its rank on its machine (the bottom floor).

Example::

    from mindwatch.launch_env import local_rank

    local_rank()                                                          # 0 alone
    local_rank({"MS_ROLE": "MS_WORKER", "RANK_ID": "13", "DEVICE_ID": "5"})   # 5: msrun's sixth worker on its node

Imports nothing of mindwatch, so a sink (Prometheus serves on ``port + local rank``) and the MindSpore adapter
(:mod:`mindwatch.mindspore.ranks`, the global rank and world size) may both read it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping


def local_rank(env: Mapping[str, str] | None = None) -> int:
    """This process's rank on its machine: ``LOCAL_RANK`` if set; under ``msrun``, ``DEVICE_ID`` (msrun sets it to the
    local rank of each worker it starts; outside msrun a ``DEVICE_ID`` picks a device, not a rank); else 0."""
    env = os.environ if env is None else env
    for key in ("LOCAL_RANK", "DEVICE_ID" if env.get("MS_ROLE") == "MS_WORKER" else ""):
        value = env.get(key) if key else None
        if value is not None and value.strip().isdigit():
            return int(value)
    return 0
