"""The per-layer heat map: one metric per layer, averaged per step bucket (dashboard and report alike).

Example::

    import numpy as np
    from mindwatch.analysis.heatmap import bin_layers
    steps = np.arange(1, 101)
    grid = bin_layers([(steps, np.full(100, 1.0)), (steps, np.full(100, 2.0))], buckets=4)
    grid.steps    # [14, 38, 64, 88]: the centre step of each bucket (rounded)
    grid.values   # [[0, 0, 1.0], [1, 0, 1.0], ..., [3, 1, 2.0]]: [bucket, layer, mean]

Pure numpy, no I/O: callers read the columns (the dashboard's column cache, the report's run).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Step buckets of every heat map (the dashboard's and the report's): each one the mean of its steps.
HEATMAP_BUCKETS = 300


@dataclass(frozen=True)
class LayerGrid:
    """Buckets along the steps, one row per layer; cells of empty buckets are left out."""

    steps: list[int]
    values: list[list[Any]]


def bin_layers(columns: Sequence[tuple[np.ndarray, np.ndarray]], buckets: int) -> LayerGrid:
    """Mean of each layer's finite values per step bucket; ``columns`` holds ``(steps, values)`` per layer.

    There are at most ``buckets`` buckets and never more than distinct steps, so a metric
    recorded every k steps fills every bucket instead of leaving k - 1 of each k empty.
    """
    if buckets < 1:
        raise ValueError(f"buckets must be at least 1, got {buckets}")
    present = [np.asarray(s) for s, _ in columns if len(s)]
    if not present:
        return LayerGrid([], [])
    all_steps = np.concatenate(present)
    first, last = int(all_steps.min()), int(all_steps.max())
    n = max(1, min(buckets, len(np.unique(all_steps))))
    edges = np.linspace(first, last + 1, n + 1)
    values: list[list[Any]] = []
    for layer, (s, v) in enumerate(columns):
        v = np.asarray(v, dtype=np.float64)
        ok = np.isfinite(v)
        b = np.clip(np.searchsorted(edges, np.asarray(s)[ok], side="right") - 1, 0, n - 1)
        sums = np.bincount(b, weights=v[ok], minlength=n)
        counts = np.bincount(b, minlength=n)
        for j in np.flatnonzero(counts):
            values.append([int(j), layer, round(float(sums[j] / counts[j]), 6)])
    centers = ((edges[:-1] + edges[1:]) / 2).round().astype(int).tolist()
    return LayerGrid(centers, values)


def layer_order(name: str) -> list[Any]:
    """Sort key that puts ``layer2`` before ``layer10`` (digits compared as numbers)."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]
