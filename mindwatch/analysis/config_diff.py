"""Run configs side by side: each config flattened to dotted keys, and which keys differ between the runs.

Example::

    from mindwatch.analysis.config_diff import config_diff, flatten
    flatten({"optimizer": {"lr": 1e-3}})                  # {"optimizer.lr": 0.001}
    rows = config_diff([run_a.meta["config"], run_b.meta["config"]])
    [(r.key, r.values) for r in rows if r.differs]       # [("interval", [5, 50])]

The runs page's config columns (:mod:`mindwatch.checks.listing`) and the compare page
(``/api/compare/runs``) read configs through :func:`flatten`, so a key has one name everywhere.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: What a run without a key shows for it (a config may hold ``null`` itself).
MISSING = object()


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"optimizer": {"lr": 1e-3}}`` -> ``{"optimizer.lr": 1e-3}``; lists stay whole (as JSON text)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, path + "."))
        elif isinstance(value, (list, tuple)):
            out[path] = json.dumps(value, default=str)
        else:
            out[path] = value
    return out


@dataclass(frozen=True)
class ConfigKey:
    """One dotted key across the runs: its value in each run (:data:`MISSING` where a run has none)."""

    key: str
    values: tuple[Any, ...]

    @property
    def differs(self) -> bool:
        """Whether some run's value (or its absence) is not the first run's."""
        first = self.values[0]
        return any(v is not first and v != first for v in self.values[1:])


def config_diff(configs: Sequence[Mapping[str, Any]]) -> list[ConfigKey]:
    """Every key any of ``configs`` has, sorted, with each config's value; ``differs`` tells which keys tell them apart."""
    flat = [flatten(c) for c in configs]
    keys = sorted(set().union(*flat)) if flat else []
    return [ConfigKey(k, tuple(f.get(k, MISSING) for f in flat)) for k in keys]
