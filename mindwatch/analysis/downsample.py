"""Thin a series to a point budget without hiding spikes: the min and the max of every bucket are kept.

Example::

    from mindwatch.analysis.downsample import keep_extremes
    idx = keep_extremes(step, loss, budget=2000)   # sorted indices into step/loss
    step[idx], loss[idx]

Non-finite values (a loss that went NaN or Inf) are always kept: they are the points a person
most needs to see. Averaging or random sampling, as peers do, would hide a single-step spike.
"""

from __future__ import annotations

import numpy as np
from tsdownsample import MinMaxDownsampler

#: At most this many non-finite points are kept on top of the budget.
MAX_NON_FINITE = 1000


def keep_extremes(x: np.ndarray, y: np.ndarray, budget: int) -> np.ndarray:
    """Sorted indices of at most ``budget`` points (+ non-finite ones) keeping each bucket's min and max."""
    n = len(y)
    if n <= budget:
        return np.arange(n)
    finite = np.isfinite(y)
    bad = np.flatnonzero(~finite)[:MAX_NON_FINITE]
    good = np.flatnonzero(finite) if len(bad) else None
    yy = y if good is None else y[good]
    xx = x if good is None else x[good]
    budget = max(4, budget - budget % 2)  # min/max pairs
    if len(yy) <= budget:
        picked = np.arange(len(yy))
    elif len(xx) > 1 and np.all(xx[1:] >= xx[:-1]):
        picked = MinMaxDownsampler().downsample(np.ascontiguousarray(xx), np.ascontiguousarray(yy), n_out=budget)
    else:  # x not sorted (a resumed run wrote steps again): buckets by position
        picked = MinMaxDownsampler().downsample(np.ascontiguousarray(yy), n_out=budget)
    picked = np.asarray(picked, dtype=np.int64)
    if good is not None:
        picked = good[picked]
    return np.union1d(picked, bad) if len(bad) else np.sort(picked)
