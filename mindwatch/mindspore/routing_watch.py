"""Which steps count the routing, and the counts into the step's record as shares (training thread).

Example::

    watch = RoutingWatch(router_stats_cells(network), every=10)
    watch.plan(step)                # before the step: sets the RouterStats flags for it
    watch.add(rec, watch.read())    # after it: expert_load/<layer>/<e>, moe_imbalance/<layer>, ...

:meth:`read` takes every layer's vector in one read: the cells' own (one rank's routing), or in data parallel the
vectors the step summed over the ranks (``summed``: our train cell's or ``DistributedGradReducer``'s
``mindwatch_routing_sum``), so every rank records the whole batch's routing. From a layer's counts: each expert's
share of the choices that named an expert (``expert_load/<layer>/<e>``, summing to 1), the largest share x the
experts (``moe_imbalance/<layer>``), the router's mean entropy when it was given its probabilities
(``router_entropy/<layer>``), and with a ``capacity_factor`` (or choices naming no expert) the share dropped
(``moe_dropped/<layer>``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from mindwatch import metrics as vocab
from mindwatch.mindspore.measured_cells import MeasuredCells
from mindwatch.mindspore.reduction import StepReduction
from mindwatch.mindspore.router_stats import ENTROPY_SUM, INVALID, OVER_CAPACITY, PROB_ROWS, SLOTS, RouterStats

log = logging.getLogger("mindwatch")

#: Up to this many MoE layers are read one by one (~10 us each on CPU); more, in one compiled call (~0.5 ms).
_READ_APART = 4


class RoutingWatch(MeasuredCells):
    """The measured steps (every ``moe.every``) of the model's :class:`RouterStats` cells."""

    def __init__(self, cells: Sequence[tuple[str, RouterStats]], *, every: int, summed: Any = None) -> None:
        """``summed``: a Parameter the step writes every layer's vector into, summed over the ranks; None: the cells'."""
        super().__init__(cells, every=every)
        for name, cell in cells:
            cell.layer = name  # what its errors name (read when the graph compiles, at the first step)
        self.summed = summed
        #: Each layer's experts and where its vector starts in what :meth:`read` returns.
        self._experts = [cell.num_experts for cell in self.cells]
        self._starts = np.cumsum([0] + [e + SLOTS for e in self._experts])
        self._capacity = [cell.capacity_factor > 0 for cell in self.cells]
        self._warned: set[str] = set()

    def read(self) -> np.ndarray:
        """Every layer's vector of the step just run, end to end (one read)."""
        if self.summed is not None:
            return np.asarray(self.summed.asnumpy(), np.float64)
        values = self.values()
        if len(values) <= _READ_APART:  # a few small vectors: one host read each costs less than a compiled call
            return np.concatenate([v.asnumpy() for v in values]).astype(np.float64)
        return StepReduction.concat(values).astype(np.float64)

    def add(self, rec: dict[str, Any], values: np.ndarray) -> None:
        """``values``: what :meth:`read` returned after a measured step."""
        for j, layer in enumerate(self.layers):
            experts = self._experts[j]
            vector = values[self._starts[j] : self._starts[j + 1]]
            counts, extra = vector[:experts], vector[experts:]
            routed = float(counts.sum())
            choices = routed + extra[INVALID]
            if routed > 0:
                shares = counts / routed
                for e, share in enumerate(shares):
                    rec[f"{vocab.EXPERT_LOAD}/{layer}/{e}"] = float(share)
                rec[f"{vocab.MOE_IMBALANCE}/{layer}"] = float(shares.max() * experts)
            if extra[PROB_ROWS] > 0:
                rec[f"{vocab.ROUTER_ENTROPY}/{layer}"] = float(extra[ENTROPY_SUM] / extra[PROB_ROWS])
            if extra[INVALID] > 0 and layer not in self._warned:
                self._warned.add(layer)
                log.warning(
                    "mindwatch: %s: %d of %d routed choices at step %s named no expert (an index outside [0, %d)): "
                    "counted as dropped (moe_dropped/%s)",
                    layer,
                    int(extra[INVALID]),
                    int(choices),
                    rec.get("step"),
                    experts,
                    layer,
                )
            if choices > 0 and (self._capacity[j] or layer in self._warned):
                rec[f"{vocab.MOE_DROPPED}/{layer}"] = float((extra[OVER_CAPACITY] + extra[INVALID]) / choices)
