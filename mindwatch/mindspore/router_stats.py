"""A mixture of experts' routing, counted in the graph: a cell the router owns, as an attention layer owns ``AttentionStats``.

Example::

    from mindwatch.mindspore import RouterStats

    class MoE(nn.Cell):
        def __init__(self, d_model, num_experts=4, k=2):
            ...
            self.router_stats = RouterStats(num_experts)          # capacity_factor=1.25: also the share dropped

        def construct(self, x):
            probs = ops.softmax(self.router(x), -1)               # (tokens, num_experts)
            weights, indices = ops.topk(probs, self.k)             # (tokens, k) the chosen experts
            indices = self.router_stats(indices, probs)            # the indices back, unchanged
            ...

On the steps its flag is set (every ``moe.every`` steps; the callback or ``start_run`` sets it), the cell writes one small
vector into a Parameter of its own (:data:`SLOTS`): how many of the routed token choices went to each expert, how many
named no expert, how many were over an expert's capacity, and the router's entropy summed over the tokens. On the
other steps the branch is not taken: nothing is counted. In data parallel our train cells (and
``DistributedGradReducer``) sum every layer's vector over the ranks in the step's own signal ``AllReduce``
(:mod:`mindwatch.mindspore.rank_signal`), so each rank records the whole batch's routing.
:class:`~mindwatch.mindspore.routing_watch.RoutingWatch` turns the vectors into ``expert_load/<layer>/<e>``,
``moe_imbalance/<layer>``, ``router_entropy/<layer>`` and ``moe_dropped/<layer>``, ``<layer>`` being the cell that
holds the ``RouterStats`` (``blocks.0.moe``).
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from mindwatch.mindspore.measured_cells import owned_cells

#: After a layer's ``num_experts`` counts, its vector holds: the choices that named no expert (an index out of
#: ``[0, num_experts)``), the choices over an expert's capacity, the router's entropy summed over its rows (nats), and
#: the rows of probabilities it was summed over.
INVALID, OVER_CAPACITY, ENTROPY_SUM, PROB_ROWS = range(4)
#: The slots after the counts.
SLOTS = 4
_INT_TYPES = (ms.int8, ms.int16, ms.int32, ms.int64, ms.uint8, ms.uint16, ms.uint32, ms.uint64)


class RouterStats(nn.Cell):
    """Identity on a router's chosen expert indices; on measured steps it counts them (see the module docstring).

    ``indices``: the experts each token chose, integers of any shape (``(tokens, k)``, ``(batch, seq, k)``); every
    element is one routed choice. ``probs`` (optional): the router's probabilities, last axis ``num_experts``.
    ``capacity_factor``: an expert takes at most ``capacity_factor x choices / num_experts`` of a step's choices;
    those beyond it are counted as dropped (``moe_dropped/<layer>``).
    """

    def __init__(self, num_experts: int, capacity_factor: float | None = None) -> None:
        super().__init__()
        if int(num_experts) < 2:
            raise ValueError(f"RouterStats: num_experts must be at least 2, got {num_experts}")
        if capacity_factor is not None and capacity_factor <= 0:
            raise ValueError(f"RouterStats: capacity_factor must be > 0, got {capacity_factor}")
        self.num_experts = int(num_experts)
        self.capacity_factor = float(capacity_factor) if capacity_factor is not None else 0.0
        #: The layer this cell counts for, as its errors name it (the recorder sets the owner's name before compiling).
        self.layer = "RouterStats"
        #: 1 on the steps that are measured; set between steps by the recorder.
        self.on = ms.Parameter(ms.Tensor(0, ms.int32), requires_grad=False)
        #: The counts of the last measured step (:data:`SLOTS` after them).
        self.values = ms.Parameter(ms.Tensor(np.zeros(self.num_experts + SLOTS, np.float32)), requires_grad=False)

    def construct(self, indices, probs=None):
        if indices.dtype not in _INT_TYPES:
            raise TypeError(
                "mindwatch: " + self.layer + ": RouterStats takes the chosen experts' integer indices first "
                "(router_stats(indices, probs)), got a tensor of another dtype"
            )
        if probs is not None and probs.shape[-1] != self.num_experts:
            raise ValueError(
                "mindwatch: "
                + self.layer
                + ": the router's probabilities must have num_experts ("
                + str(self.num_experts)
                + ") on their last axis; got shape "
                + str(probs.shape)
            )
        if self.on > 0:
            experts = self.num_experts
            chosen = ops.reshape(ops.stop_gradient(indices), (-1,))
            valid = ops.logical_and(chosen >= 0, chosen < experts)
            safe = ops.cast(ops.select(valid, chosen, ops.zeros_like(chosen)), ms.int32)
            hits = ops.one_hot(safe, experts, ms.Tensor(1.0, ms.float32), ms.Tensor(0.0, ms.float32))
            counts = (hits * ops.cast(valid, ms.float32).reshape(-1, 1)).sum(axis=0)
            choices = ops.cast(ops.size(chosen), ms.float32)
            invalid = choices - counts.sum()
            over = ops.zeros((), ms.float32)
            if self.capacity_factor > 0:
                over = ops.relu(counts - self.capacity_factor * choices / experts).sum()
            entropy, rows = ops.zeros((), ms.float32), ops.zeros((), ms.float32)
            if probs is not None:
                p = ops.reshape(ops.cast(ops.stop_gradient(probs), ms.float32), (-1, experts))
                entropy = -(p * ops.log(ops.clamp(p, 1e-12, None))).sum()
                rows = ops.cast(ops.shape(p)[0], ms.float32)
            vector = ops.concat((counts, ops.stack([invalid, over, entropy, rows])))
            indices = ops.depend(indices, ops.assign(self.values, vector))
        return indices


def router_stats_cells(network: nn.Cell) -> list[tuple[str, RouterStats]]:
    """Every :class:`RouterStats` under ``network``, with the name of the MoE layer that holds it (``blocks.0.moe``)."""
    return owned_cells(network, RouterStats)
