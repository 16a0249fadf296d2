"""The stable rank of every weight matrix: ||W||_F^2 / sigma_max(W)^2, every ``layers.stable_rank_every`` steps.

Example::

    ranks = StableRanks(trained_weights(opt, net), every=100)
    ranks.due(200)                  # True: step 200 is measured (and recorded)
    ranks.attach(rec, 200)          # after step 200's update: the weights copied, the work handed to the worker
    # the worker, before any sink sees the record: rec["stable_rank/blocks.0.attn.qkv.weight"] = 41.7, ...

A matrix whose stable rank falls has stopped using its width: a few directions carry its norm. Every 2-D weight
Parameter is measured as ``stable_rank/<parameter>`` (its full name), and each expert's matrix of a 3-D expert weight
as ``stable_rank/<parameter>/<e>``.

Where it runs: the **training thread** copies the weights to host memory at the end of the measured step (after its
update; one ``asnumpy`` per weight, the size of the weights once per ``every`` steps); the **worker thread** does the
arithmetic before it writes the step's record (``Monitor``'s deferred work, :data:`~mindwatch.monitor.worker.DEFERRED`):
||W||_F^2 exactly, sigma_max by power iteration on W^T W (or W W^T, the smaller side), warm-started from the previous
measurement's vector, so a few iterations follow the slowly moving top direction (up to :data:`FIRST_ITERATIONS` the
first time, :data:`ITERATIONS` after, until the estimate moves less than :data:`TOLERANCE`). The measured step's record
holds the values: no step out of order, nothing per unmeasured step.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from mindwatch import metrics as vocab
from mindwatch.monitor.worker import DEFERRED

#: Power iterations at a weight's first measurement, and at the later ones (warm-started), at most.
FIRST_ITERATIONS, ITERATIONS = 200, 30
#: An estimate of sigma_max^2 that moves by less than this (relative) has converged.
TOLERANCE = 1e-5


class StableRanks:
    """The stable ranks of ``weights``' matrices every ``every`` steps (see the module docstring)."""

    def __init__(self, weights: Sequence[Any], every: int) -> None:
        self.every = every
        #: The measured Parameters: 2-D weights, and 3-D expert weights (one matrix per expert).
        self.params = [p for p in weights if len(p.shape) in (2, 3) and min(p.shape[-2:]) > 1]
        #: Each matrix's last top right-singular vector (the worker's: read and written there alone).
        self._vectors: dict[str, np.ndarray] = {}

    def __bool__(self) -> bool:
        return bool(self.params)

    def due(self, step: int) -> bool:
        return step % self.every == 0

    def attach(self, rec: dict[str, Any], step: int) -> None:
        """At the end of measured step ``step`` (training thread): copy the weights, and leave the arithmetic to the
        worker (``rec[DEFERRED]``), which adds ``stable_rank/<parameter>`` to ``rec`` before any sink sees it."""
        copies = [(p.name, np.array(p.asnumpy(), dtype=np.float32, copy=True)) for p in self.params]
        rec[DEFERRED] = lambda: self.measure(copies)

    def measure(self, copies: list[tuple[str, np.ndarray]]) -> dict[str, float]:
        """``{stable_rank/<name>[/<e>]: value}`` of the copied matrices (worker thread)."""
        out: dict[str, float] = {}
        for name, w in copies:
            if w.ndim == 2:
                out[f"{vocab.STABLE_RANK}/{name}"] = self.stable_rank(name, w)
            else:
                for e in range(w.shape[0]):
                    out[f"{vocab.STABLE_RANK}/{name}/{e}"] = self.stable_rank(f"{name}/{e}", w[e])
        return out

    def stable_rank(self, key: str, w: np.ndarray) -> float:
        """||w||_F^2 / sigma_max(w)^2, sigma_max by power iteration warm-started from ``key``'s last vector."""
        frobenius = float(np.einsum("ij,ij->", w, w, dtype=np.float64))
        if not math.isfinite(frobenius):
            return math.nan
        if frobenius == 0.0:
            return 0.0
        gram_side = w if w.shape[0] >= w.shape[1] else w.T  # iterate in the smaller dimension
        v = self._vectors.get(key)
        first = v is None or v.shape[0] != gram_side.shape[1]
        if first:
            v = np.random.default_rng(zlib.crc32(key.encode())).standard_normal(gram_side.shape[1]).astype(np.float32)
            v /= np.linalg.norm(v)
        assert v is not None
        top = 0.0
        for _ in range(FIRST_ITERATIONS if first else ITERATIONS):
            u = gram_side @ v
            estimate = float(np.dot(u, u))  # ||W v||^2 with ||v|| = 1: sigma_max^2 from below
            v = gram_side.T @ u
            norm = float(np.linalg.norm(v))
            if norm == 0.0 or not math.isfinite(norm):
                break
            v /= norm
            converged = abs(estimate - top) <= TOLERANCE * estimate
            top = estimate
            if converged:
                break
        self._vectors[key] = v
        return frobenius / top if top > 0 else math.nan
