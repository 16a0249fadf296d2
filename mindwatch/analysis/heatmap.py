"""The per-layer heat map: one metric per layer, averaged per step bucket (dashboard and report alike).

Example::

    import numpy as np
    from mindwatch.analysis.heatmap import bin_layers
    steps = np.arange(1, 101)
    grid = bin_layers([(steps, np.full(100, 1.0)), (steps, np.full(100, 2.0))], buckets=4)
    grid.steps    # [13, 38, 63, 88]: the middle of each bucket's first and last step (rounded)
    grid.values   # [[0, 0, 1.0], [1, 0, 1.0], ..., [3, 1, 2.0]]: [bucket, layer, mean]

Pure numpy, no I/O: callers read the columns (the dashboard's column cache, the report's run).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mindwatch.store.columns import RankColumns

#: Step buckets of every heat map (the dashboard's and the report's): each one the mean of its steps.
HEATMAP_BUCKETS = 300


@dataclass(frozen=True)
class LayerGrid:
    """Buckets along the steps, one row per layer; cells of empty buckets are left out."""

    steps: list[int]
    values: list[list[Any]]


def bin_layers(columns: Sequence[tuple[np.ndarray, np.ndarray]], buckets: int) -> LayerGrid:
    """Mean of each layer's finite values per step bucket; ``columns`` holds ``(steps, values)`` per layer.

    The buckets split the distinct measured steps into at most ``buckets`` runs of equal count, so no column is
    empty: with fewer measured steps than buckets each column is one measured step (the layers are measured at the
    first step and then every k, and step-wide buckets would leave one of them between steps 1 and k empty).
    A bucket's label is the middle of its first and last step.
    """
    if buckets < 1:
        raise ValueError(f"buckets must be at least 1, got {buckets}")
    present = [np.asarray(s) for s, _ in columns if len(s)]
    if not present:
        return LayerGrid([], [])
    distinct = np.unique(np.concatenate(present))
    n = max(1, min(buckets, len(distinct)))
    bucket_of = np.arange(len(distinct)) * n // len(distinct)  # the bucket of each distinct step, in order
    values: list[list[Any]] = []
    for layer, (s, v) in enumerate(columns):
        v = np.asarray(v, dtype=np.float64)
        ok = np.isfinite(v)
        b = bucket_of[np.searchsorted(distinct, np.asarray(s)[ok])]
        sums = np.bincount(b, weights=v[ok], minlength=n)
        counts = np.bincount(b, minlength=n)
        for j in np.flatnonzero(counts):
            values.append([int(j), layer, round(float(sums[j] / counts[j]), 6)])
    starts = np.searchsorted(bucket_of, np.arange(n))
    ends = np.append(starts[1:], len(distinct)) - 1
    centers = np.floor((distinct[starts] + distinct[ends]) / 2 + 0.5).astype(int).tolist()
    return LayerGrid(centers, values)


def layer_order(name: str) -> list[Any]:
    """Sort key that puts ``layer2`` before ``layer10`` (digits compared as numbers)."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def family_grid(cols: RankColumns | None, prefix: str, known: Sequence[str], buckets: int) -> tuple[list[str], LayerGrid | None]:
    """The members of a per-layer family (``prefix``: ``grad_norm/``) in model order, and their grid (:func:`bin_layers`)
    from one rank's columns; ``known``: the run's metric names, for a rank whose layer files hold none of them. ``([],
    None)`` when the rank has no member."""
    in_model_order = [m for m in cols.layer_metrics if m.startswith(prefix)] if cols is not None else []
    names = in_model_order or sorted((m for m in known if m.startswith(prefix)), key=layer_order)
    if cols is None or not names:
        return [], None
    data = []
    for name in names:
        line, value = cols.column(name)
        data.append((cols.steps[line], value))
    return names, bin_layers(data, buckets)
